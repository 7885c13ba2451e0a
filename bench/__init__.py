"""Benchmarks: run as scripts (``python -m bench.engine``); never part of ``make test``."""
