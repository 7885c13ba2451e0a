"""The compaction worker's wire: length-prefixed pickles over the child's stdin/stdout.

Each message is a 4-byte big-endian length and a pickle. The parent
(``storage/compactor.py``) sends ``(job_id, function_name, args, kwargs)``; the worker
(``storage/worker.py``) answers ``(job_id, ok, result_or_exception)``. Both sides import
this module, neither imports the other's.
"""

from __future__ import annotations

import pickle
import struct
from typing import IO, Any

__all__ = ["read_message", "write_message"]

_LEN = struct.Struct(">I")


def read_message(stream: IO[bytes]) -> Any | None:
    head = stream.read(_LEN.size)
    if len(head) < _LEN.size:
        return None
    (n,) = _LEN.unpack(head)
    body = stream.read(n)
    if len(body) < n:
        return None
    return pickle.loads(body)


def write_message(stream: IO[bytes], message: Any) -> None:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LEN.pack(len(body)) + body)
    stream.flush()
