# Two commands on a fresh machine: `make run` (server) and `make test` (everything).
# While changing code, `make check`: lint, types and the fast tier of the tests.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run spark lock test check lint typecheck typecheck-tree unit sanitize bench docker-smoke docker-smoke-replicated clean

# Each set-up installs exactly the versions of its lock file (requirements/*.txt, made by
# `make lock`), hash-checked, then the project itself without touching them. `make run`
# needs only what serving needs; `make test` adds the test tools and the Spark extra.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.serve: requirements/serve.txt pyproject.toml $(wildcard setup.py) $(wildcard shm/*.c) $(wildcard storage/*.c) $(wildcard server/*.c) | $(BIN)/python
	@echo "Installing dq and what serving needs into $(VENV) (pip, quietly; ~15 s the first time) ..."
	$(BIN)/python -m pip install -qq --disable-pip-version-check --require-hashes -r requirements/serve.txt
	$(BIN)/python -m pip install -qq --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

$(STAMP): requirements/test.txt $(VENV)/.serve
	$(BIN)/python -m pip install -qq --disable-pip-version-check --require-hashes -r requirements/test.txt
	touch $@

# The Spark extra alone (pyspark, pyarrow, pandas; docs/spark.md) on top of what serving
# needs, from its own lock: `make spark`, then `.venv/bin/python -m dq.pipeline.jobs...`.
# Spark itself also needs Java 17 or later on PATH (or JAVA_HOME).
$(VENV)/.spark: requirements/spark.txt $(VENV)/.serve
	$(BIN)/python -m pip install -qq --disable-pip-version-check --require-hashes -r requirements/spark.txt
	touch $@

spark: $(VENV)/.spark

# PORT=9000 picks the port (so does DQ_PORT; every flag has a DQ_* variable).
run: $(VENV)/.serve
	$(BIN)/dq serve $(if $(PORT),--port $(PORT))

# Re-pin after changing dependencies in pyproject.toml (needs network; uv in a throw-away
# venv so the project's venv stays as locked). Serving's and Spark's pins are taken from the
# test lock, so `make run`, `make spark` and `make test` in one venv change no version.
LOCK := /tmp/dq-lock-tools/bin/uv pip compile --no-config --python-version 3.11 \
        --python-platform x86_64-unknown-linux-gnu --generate-hashes -q
lock:
	$(PYTHON) -m venv /tmp/dq-lock-tools && /tmp/dq-lock-tools/bin/pip install -q uv==0.13.9
	$(LOCK) --extra test --extra spark -o requirements/test.txt pyproject.toml requirements/build.in
	$(LOCK) -c requirements/test.txt -o requirements/serve.txt pyproject.toml requirements/build.in
	$(LOCK) -c requirements/test.txt --extra spark -o requirements/spark.txt pyproject.toml requirements/build.in

PKG_DIRS := server storage shm client cli pipeline
PY_DIRS  := $(PKG_DIRS) bench tests

lint: $(STAMP)
	$(BIN)/ruff check $(PY_DIRS)
	$(BIN)/ruff format --check $(PY_DIRS)

# The folders install as dq.<folder> through setuptools' editable import hook, which mypy
# cannot follow; it checks a tree of symlinks with the installed names instead (dq gets an
# empty __init__.py there so mypy need not guess which folders are namespace packages).
typecheck-tree:
	mkdir -p .typecheck/dq
	for d in $(PKG_DIRS); do ln -sfn ../../$$d .typecheck/dq/$$d; done
	touch .typecheck/dq/__init__.py

typecheck: $(STAMP) typecheck-tree
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

test: lint typecheck unit sanitize

# The C extensions built again with AddressSanitizer and UBSan into build/sanitize (a copy
# of the packages, the .venv's own build untouched), and the tests that drive them run
# against that build: the engine's (tests/storage: the in-memory segment, the log, the
# delivery index, the leases), the rings' (tests/shm: the atomics, the command ring's
# session loop and its fuzzing) and the HTTP fast path's (tests/server/test_hotwire.py:
# its body reader fuzzed, its answers). Python is not built with ASan, so its runtime is
# preloaded; CPython leaks by design at exit, so leak detection is off. Any report fails the run.
# docs/architecture.md ("Compiled parts") says how to read a report.
SAN_DIR   := $(CURDIR)/build/sanitize
SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g
SAN_TESTS ?= tests/storage tests/shm tests/server/test_hotwire.py
SAN_ENV    = LD_PRELOAD=$$(gcc -print-file-name=libasan.so) PYTHONPATH=$(SAN_DIR) \
             ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
sanitize: $(STAMP)
	rm -rf $(SAN_DIR) && mkdir -p $(SAN_DIR)/dq
	tar -cf - --exclude='*.so' --exclude=__pycache__ $(PKG_DIRS) | tar -xf - -C $(SAN_DIR)/dq
	touch $(SAN_DIR)/dq/__init__.py
	CFLAGS="$(SAN_FLAGS)" LDFLAGS="-fsanitize=address,undefined" $(BIN)/python setup.py -q \
	    build_ext --build-lib $(SAN_DIR) --build-temp $(SAN_DIR)/obj
	$(SAN_ENV) $(BIN)/python -c 'import dq.storage._memseg as m, dq.storage._wal as w, \
	    dq.storage._delivery as d, dq.storage._leases as l, dq.shm._atomics as a, \
	    dq.shm._session as s, dq.server._hotwire as h; \
	    assert all(x.__file__.startswith("$(SAN_DIR)/") for x in (m, w, d, l, a, s, h))'
	$(SAN_ENV) $(BIN)/pytest -p no:cacheprovider --capture=sys -q $(SAN_TESTS)

# The fast tier: every test that starts no process and no server (a few minutes).
# Tests that do carry the `integration` marker and run in `make test` only; the guard in
# tests/conftest.py fails a test without the marker that starts one (tests/tiers.py).
check: lint typecheck
	$(BIN)/pytest -m "not integration"

docker-smoke: $(STAMP)
	bash docker/smoke.sh

docker-smoke-replicated: $(STAMP)
	bash docker/smoke-replicated.sh

clean:
	rm -rf $(VENV) build *.egg-info .typecheck
