"""Segment files: sorted, immutable, zstd-compressed blocks + block index + footer.

Specification: ``docs/format.md`` ("Segment file"). Layout:

    header(16) | block 0 | ... | block n-1 | index | footer(112)

A segment holding grouped items (``docs/delivery.md``) is version 2: each block that has
a grouped entry is followed by its *group column* (a zstd frame: one ``length u8 |
group`` per entry, in the block's order, length 0 for none), and a group index (16
bytes a block) sits right before the index; footer flag ``FLAG_GROUPS`` says so. The
group of an entry is read with its block, so a waiting item's group costs no memory.

Each block is one zstd frame whose content is a run of entries in the original design's format
(``dq.storage.codec``), sorted by key. The index has one 40-byte row per block (first
key, offset, compressed length, crc32 of the compressed bytes, entry count, raw
length). The footer carries the original design's ``pending_count``, ``tombstone_count``,
``last_key`` and ``max_id`` plus what a reader needs.

Opening a segment reads only the footer and the index — never the entries — so
recovery time does not grow with the items stored. Files are written under a
``.tmp`` name, fsynced and renamed: a ``.seg`` file that exists is complete.
"""

from __future__ import annotations

import bisect
import os
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from sys import intern

import zstandard

from dq.storage import fileio
from dq.storage.codec import KEY_SIZE, TOMBSTONE, iter_entries, key_id
from dq.storage.errors import CorruptionError
from dq.storage.segment_counts import SegmentCounts

__all__ = [
    "BLOCK_TARGET",
    "FOOTER",
    "HEADER",
    "INDEX_ROW",
    "Block",
    "SegmentInfo",
    "SegmentReader",
    "segment_name",
    "write_segment",
    "write_segment_grouped",
]

MAGIC = b"DQSG"
FOOTER_MAGIC = b"DQSGEND1"
VERSION = 1
#: the version of a segment with a group column (``FLAG_GROUPS``); readers take both
VERSION_GROUPS = 2
FLAG_GROUPS = 1
BLOCK_TARGET = 64 * 1024
ZSTD_LEVEL = 3

#: magic, version, flags, reserved, crc32 of the first 12 bytes
HEADER = struct.Struct(">4sHHII")
assert HEADER.size == 16
#: first key, offset, compressed length, crc32(compressed), entry count, raw length
INDEX_ROW = struct.Struct(">16sQIIII")
assert INDEX_ROW.size == 40
#: offset, compressed length (0: the block has no grouped entry), crc32(compressed)
GROUP_ROW = struct.Struct(">QII")
assert GROUP_ROW.size == 16
#: pending_count, tombstone_count, last_key, max_id, first_key, index_offset,
#: index_length, index_crc, seg_lo, seg_hi, block_count, flags, footer crc32 (over
#: the first 96 bytes), version, reserved, magic
FOOTER = struct.Struct(">QQ16sQ16sQIIQQIIIHH8s")
assert FOOTER.size == 112


def segment_name(lo: int, hi: int) -> str:
    return f"{lo:010d}-{hi:010d}.seg"


def encode_header() -> bytes:
    body = struct.pack(">4sHHI", MAGIC, VERSION, 0, 0)
    return body + struct.pack(">I", zlib.crc32(body))


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """The footer, decoded."""

    pending_count: int
    tombstone_count: int
    last_key: bytes
    max_id: int
    first_key: bytes
    index_offset: int
    index_length: int
    index_crc: int
    seg_lo: int
    seg_hi: int
    block_count: int
    flags: int


def write_segment(
    path: str,
    entries: Iterable[tuple[bytes, bytes]],
    *,
    seg_lo: int,
    seg_hi: int,
    max_id: int,
) -> SegmentInfo | None:
    """Write (key, encoded entry) pairs, already sorted, as a segment file at ``path``.

    Returns the footer, or None (and writes nothing) if there are no entries.
    ``max_id`` is carried even if the entries that had it were cancelled.
    """
    return write_segment_grouped(
        path, ((k, e, None) for k, e in entries), seg_lo=seg_lo, seg_hi=seg_hi, max_id=max_id
    )


