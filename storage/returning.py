"""Which items are on their way back from an expired lease, read from what is stored.

With ``group_limit`` set, an item whose lease ran out comes back ahead of its group's
later items (``docs/delivery.md``, "An expired lease's place"): the write-back gives it a
new pending entry (due now, or at the retry policy's deadline, often after its group's
next item), and the delivery index marks its group as waiting for it
(``DeliveryIndex.returning``). The promise holds across a restart and a replica group's
failover, so the marks are rebuilt from the stored data wherever a queue starts to
deliver from it (``Queue.open``, and a follower that starts to lead).

The stored data tells exactly: the write-back record (``Queue.requeue_expired``) gives
the item a pending entry whose stats (``docs/format.md``) carry the expiry's time as its
requeue time and the delivery that expired as its delivery count, and an error entry
whose newest reason is "lease expired" with that same time and delivery. Every later
write of the item changes one of them: a release or delete leaves a tombstone, a
requeue or fail after a new delivery counts one delivery more, a move by key (which
keeps the reasons) a new requeue time. An item written back and delivered again whose
lease a restart or a failover ended still has that entry: it comes back first again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from dq.storage.codec import decode_stats, encode_key
from dq.storage.reasons import LEASE_EXPIRED, ErrorNote, Reason

__all__ = ["returning_entries"]


def returning_entries(
    notes: Mapping[int, ErrorNote],
    after: bytes,
    reasons_of: Callable[[int], tuple[Reason, ...] | None],
    count: Callable[[bytes], tuple[int, tuple[bytes, bytes] | None]],
    group_of: Callable[[bytes], str | None],
) -> dict[bytes, str]:
    """Key -> group of every live grouped entry above ``after`` (the cursor) that a
    lease expiry wrote and nothing has written over since (see the module docstring).
    ``notes``: the items with reasons; ``count``: (pendings - tombstones, newest pending
    as (stats, value)) of a key (``SegmentSet.count``)."""
    found: dict[bytes, str] = {}
    for item_id, note in list(notes.items()):
        key = encode_key(note.deadline, item_id)
        if key <= after:
            continue  # behind the cursor: leased, held or cancelled
        net, newest = count(key)
        if net <= 0 or newest is None:
            continue
        _enq, requeued, delivery = decode_stats(newest[0])
        reasons = reasons_of(item_id)
        if not reasons:
            continue
        last = reasons[0]
        if last.error != LEASE_EXPIRED or last.at != requeued or last.delivery != delivery:
            continue
        group = group_of(key)
        if group is not None:
            found[key] = group
    return found
