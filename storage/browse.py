"""Looking at a queue's items without leasing them: browse (pages in key order) and
finding one item by id (peek, and the operator's delete).

Browse walks its own merge of the queue's sources — each in-memory segment from a
bisect, each segment file through a fresh ``SegmentCursor`` — from the page's cursor,
one decoded block per segment at a time: a 10M-item queue is never loaded. Which
entries are live follows the queue's invariant (``storage/queue.py``): at or below the
queue's dequeue cursor an entry is live only if it is leased under that very key, or
held back by the delivery rules (the delivery index knows those and hands them to
browse in key order, merged with the walk: ``_with_held``; the tombstones of released
items there are not kept in memory); above it, an entry is live when its pendings
outnumber its tombstones. A page looks at no more than
``MAX_SCAN`` entries, so a range of cancelled entries cannot make one request long.

The browse cursor is opaque text naming the queue and the last key looked at, so it
stays valid while items come and go: the next page starts strictly after that key.

Finding an item by id has no index to use (keys sort by deadline, then id): leases
and in-memory segments are searched under the queue lock; segment files whose
``max_id`` says they can hold the id are searched *outside* it, a block at a time
with a byte search for the id's bytes, through their own file handles (a merge may
delete a file meanwhile; the open handle keeps it readable). Candidate keys are then
checked against the current sources under the lock. Its cost grows with the entries
written since the item was first enqueued (``docs/performance.md``).
"""

from __future__ import annotations

import base64
import binascii
import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dq.storage._leases import Lease
from dq.storage.codec import MAX_ID, TOMBSTONE, decode_stats, encode_key, key_deadline, key_id
from dq.storage.errors import BadCursor, CorruptionError
from dq.storage.memseg import MemSegment
from dq.storage.moved import MovedTo
from dq.storage.segment import Block, SegmentCursor, SegmentReader
from dq.storage.types import BrowsedItem, BrowsePage, ItemStats

if TYPE_CHECKING:
    from dq.storage.queue import Queue

__all__ = [
    "BROWSE_STATES",
    "MAX_SCAN",
    "Found",
    "as_item",
    "browse",
    "decode_cursor",
    "encode_cursor",
    "gone",
    "net_at",
    "resolve",
    "scan_candidates",
    "tombstone_key",
    "waiting_keys",
]

BROWSE_STATES = ("all", "due", "delayed", "leased")
#: entries a browse page looks at, at most
MAX_SCAN = 20_000
_CURSOR_VERSION = 1
_MASK64 = (1 << 64) - 1

Entry = tuple[bytes, bytes | None, bytes | None]  # key, stats, value (None: tombstone)


# ------------------------------------------------------------------ cursor


def encode_cursor(queue: str, key: bytes) -> str:
    raw = bytes((_CURSOR_VERSION,)) + key + queue.encode("ascii")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(queue: str, text: str) -> bytes:
    """The key a cursor points after; ``BadCursor`` if it is not a cursor of ``queue``."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) < 18 or raw[0] != _CURSOR_VERSION:
        raise BadCursor(
            "not a browse cursor: pass the 'next' of a previous page, or leave 'after' out",
            queue=queue,
        )
    owner = raw[17:].decode("ascii", "replace")
    if owner != queue:
        raise BadCursor(
            f"this cursor is from queue {owner!r}, not {queue!r}: "
            "browse that queue, or start this one again without 'after'",
            queue=queue,
        )
    return raw[1:17]


# ------------------------------------------------------------------ the merged walk


def _mem_entries(mem: MemSegment, after: bytes) -> Iterator[Entry]:
    entries = mem.entries
    for key in mem.keys.irange(minimum=after, inclusive=(False, True)):
        e = entries.get(key)
        if e is None:
            yield key, None, None
        else:
            yield key, e[0], e[1]


def _segment_entries(reader: SegmentReader, after: bytes) -> Iterator[Entry]:
    cur = SegmentCursor(reader, after)
    while cur.key is not None:
        key = cur.key
        if key[15] & 0b11 == TOMBSTONE:
            yield key, None, None
        else:
            _k, stats, value = cur.entry()
            yield key, stats, value
        cur.advance()


def _merged(
    q: Queue, after: bytes, readers: Iterable[SegmentReader] | None = None
) -> Iterator[Entry]:
    """Every entry of the queue's sources after ``after``, in key order (call under the lock)."""
    sources: list[Iterator[Entry]] = [_mem_entries(m, after) for m in q.files.memsegs()]
    for r in q.files.segments if readers is None else readers:
        if r.first_keys and r.info.last_key > after:
            sources.append(_segment_entries(r, after))
    return heapq.merge(*sources, key=lambda e: e[0])