def encode_column(groups: list[str | None]) -> bytes:
    """A block's group column, uncompressed: ``length u8 | group`` per entry."""
    out = bytearray()
    for g in groups:
        if g is None:
            out.append(0)
        else:
            raw = g.encode("ascii")
            out.append(len(raw))
            out += raw
    return bytes(out)


def decode_column(raw: bytes, count: int, where: str, offset: int) -> list[str | None]:
    """A block's groups, a string for each entry, not interned: a block is read and let
    go, and what keeps a group's name takes the one the delivery index holds (a lease,
    ``DeliveryIndex.took``) or interns it (an entry written again: a move, a redrive, a
    dead letter), so the interpreter's table of interned strings does not grow by every
    group a dequeue reads from a file."""
    out: list[str | None] = []
    pos, end = 0, len(raw)
    while pos < end:
        n = raw[pos]
        pos += 1
        if n == 0:
            out.append(None)
            continue
        if pos + n > end:
            break
        out.append(raw[pos : pos + n].decode("ascii", "replace"))
        pos += n
    if pos != end or len(out) != count:
        raise CorruptionError(
            "segment group column does not match its block", file=where, offset=offset
        )
    return out


def write_segment_grouped(
    path: str,
    entries: Iterable[tuple[bytes, bytes, str | None]],
    *,
    seg_lo: int,
    seg_hi: int,
    max_id: int,
) -> SegmentInfo | None:
    """``write_segment`` of (key, encoded entry, group) triples: a file with any group
    gets a group column (version 2), one without is version 1, byte for byte."""
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    tmp = path + ".tmp"
    fd = fileio.create(tmp)
    try:
        pos = HEADER.size
        out = [encode_header()]
        out_size = HEADER.size
        index: list[bytes] = []
        pending = tombstones = 0
        first_key = last_key = b""
        block: list[bytes] = []
        block_size = 0
        block_first = b""
        block_count_entries = 0
        column: list[str | None] = []
        column_grouped = False
        group_rows: list[bytes] = []
        any_group = False

        def flush_block() -> None:
            nonlocal pos, block, block_size, block_count_entries, out_size
            nonlocal column, column_grouped, any_group
            raw = b"".join(block)
            comp = compressor.compress(raw)
            index.append(
                INDEX_ROW.pack(
                    block_first, pos, len(comp), zlib.crc32(comp), block_count_entries, len(raw)
                )
            )
            out.append(comp)
            out_size += len(comp)
            pos += len(comp)
            if column_grouped:
                col = compressor.compress(encode_column(column))
                group_rows.append(GROUP_ROW.pack(pos, len(col), zlib.crc32(col)))
                out.append(col)
                out_size += len(col)
                pos += len(col)
                any_group = True
            else:
                group_rows.append(GROUP_ROW.pack(0, 0, 0))
            block, block_size, block_count_entries = [], 0, 0
            column, column_grouped = [], False
            if out_size >= 4 * BLOCK_TARGET:
                fileio.write_all(fd, b"".join(out), tmp)
                out.clear()
                out_size = 0

        for key, encoded, group in entries:
            column.append(group)
            if group is not None:
                column_grouped = True
            if not block:
                block_first = key
            if not first_key:
                first_key = key
            last_key = key
            max_id = max(max_id, key_id(key))
            if key[15] & 0b11 == TOMBSTONE:
                tombstones += 1
            else:
                pending += 1
            block.append(encoded)
            block_size += len(encoded)
            block_count_entries += 1
            if block_size >= BLOCK_TARGET:
                flush_block()
        if block:
            flush_block()
        if not index:
            os.close(fd)
            fd = -1
            fileio.remove(tmp)
            return None
        flags, version = 0, VERSION
        if any_group:
            groups_index = b"".join(group_rows)
            out.append(groups_index)
            pos += len(groups_index)
            flags, version = FLAG_GROUPS, VERSION_GROUPS
        index_bytes = b"".join(index)
        body = FOOTER.pack(
            pending,
            tombstones,
            last_key,
            max_id,
            first_key,
            pos,
            len(index_bytes),
            zlib.crc32(index_bytes),
            seg_lo,
            seg_hi,
            len(index),
            flags,
            0,
            version,
            0,
            FOOTER_MAGIC,
        )
        footer = body[:96] + struct.pack(">I", zlib.crc32(body[:96])) + body[100:]
        out.append(index_bytes)
        out.append(footer)
        fileio.write_all(fd, b"".join(out), tmp)
        fileio.fsync(fd, tmp)
    except BaseException:
        os.close(fd)
        fd = -1
        fileio.remove(tmp)
        raise
    finally:
        if fd >= 0:
            os.close(fd)
    fileio.rename(tmp, path)
    fileio.fsync_dir(os.path.dirname(path) or ".")
    return decode_footer(footer, path)


