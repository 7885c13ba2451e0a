"""Build the one C extension, ``dq.shm._atomics`` (project metadata lives in pyproject.toml).

Why C: CPython has no compare-and-swap, ordered loads/stores or futex on shared memory;
see docs/shm.md ("Atomics and waking").
"""

from __future__ import annotations

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "dq.shm._atomics",
            sources=["shm/_atomics.c"],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        )
    ]
)
