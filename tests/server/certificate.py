"""A self-signed certificate for 127.0.0.1, made with the ``openssl`` command, for the
tests that serve HTTPS (``tests/server/test_tls.py``: ``dq serve`` itself;
``tests/replication/test_follower_tls.py``: a leader a follower reaches)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["NEEDS_OPENSSL", "self_signed"]

#: the mark of a test that makes a certificate: skipped where openssl is missing
NEEDS_OPENSSL = pytest.mark.skipif(
    shutil.which("openssl") is None, reason="needs the openssl command for a certificate"
)


def self_signed(base: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (valid for a day) and its key, in ``base``."""
    cert, key = base / "cert.pem", base / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return cert, key