def decode_footer(footer: bytes, path: str, offset: int = 0) -> SegmentInfo:
    if len(footer) != FOOTER.size:
        raise CorruptionError("segment shorter than its footer", file=path, offset=offset)
    f = FOOTER.unpack(footer)
    if f[15] != FOOTER_MAGIC:
        raise CorruptionError("bad segment footer magic", file=path, offset=offset + 104)
    if zlib.crc32(footer[:96]) != f[12]:
        raise CorruptionError("segment footer checksum mismatch", file=path, offset=offset)
    if f[13] not in (VERSION, VERSION_GROUPS) or (f[13] == VERSION_GROUPS) != bool(
        f[11] & FLAG_GROUPS
    ):
        raise CorruptionError(
            f"unsupported segment version {f[13]}", file=path, offset=offset + 100
        )
    return SegmentInfo(
        pending_count=f[0],
        tombstone_count=f[1],
        last_key=f[2],
        max_id=f[3],
        first_key=f[4],
        index_offset=f[5],
        index_length=f[6],
        index_crc=f[7],
        seg_lo=f[8],
        seg_hi=f[9],
        block_count=f[10],
        flags=f[11],
    )


class Block:
    """One decoded block: its entries' keys, where each entry starts in ``raw``, and
    where the merge must read an entry with the one before it (``breaks``: a tombstone,
    or a key again — a merge writes a key as often as its pendings outnumber its
    tombstones): between two breaks every entry is pending, its key's only copy here."""

    __slots__ = ("breaks", "groups", "keys", "offsets", "raw")

    def __init__(self, raw: bytes, where: str, base: int) -> None:
        self.raw = raw
        #: each entry's group (None: ungrouped), or None if no entry has one
        self.groups: list[str | None] | None = None
        keys: list[bytes] = []
        offsets: list[int] = []
        breaks: list[int] = []
        last = b""
        for key, _stats, _value, off in iter_entries_keys(raw, where, base):
            if key[15] & 0b11 == TOMBSTONE or key == last:
                breaks.append(len(keys))
            keys.append(key)
            offsets.append(off)
            last = key
        self.keys = keys
        self.offsets = offsets
        self.breaks = breaks

    def entry(self, i: int) -> tuple[bytes, bytes, bytes]:
        """(key, stats, value) of the pending entry at position ``i``."""
        off = self.offsets[i]
        raw = self.raw
        length = int.from_bytes(raw[off + 32 : off + 36], "big")
        return raw[off : off + 16], raw[off + 16 : off + 32], raw[off + 36 : off + 36 + length]

    def group(self, i: int) -> str | None:
        groups = self.groups
        return None if groups is None else groups[i]

    def encoded(self, i: int) -> bytes:
        """The entry at ``i`` exactly as stored."""
        off = self.offsets[i]
        end = self.offsets[i + 1] if i + 1 < len(self.offsets) else len(self.raw)
        return self.raw[off:end]


def iter_entries_keys(raw: bytes, where: str, base: int) -> Iterator[tuple[bytes, None, None, int]]:
    """Like ``iter_entries`` but without copying values (keys and offsets only)."""
    end = len(raw)
    pos = 0
    while pos < end:
        if end - pos < KEY_SIZE:
            raise CorruptionError("truncated entry key", file=where, offset=base + pos)
        kind = raw[pos + 15] & 0b11
        if kind == TOMBSTONE:
            yield raw[pos : pos + 16], None, None, pos
            pos += 16
        elif kind == 0 and end - pos >= 36:
            length = int.from_bytes(raw[pos + 32 : pos + 36], "big")
            if pos + 36 + length > end:
                raise CorruptionError(
                    "entry value runs past its block", file=where, offset=base + pos
                )
            yield raw[pos : pos + 16], None, None, pos
            pos += 36 + length
        else:
            # let the full decoder produce the precise error
            for _ in iter_entries(raw[pos:], where=where, base=base + pos):
                pass
            raise CorruptionError("malformed entry", file=where, offset=base + pos)


