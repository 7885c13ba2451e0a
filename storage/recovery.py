"""Opening a queue directory after a clean stop or a crash.

Order (``docs/storage.md``, "Recovery"):
1. delete half-written outputs (``*.tmp``) and stale merge-cancel markers;
2. open every segment file — footer and block index only, never the entries — and
   delete any whose range another segment covers (inputs of a merge whose output
   was already renamed into place: they must not be resurrected);
3. cut a torn tail off the ``*.log`` (copied aside first) and turn it into a
   ``*.log_ro``: a new process never appends to an old log, so within one log no
   key is ever written twice;
4. delete each ``*.log_ro`` whose own segment file (``N-N.seg``) exists; load the
   rest into frozen in-memory segments to be rewritten as segment files in the
   background. A log inside a *merged* segment's range is never deleted: a merge
   never takes a log that still exists, so such a log is damage (an error);
5. restore the id counter from footers (``max_id``), log headers (id floor) and
   log entries, so ids are never reused.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field

from dq.storage import fileio
from dq.storage.codec import iter_entries, key_id
from dq.storage.errors import CorruptionError
from dq.storage.itemmeta import groups_of
from dq.storage.memseg import MemSegment
from dq.storage.segment import SegmentReader
from dq.storage.wal import RECORD_HEADER, recover_wal

__all__ = ["Recovered", "load_log", "recover_directory"]

log = logging.getLogger(__name__)

_SEG = re.compile(r"(\d{10})-(\d{10})\.seg")
_LOG = re.compile(r"(\d{10})\.(log|log_ro)")


@dataclass
class Recovered:
    segments: list[SegmentReader] = field(default_factory=list)
    frozen: list[tuple[str, MemSegment]] = field(default_factory=list)
    next_segment_no: int = 1
    next_id: int = 1


def load_log(path: str) -> tuple[MemSegment, int]:
    """Load a log into an in-memory segment; return it and the highest id it implies."""
    contents = recover_wal(path)
    mem = MemSegment(contents.segment_no)
    top = contents.id_floor - 1
    # a record's groups (``storage/itemmeta.py``) are in its own metadata, which ends
    # where its entries begin
    groups = {off + 4 + len(meta): groups_of(meta, path) for off, meta in contents.meta if meta}
    for offset, payload in contents.records:
        mine = groups.get(offset)
        for key, stats, value, _off in iter_entries(
            payload, where=path, base=offset + RECORD_HEADER.size
        ):
            mem.add(key, stats, value, mine.get(key_id(key)) if mine else None)
            top = max(top, key_id(key))
    return mem, top


def recover_directory(directory: str) -> Recovered:
    """Recover one queue directory; on any error every segment opened is closed again."""
    readers: list[SegmentReader] = []
    try:
        return _recover(directory, readers)
    except BaseException:
        for r in readers:
            r.close()
        raise


def _recover(directory: str, readers: list[SegmentReader]) -> Recovered:
    out = Recovered()
    names = sorted(os.listdir(directory))
    for name in names:
        if name.endswith(".tmp") or name.endswith(".cancel"):
            fileio.remove(os.path.join(directory, name))
    for name in names:
        if _SEG.fullmatch(name):
            readers.append(SegmentReader(os.path.join(directory, name)))
    readers.sort(key=lambda r: (r.seg_lo, -r.seg_hi))
    kept: list[SegmentReader] = []
    for r in readers:
        if kept and kept[-1].seg_lo <= r.seg_lo and r.seg_hi <= kept[-1].seg_hi:
            log.info("removing %s: superseded by %s", r.path, kept[-1].path)
            r.close()
            fileio.remove(r.path)
            continue
        if kept and r.seg_lo <= kept[-1].seg_hi:
            raise CorruptionError(
                "segment ranges overlap", file=r.path, other=kept[-1].path, offset=0
            )
        kept.append(r)
    out.segments = kept
    top_id = max((r.info.max_id for r in kept), default=0)
    top_no = max((r.seg_hi for r in kept), default=0)

    logs: list[tuple[int, str]] = []
    for name in names:
        m = _LOG.fullmatch(name)
        if m is None:
            continue
        no, path = int(m.group(1)), os.path.join(directory, name)
        if m.group(2) == "log":
            recover_wal(path)
            ro = path + "_ro"
            fileio.rename(path, ro)
            path = ro
        logs.append((no, path))
    if logs:
        fileio.fsync_dir(directory)
    for no, path in sorted(logs):
        top_no = max(top_no, no)
        covering = [r for r in kept if r.seg_lo <= no <= r.seg_hi]
        if covering and covering[0].seg_lo == covering[0].seg_hi:
            fileio.remove(path)  # its freeze finished; only the deletion was lost
            continue
        if covering:
            raise CorruptionError(
                "log lies inside a merged segment's range but was never frozen into it",
                file=path,
                offset=0,
                segment=covering[0].path,
            )
        mem, top = load_log(path)
        top_id = max(top_id, top)
        out.frozen.append((path, mem))
    out.next_segment_no = top_no + 1
    out.next_id = top_id + 1
    return out