def _group(key: bytes) -> bytes:
    """The pending key of (deadline, id): what a pending entry and its tombstone share."""
    return key[:15] + bytes((key[15] & 0b11111100,))


def tombstone_key(pkey: bytes) -> bytes:
    return pkey[:15] + bytes((pkey[15] | TOMBSTONE,))


def _tomb(pkey: bytes) -> bytes:
    return pkey[:15] + bytes((pkey[15] | TOMBSTONE,))


def _newest(pend: list[tuple[bytes, bytes]]) -> tuple[bytes, bytes]:
    if len(pend) == 1:
        return pend[0]
    return max(pend, key=lambda p: decode_stats(p[0])[1])


def _item(
    q: Queue,
    item_id: int,
    deadline: int,
    state: str,
    stats: ItemStats,
    value: bytes | None,
    with_values: bool,
    lease: Lease | None,
) -> BrowsedItem:
    # a leased item's group is its lease's; another's is read where its entry lives
    group = (
        lease.group if lease is not None else q.files.group_of(encode_key(deadline, item_id), None)
    )
    return BrowsedItem(
        id=item_id,
        deadline=deadline,
        state=state,  # type: ignore[arg-type]
        stats=stats,
        value_size=len(value) if value is not None else 0,
        value=value if with_values else None,
        lease_expires=lease.expires if lease is not None else None,
        dead_lettered_from=q.meta.origins.get(item_id),
        group=group,
        errors=q.item_reasons(item_id),
    )


def _leased_item(q: Queue, item_id: int, lease: Lease, with_values: bool) -> BrowsedItem:
    found = q.files.lookup(lease.key, lease.source)
    value = found[1] if found is not None else None
    stats = ItemStats(lease.enqueue_time, lease.requeue_time, lease.dequeue_count)
    return _item(q, item_id, key_deadline(lease.key), "leased", stats, value, with_values, lease)


def _groups(
    q: Queue, start: bytes, upto: bytes | None
) -> Iterator[tuple[bytes, list[tuple[bytes, bytes]], int]]:
    """(pending key, pendings as (stats, value), tombstone count) per (deadline, id)."""
    group = b""
    pend: list[tuple[bytes, bytes]] = []
    tombs = 0
    for key, stats, value in _merged(q, start):
        if upto is not None and key > upto:
            break
        g = _group(key)
        if g != group:
            if group:
                yield group, pend, tombs
            group, pend, tombs = g, [], 0
        if stats is None:
            tombs += 1
        else:
            assert value is not None
            pend.append((stats, value))
    if group:
        yield group, pend, tombs


def browse(
    q: Queue, state: str, after: bytes, limit: int, with_values: bool, now: int
) -> BrowsePage:
    """One page of live items in key order after ``after`` (call under the queue lock)."""
    if state == "leased":
        return _browse_leased(q, after, limit, with_values)
    now_key = encode_key(now, MAX_ID, TOMBSTONE)
    cursor = q.deliveries.cursor
    start, upto = after, None
    if state == "due":
        start, upto = max(after, cursor), now_key
    elif state == "delayed":
        start = max(after, cursor, now_key)
    items: list[BrowsedItem] = []
    stop: bytes | None = None
    for scanned, (pkey, pend, tombs) in enumerate(_groups(q, start, upto), 1):
        item_id = key_id(pkey)
        deadline = key_deadline(pkey)
        if pkey <= cursor:
            lease = q.deliveries.leases.get(item_id)
            if lease is not None and lease.key == pkey and state == "all":
                items.append(_leased_item(q, item_id, lease, with_values))
        elif len(pend) > tombs:
            st = "due" if deadline <= now else "delayed"
            if state in ("all", st):
                stats, value = _newest(pend)
                enq, req, cnt = decode_stats(stats)
                stats_ = ItemStats(enq, req, cnt)
                items.append(_item(q, item_id, deadline, st, stats_, value, with_values, None))
        if len(items) >= limit or scanned >= MAX_SCAN:
            stop = _tomb(pkey)
            break
    if state != "delayed" and q.deliveries.index.indexed:
        return _with_held(q, items, after, stop, limit, with_values)
    return BrowsePage(items, None if stop is None else encode_cursor(q.name, stop))