class SegmentReader:
    """An open segment file: footer and block index in memory, blocks read on demand."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(self._fd).st_size
            self.file_size = size
            if size < HEADER.size + FOOTER.size:
                raise CorruptionError("segment too short", file=path, offset=0, size=size)
            header = fileio.pread(self._fd, HEADER.size, 0)
            magic, _version, _flags, _r, crc = HEADER.unpack(header)
            if magic != MAGIC or zlib.crc32(header[:12]) != crc:
                raise CorruptionError("bad segment header", file=path, offset=0)
            self.info = decode_footer(
                fileio.pread(self._fd, FOOTER.size, size - FOOTER.size), path, size - FOOTER.size
            )
            info = self.info
            if info.index_offset + info.index_length != size - FOOTER.size:
                raise CorruptionError(
                    "segment index does not end at the footer", file=path, offset=info.index_offset
                )
            index = fileio.pread(self._fd, info.index_length, info.index_offset)
            if (
                zlib.crc32(index) != info.index_crc
                or len(index) != info.block_count * INDEX_ROW.size
            ):
                raise CorruptionError(
                    "segment index checksum mismatch", file=path, offset=info.index_offset
                )
            rows = [
                INDEX_ROW.unpack_from(index, i * INDEX_ROW.size) for i in range(info.block_count)
            ]
            group_rows: list[tuple[int, int, int]] = []
            if info.flags & FLAG_GROUPS:
                size_g = info.block_count * GROUP_ROW.size
                graw = fileio.pread(self._fd, size_g, info.index_offset - size_g)
                if len(graw) != size_g:
                    raise CorruptionError(
                        "segment group index cut short", file=path, offset=info.index_offset
                    )
                group_rows = [
                    GROUP_ROW.unpack_from(graw, i * GROUP_ROW.size) for i in range(info.block_count)
                ]
        except BaseException:
            os.close(self._fd)
            raise
        self.first_keys = [r[0] for r in rows]
        #: per block (offset, length, crc32) of its group column (length 0: none)
        self._group_rows = group_rows
        self._rows = [(r[1], r[2], r[3]) for r in rows]
        self.block_entries = [r[4] for r in rows]
        self._dctx = zstandard.ZstdDecompressor()
        self.closed = False
        #: the merge output that replaced this segment (a hint for value lookups)
        self.replaced_by: SegmentReader | None = None
        self._counts: SegmentCounts | None = None
        #: the block ``get`` read last (one decoded block: values are not kept beyond it)
        self._last: tuple[int, Block] | None = None

    @property
    def counts(self) -> SegmentCounts:
        """Exact counts below a key, for stats (made on first use: a merge's inputs
        never need them)."""
        if self._counts is None:
            self._counts = SegmentCounts(self)
        return self._counts

    def reopen(self) -> SegmentReader:
        """The same file through a new handle (a descriptor and decompressor of its own),
        for a thread that reads it without the queue's lock (``SegmentCounts.learn``);
        OSError if the file is gone."""
        return SegmentReader(self.path)

    @property
    def seg_lo(self) -> int:
        return self.info.seg_lo

    @property
    def seg_hi(self) -> int:
        return self.info.seg_hi

    @property
    def has_groups(self) -> bool:
        return bool(self._group_rows)

    def read_block(self, i: int) -> Block:
        block = Block(self.read_raw(i), self.path, self._rows[i][0])
        if self._group_rows and self._group_rows[i][1]:
            block.groups = self.read_groups(i, len(block.keys))
        return block

    def read_groups(self, i: int, count: int) -> list[str | None]:
        """Block ``i``'s group column (``count`` entries), checked and decoded."""
        offset, length, crc = self._group_rows[i]
        raw = self._read_checked(offset, length, crc, "group column", i)
        return decode_column(raw, count, self.path, offset)

    def read_raw(self, i: int) -> bytes:
        """Block ``i``'s entries, checked and decompressed but not parsed."""
        offset, length, crc = self._rows[i]
        return self._read_checked(offset, length, crc, "block", i)

    def _read_checked(self, offset: int, length: int, crc: int, what: str, i: int) -> bytes:
        """``length`` compressed bytes at ``offset`` (block ``i``'s ``what``), checked
        against ``crc`` and decompressed."""
        comp = fileio.pread(self._fd, length, offset)
        if len(comp) != length or zlib.crc32(comp) != crc:
            raise CorruptionError(
                f"segment {what} checksum mismatch", file=self.path, offset=offset, block=i
            )
        try:
            return self._dctx.decompress(comp)
        except zstandard.ZstdError as exc:
            raise CorruptionError(
                f"segment {what} does not decompress: {exc}", file=self.path, offset=offset
            ) from exc

    def block_for(self, key: bytes) -> int:
        """Index of the block that would hold ``key`` (0 if before the first)."""
        return max(bisect.bisect_right(self.first_keys, key) - 1, 0)

    def get(self, key: bytes) -> tuple[bytes, bytes] | None:
        """(stats, value) of the pending entry ``key``, reading one block."""
        found = self.get_grouped(key)
        return None if found is None else (found[0], found[1])

    def get_grouped(self, key: bytes) -> tuple[bytes, bytes, str | None] | None:
        """(stats, value, group) of the pending entry ``key``, reading one block."""
        if not self.first_keys or key < self.first_keys[0] or key > self.info.last_key:
            return None
        b = self.block_for(key)
        last = self._last
        if last is not None and last[0] == b:
            block = last[1]
        else:  # a page of browsed items asks about one block many times in a row
            block = self.read_block(b)
            self._last = (b, block)
        i = bisect.bisect_left(block.keys, key)
        if i < len(block.keys) and block.keys[i] == key:
            _k, stats, value = block.entry(i)
            group = block.group(i)  # interned: a move or a redrive keeps it in memory
            return stats, value, None if group is None else intern(group)
        return None

    def scan(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, encoded entry) in order, one block in memory at a time."""
        for key, encoded, _g in self.scan_grouped():
            yield key, encoded

    def scan_grouped(self) -> Iterator[tuple[bytes, bytes, str | None]]:
        """Every (key, encoded entry, group) in order, one block in memory at a time."""
        for b in range(len(self._rows)):
            block = self.read_block(b)
            for i, key in enumerate(block.keys):
                yield key, block.encoded(i), block.group(i)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._last = None
            os.close(self._fd)


class SegmentCursor:
    """Forward position in one segment, strictly after a key; holds one decoded block."""

    __slots__ = ("block", "block_no", "key", "pos", "reader")

    def __init__(self, reader: SegmentReader, after: bytes) -> None:
        self.reader = reader
        self.block_no = reader.block_for(after) if after else 0
        self.block: Block | None = None
        self.pos = 0
        self.key: bytes | None = None
        self._load(after)

    def _load(self, after: bytes) -> None:
        reader = self.reader
        while self.block_no < len(reader.first_keys):
            block = reader.read_block(self.block_no)
            pos = bisect.bisect_right(block.keys, after) if after else 0
            if pos < len(block.keys):
                self.block, self.pos, self.key = block, pos, block.keys[pos]
                return
            self.block_no += 1
        self.block, self.key = None, None

    def advance(self) -> None:
        block = self.block
        assert block is not None
        self.pos += 1
        if self.pos < len(block.keys):
            self.key = block.keys[self.pos]
            return
        self.block_no += 1
        self.pos = 0
        self._load(b"")

    def seek(self, pos: int) -> None:
        """Step forward to position ``pos`` of the current block (its end: the next
        block's first entry)."""
        block = self.block
        assert block is not None and self.pos <= pos <= len(block.keys)
        if pos < len(block.keys):
            self.pos, self.key = pos, block.keys[pos]
            return
        self.block_no += 1
        self.pos = 0
        self._load(b"")

    def entry(self) -> tuple[bytes, bytes, bytes]:
        assert self.block is not None
        return self.block.entry(self.pos)

    def group(self) -> str | None:
        assert self.block is not None
        return self.block.group(self.pos)
