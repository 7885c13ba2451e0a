"""Offline tools over data files: ``dq inspect PATH`` and ``dq verify DATA_DIR``.

``inspect`` describes one log or segment file (header, footer, counts, first and last
keys, and every entry on request). ``verify`` checks every checksum and invariant of a
whole data directory without opening it as an engine (so it works on a copy, or beside
a stopped server) and reports each problem with file and offset. A torn log tail is
reported as a note, not damage: it is what a crash leaves and recovery cuts it off.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from dq.storage.codec import TOMBSTONE, decode_key, decode_stats, iter_entries, key_id
from dq.storage.errors import CorruptionError
from dq.storage.itemmeta import decode_meta, read_sidecar
from dq.storage.queue_config import CONFIG_FILE, load_config
from dq.storage.queue_state import STATE_FILE, load_state
from dq.storage.segment import SegmentReader
from dq.storage.wal import RECORD_HEADER, read_wal

__all__ = ["Problem", "describe_key", "inspect_file", "verify_data_dir"]

_SEG = re.compile(r"(\d{10})-(\d{10})\.seg")
_LOG = re.compile(r"(\d{10})\.(log|log_ro)")
_META = re.compile(r"(\d{10})\.meta")


@dataclass(frozen=True)
class Problem:
    file: str
    offset: int | None
    message: str
    damage: bool = True

    def __str__(self) -> str:
        where = f"{self.file}" + (f" @ {self.offset}" if self.offset is not None else "")
        return f"{'DAMAGE' if self.damage else 'note'}: {where}: {self.message}"


def describe_key(key: bytes) -> str:
    deadline, item_id, kind = decode_key(key)
    return f"deadline={deadline} id={item_id} {'tombstone' if kind == TOMBSTONE else 'pending'}"


def _entry_lines(entries: Iterator[tuple[bytes, bytes | None, bytes | None, int]]) -> Iterator[str]:
    for key, stats, value, off in entries:
        line = f"  @{off:<8} {describe_key(key)}"
        if stats is not None and value is not None:
            enq, req, cnt = decode_stats(stats)
            preview = value[:32].hex() + ("…" if len(value) > 32 else "")
            line += f" enqueue_time={enq} requeue_time={req} dequeue_count={cnt} len={len(value)} value={preview}"
        yield line


def _count(n: int, word: str, many: str | None = None) -> str:
    """``1 record``, ``2 records``: ``dq inspect`` speaks to people."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def inspect_file(path: str, *, entries: bool = False) -> Iterator[str]:
    """Lines describing a log or segment file."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"DQWL":
        c = read_wal(path)
        n_pend = n_tomb = 0
        keys: list[bytes] = []
        for _off, payload in c.records:
            for key, stats, _v, _o in iter_entries(payload, where=path):
                keys.append(key)
                if stats is None:
                    n_tomb += 1
                else:
                    n_pend += 1
        yield f"log {path}"
        yield f"  segment number {c.segment_no}, id floor {c.id_floor}"
        yield (
            f"  {_count(len(c.records), 'record')}, {_count(n_pend, 'pending entry', 'pending entries')}, "
            f"{_count(n_tomb, 'tombstone')}"
        )
        yield f"  valid bytes {c.valid_end} of {c.file_size}" + (
            f" (torn tail of {_count(c.torn_bytes, 'byte')})" if c.torn_bytes else ""
        )
        if keys:
            yield f"  first key {describe_key(min(keys))}"
            yield f"  last key  {describe_key(max(keys))}"
        if entries:
            for off, payload in c.records:
                yield f" record @{off} ({_count(len(payload), 'byte')})"
                yield from _entry_lines(
                    iter_entries(payload, where=path, base=off + RECORD_HEADER.size)
                )
    elif magic == b"DQSG":
        r = SegmentReader(path)
        try:
            i = r.info
            yield f"segment {path}"
            yield (
                f"  covers logs {i.seg_lo}..{i.seg_hi}, {_count(r.file_size, 'byte')}, "
                f"{_count(i.block_count, 'block')}"
            )
            yield f"  pending_count {i.pending_count}, tombstone_count {i.tombstone_count}, max_id {i.max_id}"
            yield f"  first key {describe_key(i.first_key)}"
            yield f"  last key  {describe_key(i.last_key)}"
            yield f"  index at {i.index_offset} ({_count(i.index_length, 'byte')})"
            if entries:
                for b in range(i.block_count):
                    block = r.read_block(b)
                    yield (
                        f" block {b}: {_count(len(block.keys), 'entry', 'entries')}, "
                        f"{_count(len(block.raw), 'byte')} raw"
                    )
                    yield from _entry_lines(iter_entries(block.raw, where=path))
        finally:
            r.close()
    else:
        raise CorruptionError("not a dq log or segment file (unknown magic)", file=path, offset=0)


def _verify_segment(path: str) -> Iterator[Problem]:
    try:
        r = SegmentReader(path)
    except CorruptionError as exc:
        yield Problem(path, _offset(exc), exc.message)
        return
    try:
        info = r.info
        pend = tomb = 0
        prev = b""
        top = 0
        first = last = b""
        for b in range(info.block_count):
            try:
                block = r.read_block(b)
            except CorruptionError as exc:
                yield Problem(path, _offset(exc), exc.message)
                return
            if block.keys and block.keys[0] != r.first_keys[b]:
                yield Problem(
                    path, None, f"block {b} starts with a key other than its index row says"
                )
            if len(block.keys) != r.block_entries[b]:
                yield Problem(
                    path,
                    None,
                    f"block {b} holds {len(block.keys)} entries, index says {r.block_entries[b]}",
                )
            for key in block.keys:
                if key < prev:
                    yield Problem(path, None, f"keys out of order in block {b}")
                prev = key
                first = first or key
                last = key
                top = max(top, key_id(key))
                if key[15] & 0b11 == TOMBSTONE:
                    tomb += 1
                else:
                    pend += 1
        if (pend, tomb) != (info.pending_count, info.tombstone_count):
            yield Problem(
                path,
                None,
                f"footer counts {info.pending_count}/{info.tombstone_count}, entries {pend}/{tomb}",
            )
        if (first, last) != (info.first_key, info.last_key):
            yield Problem(path, None, "footer first/last key do not match the entries")
        if top > info.max_id:
            yield Problem(path, None, f"an entry has id {top} above footer max_id {info.max_id}")
    finally:
        r.close()


def _offset(exc: CorruptionError) -> int | None:
    off = exc.context.get("offset")
    return off if isinstance(off, int) else None


def _verify_settings(directory: str) -> Iterator[Problem]:
    """``queue.json`` and ``state.json`` read as opening the queue reads them."""
    for name, load in ((CONFIG_FILE, load_config), (STATE_FILE, load_state)):
        try:
            load(directory)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            where = os.path.join(directory, name)
            yield Problem(where, getattr(exc, "pos", None), f"unreadable {name}: {exc}")


def _verify_meta(path: str, meta: bytes) -> Iterator[Problem]:
    try:
        for _ in decode_meta(meta, path):
            pass
    except CorruptionError as exc:
        yield Problem(path, _offset(exc), exc.message)


def _verify_queue(directory: str) -> Iterator[Problem]:
    yield from _verify_settings(directory)
    ranges: list[tuple[int, int, str]] = []
    live_logs = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if m := _SEG.fullmatch(name):
            ranges.append((int(m.group(1)), int(m.group(2)), path))
            yield from _verify_segment(path)
        elif m := _LOG.fullmatch(name):
            if m.group(2) == "log":
                live_logs.append(name)
            try:
                c = read_wal(path)
            except CorruptionError as exc:
                yield Problem(path, _offset(exc), exc.message)
                continue
            if c.segment_no != int(m.group(1)):
                yield Problem(path, 8, f"header says log {c.segment_no}")
            for _off, meta in c.meta:
                yield from _verify_meta(path, meta)
            for off, payload in c.records:
                try:
                    for _ in iter_entries(payload, where=path, base=off + RECORD_HEADER.size):
                        pass
                except CorruptionError as exc:
                    yield Problem(path, _offset(exc), exc.message)
            if c.torn_bytes:
                yield Problem(
                    path,
                    c.valid_end,
                    f"torn tail of {_count(c.torn_bytes, 'byte')} (recovery cuts it)",
                    damage=False,
                )
        elif _META.fullmatch(name):  # opening the queue reads every sidecar
            try:
                _no, meta = read_sidecar(path)
            except CorruptionError as exc:
                yield Problem(path, _offset(exc), exc.message)
                continue
            yield from _verify_meta(path, meta)
        elif name.endswith(".tmp"):
            yield Problem(path, None, "half-written file (deleted on open)", damage=False)
    if len(live_logs) > 1:  # a crash during a rotation: the next log was already created
        yield Problem(
            directory,
            None,
            f"more than one open log: {live_logs} (a crash during a rotation; recovery "
            "freezes each)",
            damage=False,
        )
    ranges.sort()
    for (lo1, hi1, p1), (lo2, hi2, p2) in itertools.pairwise(ranges):
        if lo2 <= hi1 and not (lo1 <= lo2 and hi2 <= hi1):
            yield Problem(p2, None, f"range {lo2}..{hi2} overlaps {os.path.basename(p1)}")


def verify_data_dir(root: str) -> list[Problem]:
    """Every problem found under a data directory (empty list: all good)."""
    qroot = os.path.join(root, "queues")
    if not os.path.isdir(qroot):
        return [Problem(root, None, "not a dq data directory (no queues/)")]
    problems: list[Problem] = []
    for name in sorted(os.listdir(qroot)):
        path = os.path.join(qroot, name)
        if os.path.isdir(path) and not name.startswith(".deleted-"):
            problems.extend(_verify_queue(path))
    return problems
