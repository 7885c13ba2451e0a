# Two commands on a fresh machine: `make run` (server) and `make test` (everything).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint typecheck unit bench docker-smoke clean

$(STAMP): pyproject.toml $(wildcard setup.py) $(wildcard shm/*.c)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,spark]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/dq serve

PY_DIRS := server storage shm client pipeline bench tests

lint: $(STAMP)
	$(BIN)/ruff check $(PY_DIRS)
	$(BIN)/ruff format --check $(PY_DIRS)

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

test: lint typecheck unit

docker-smoke: $(STAMP)
	bash docker/smoke.sh

clean:
	rm -rf $(VENV) build *.egg-info