def _with_held(
    q: Queue,
    items: list[BrowsedItem],
    after: bytes,
    stop: bytes | None,
    limit: int,
    with_values: bool,
) -> BrowsePage:
    """A page merged from the walk's ``items`` (which stopped at ``stop``, None: at the
    end) and the held items after ``after`` (due, behind the cursor), in key order.
    One held item more than the page holds is read: then the page is cut and ends
    where it stopped, so the next page goes on with the held items left."""
    held: list[tuple[bytes, BrowsedItem]] = []
    for key, group in q.deliveries.index.held_after(after, limit + 1):
        if stop is not None and key >= stop:
            break
        held.append((key, _held_item(q, key, group, with_values)))
    if not held:
        return BrowsePage(items, None if stop is None else encode_cursor(q.name, stop))
    walked = [(encode_key(i.deadline or 0, i.id), i) for i in items]
    merged = sorted([*walked, *held], key=lambda ki: ki[0])
    if len(merged) > limit:
        merged = merged[:limit]
        stop = _tomb(merged[-1][0])
    page = [i for _k, i in merged]
    return BrowsePage(page, None if stop is None else encode_cursor(q.name, stop))


def _held_item(q: Queue, key: bytes, group: str | None, with_values: bool) -> BrowsedItem:
    """A due item the delivery rules hold back (its entry read where it lives), shown
    as ``_item`` shows any other: its group, its reasons."""
    found = q.files.lookup(key, None)
    stats, value = found if found is not None else (b"", None)
    enq, req, cnt = decode_stats(stats) if stats else (0, 0, 0)
    item_id = key_id(key)
    return BrowsedItem(
        id=item_id,
        deadline=key_deadline(key),
        state="due",
        stats=ItemStats(enq, req, cnt),
        value_size=len(value) if value is not None else 0,
        value=value if with_values else None,
        dead_lettered_from=q.meta.origins.get(item_id),
        group=group,
        errors=q.item_reasons(item_id),
    )


def waiting_keys(q: Queue, after: bytes, limit: int) -> list[tuple[bytes, tuple[bytes, bytes]]]:
    """Up to ``limit`` live, unleased items after ``after`` as (pending key, (stats,
    value)): the items the delivery rules hold back (behind the cursor, so first in
    key order), then those after the dequeue cursor; call under the queue lock."""
    out: list[tuple[bytes, tuple[bytes, bytes]]] = []
    index = q.deliveries.index
    held_after = after
    while index.indexed:
        # a held key whose entry is not found is passed over: read on past the page
        page = index.held_after(held_after, limit)
        for key, _group in page:
            found = q.files.lookup(key, None)
            if found is not None:
                out.append((key, found))
                if len(out) >= limit:
                    return out
        if not page or len(page) < limit:
            break
        held_after = page[-1][0]
    for pkey, pend, tombs in _groups(q, max(after, q.deliveries.cursor), None):
        if len(pend) > tombs:
            out.append((pkey, _newest(pend)))
            if len(out) >= limit:
                break
    return out


def _browse_leased(q: Queue, after: bytes, limit: int, with_values: bool) -> BrowsePage:
    leases = sorted(
        (
            (lease.key, item_id, lease)
            for item_id, lease in q.deliveries.leases.values()
            if lease.key > after
        ),
        key=lambda t: t[0],
    )
    page = leases[:limit]
    items = [_leased_item(q, item_id, lease, with_values) for _k, item_id, lease in page]
    more = len(leases) > limit
    return BrowsePage(items, encode_cursor(q.name, _tomb(page[-1][0])) if more else None)


# ------------------------------------------------------------------ one item by id


def _id_bytes(item_id: int) -> tuple[bytes, int]:
    """The last 8 bytes of a pending key with this id (any deadline), and key[7] & 3."""
    return ((item_id << 2) & _MASK64).to_bytes(8, "big"), item_id >> 62


