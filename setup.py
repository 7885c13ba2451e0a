"""Build the C extensions (project metadata lives in pyproject.toml).

- ``dq.shm._atomics``: CPython has no compare-and-swap, ordered loads/stores or futex on
  shared memory; see docs/shm.md ("Atomics and waking").
- ``dq.shm._session``: the server's side of a command ring (wait, decode, start, answer),
  so a ring request enters Python once, for its engine call; see docs/shm.md;
- ``dq.storage._memseg``: the in-memory segment as fixed-size records (~50 bytes an entry
  beyond its value instead of ~200 of Python objects);
- ``dq.storage._delivery``: the delivery index (slots, held keys, eligible groups, token
  buckets of the delivery rules) as C records and arrays (~197 bytes a group of Python
  objects before);
- ``dq.storage._leases``: the in-flight set (who holds which item until when under which
  receipt) as 96-byte records in one array, an id table and two heaps of record numbers
  (~454 bytes a lease of Python objects before);
- ``dq.storage._wal``: the log's record framing, and a durable round's write and
  fdatasync in one release of the GIL (called only through storage/fileio.py);
- ``dq.server._hotwire``: the HTTP fast path's bodies read into the operations'
  arguments and its answers written (server/hot_bodies.py binds it to the schemas);
see docs/architecture.md ("Compiled parts").

``make sanitize`` builds the same sources with AddressSanitizer and UBSan (``CFLAGS`` and
``LDFLAGS`` from the environment are added to these flags) into a separate tree.
"""

from __future__ import annotations

from setuptools import Extension, setup

FLAGS = ["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"]

setup(
    ext_modules=[
        Extension("dq.shm._atomics", sources=["shm/_atomics.c"], extra_compile_args=FLAGS),
        Extension("dq.shm._session", sources=["shm/_session.c"], extra_compile_args=FLAGS),
        Extension("dq.storage._memseg", sources=["storage/_memseg.c"], extra_compile_args=FLAGS),
        Extension(
            "dq.storage._delivery", sources=["storage/_delivery.c"], extra_compile_args=FLAGS
        ),
        Extension("dq.storage._leases", sources=["storage/_leases.c"], extra_compile_args=FLAGS),
        Extension("dq.storage._wal", sources=["storage/_wal.c"], extra_compile_args=FLAGS),
        Extension("dq.server._hotwire", sources=["server/_hotwire.c"], extra_compile_args=FLAGS),
    ]
)
