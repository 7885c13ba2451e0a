"""Where the item a key names is, and the moves that change it by key.

A key (``storage/itemmeta.py``) names one item while the queue remembers it (its
``dedup_window_ms``): ``Remembered`` holds the item's id and the deadline of its pending
entry now (every record that moves the item says so again, ``storage/item_notes.py``),
so finding it is one look-up of that entry — no search by id. ``KeyState`` is what the
queue finds there (``Queue.key_state``); ``Rekey`` is a pending item given a new
deadline or value by key — a PATCH, or an enqueue with ``on_duplicate`` "replace" — which
the queue writes as a move: the item's new entry (same id) and the tombstone of the old
one, in one record with the key entry that names it there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dq.storage._leases import Lease
from dq.storage.itemmeta import Remembered

__all__ = ["KeyState", "Rekey"]


@dataclass(slots=True)
class KeyState:
    """The item a key names, as the queue holds it now: ``pending`` (waiting, its entry
    at ``pkey`` with ``stats`` and ``value``; perhaps still on its way to disk),
    ``leased`` (a consumer has it: ``lease``), or ``gone`` (released, deleted, purged,
    moved to a dead-letter queue)."""

    kind: Literal["pending", "leased", "gone"]
    pkey: bytes
    stats: bytes = b""
    value: bytes = b""
    lease: Lease | None = None


@dataclass(slots=True)
class Rekey:
    """A pending item that ``key`` names, to move to ``deadline`` with ``value``:
    ``state`` is where it is now; ``group`` the group its new entry has (None: none);
    ``index`` its place in an enqueue batch's answer (None: not an enqueue)."""

    key: str
    entry: Remembered
    state: KeyState
    deadline: int
    value: bytes
    group: str | None = None
    index: int | None = None
    #: the place in the batch of the item whose value, deadline and group it takes
    #: (``index``, or a later "replace" of the same key)
    source: int | None = None