def _has_id(key: bytes, low: bytes, high: int) -> bool:
    return key[8:] == low and key[7] & 0b11 == high


def _find_in_raw(raw: bytes, low: bytes, high: int, where: str) -> list[bytes]:
    """Pending keys with this id in one decoded block: a byte search, parsed on a hit."""
    needle = low
    hits: list[bytes] = []
    pos = raw.find(needle)
    if pos < 0:
        return hits
    block = Block(raw, where, 0)
    starts = set(block.offsets)
    while pos >= 0:
        start = pos - 8
        if start in starts:
            key = raw[start : start + 16]
            if _has_id(key, low, high):
                hits.append(key)
        pos = raw.find(needle, pos + 1)
    return hits


def scan_candidates(q: Queue, item_id: int) -> tuple[set[bytes], list[str]]:
    """Pending keys that may be item ``item_id``'s, from the segment files that can hold it.

    Takes the queue lock only to list the files; reads them without it."""
    with q.lock:
        paths = [r.path for r in q.files.segments if r.info.max_id >= item_id]
    low, high = _id_bytes(item_id)
    found: set[bytes] = set()
    unreadable: list[str] = []
    for path in paths:
        try:
            reader = SegmentReader(path)
        except FileNotFoundError:  # merged away meanwhile: its entries are in the output
            unreadable.append(path)
            continue
        try:
            for b in range(reader.info.block_count):
                found.update(_find_in_raw(reader.read_raw(b), low, high, path))
        except CorruptionError:
            unreadable.append(path)
        finally:
            reader.close()
    return found, unreadable


@dataclass(slots=True)
class Found:
    """Where item ``id`` lives now: its key, stats, value, and its lease if leased."""

    id: int
    key: bytes
    stats: ItemStats
    value: bytes | None
    lease: Lease | None


def _net(q: Queue, pkey: bytes) -> tuple[int, tuple[bytes, bytes] | None]:
    """(pendings - tombstones, newest pending) of ``pkey`` over the current sources."""
    return q.files.count(pkey)


def net_at(q: Queue, pkey: bytes) -> int:
    """Pendings minus tombstones of the pending key ``pkey`` over the current sources
    (call under the queue lock): one block per segment file whose range holds it."""
    return _net(q, pkey)[0]


def resolve(q: Queue, item_id: int, candidates: set[bytes]) -> Found | None:
    """The live copy of item ``item_id`` (call under the queue lock), or None if gone."""
    lease = q.deliveries.leases.get(item_id)
    if lease is not None:
        found = q.files.lookup(lease.key, lease.source)
        stats = ItemStats(lease.enqueue_time, lease.requeue_time, lease.dequeue_count)
        return Found(item_id, lease.key, stats, found[1] if found else None, lease)
    low, high = _id_bytes(item_id)
    keys = set(candidates)
    for mem in q.files.memsegs():
        keys.update(k for k in mem.entries if _has_id(k, low, high))
    cursor = q.deliveries.cursor
    index = q.deliveries.index
    for pkey in sorted(keys, reverse=True):
        if pkey <= cursor and not (
            index.indexed and index.holds(pkey, q.files.group_of(pkey, None))
        ):
            continue  # behind the cursor only a leased or a held entry is live
        net, newest = _net(q, pkey)
        if net > 0 and newest is not None:
            enq, req, cnt = decode_stats(newest[0])
            return Found(item_id, pkey, ItemStats(enq, req, cnt), newest[1], None)
    return None


def state_of(found: Found, now: int) -> str:
    if found.lease is not None:
        return "leased"
    return "due" if key_deadline(found.key) <= now else "delayed"


def as_item(q: Queue, found: Found, now: int, with_values: bool) -> BrowsedItem:
    return _item(
        q,
        found.id,
        key_deadline(found.key),
        state_of(found, now),
        found.stats,
        found.value,
        with_values,
        found.lease,
    )


def gone(q: Queue, item_id: int, moved_to: MovedTo | None = None) -> BrowsedItem:
    return BrowsedItem(
        id=item_id,
        deadline=None,
        state="gone",
        stats=None,
        value_size=0,
        dead_lettered_from=q.meta.origins.get(item_id),
        moved_to=moved_to,
    )
