# Two commands on a fresh machine: `make run` (server) and `make test` (everything).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint typecheck typecheck-tree unit bench docker-smoke clean

$(STAMP): pyproject.toml $(wildcard setup.py) $(wildcard shm/*.c)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,spark]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/dq serve

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

test: lint typecheck unit

docker-smoke: $(STAMP)
	bash docker/smoke.sh

clean:
	rm -rf $(VENV) build *.egg-info .typecheck
