"""The in-memory segment: the sorted, mutable mirror of the current write-ahead log.

Entries are published here only after their log record is durable (per the fsync
mode). Keys are kept in byte order, which is key order, so a forward scan is a
search. Tombstones are kept too: they are what the frozen segment file will carry to
cancel entries in older segments.

Every queue holds its unfrozen entries here, so their memory bounds how long a log may
grow (``memseg_bytes``): the structure is compiled (``storage/_memseg.c``), fixed-size
records in sorted leaves and the values in an arena, ~50 bytes an entry beyond its
value where Python objects took ~200. ``docs/architecture.md`` ("Compiled parts") says
how it is laid out, built and debugged.
"""

from __future__ import annotations

from dq.storage._memseg import ENTRY_MEMORY, MemSegment

__all__ = ["ENTRY_MEMORY", "MemSegment"]
