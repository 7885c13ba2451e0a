#!/usr/bin/env python3
"""Entrypoint of the Spark job image: wait until ``dq`` answers ``/healthz``, then exec the job.

Why: compose's ``depends_on: condition: service_healthy`` is not honoured by every engine
(podman-compose ignores it before podman 4.6), and a Spark job that starts before the
server would fail its first read. The wait is bounded (``DQ_WAIT_S``, default 120 s); on
timeout the script exits 1 without starting the job. ``exec`` keeps the job as PID 1 so it
receives SIGTERM directly.

Usage: ``wait-for-dq CMD [ARG...]`` with ``DQ_URL`` (default ``http://dq:8080``).
"""

from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.request


def wait_healthy(url: str, timeout_s: float) -> bool:
    """Poll ``url + /healthz`` every half second until it answers 2xx or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/healthz", timeout=2):
                return True
        except (OSError, urllib.error.URLError):
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)


def main(argv: list[str]) -> int:
    url = os.environ.get("DQ_URL", "http://dq:8080")
    timeout_s = float(os.environ.get("DQ_WAIT_S", "120"))
    if not argv:
        print("usage: wait-for-dq CMD [ARG...]", file=sys.stderr)
        return 2
    if not wait_healthy(url, timeout_s):
        print(f"wait-for-dq: {url}/healthz not healthy after {timeout_s:.0f} s", file=sys.stderr)
        return 1
    print(f"wait-for-dq: {url} is healthy; starting {argv[0]}", file=sys.stderr, flush=True)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
