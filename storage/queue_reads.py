"""Reads: dequeue, the next wake-up, stats.

Invariant: dequeue never looks behind the cursor, and never passes the smallest key of
a batch that is not published yet (the barrier, ``GroupCommit.hold``), so the cursor cannot
overtake an entry that is not visible yet.
"""

# mypy: disable-error-code="misc"
# The methods take ``self: Queue``: they are ``Queue``'s own, kept here by job. mypy
# calls that self-type "not a supertype" of the mixin (the "misc" code turned off above).

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from dq.storage.codec import (
    MAX_DEADLINE,
    MAX_ID,
    TOMBSTONE,
    decode_stats,
    encode_key,
    key_deadline,
)
from dq.storage.queue_core import QueueCore
from dq.storage.types import Delivery, ItemStats, QueueStats
from dq.storage.validation import check_lease_ms

if TYPE_CHECKING:
    from dq.storage.queue import Queue

__all__ = ["ReadsMixin"]


class ReadsMixin(QueueCore):
    """The reads of a queue (and dequeue, which leases what it reads)."""

    # ------------------------------------------------------------------ reads

    def dequeue(self: Queue, count: int, lease_ms: int | None) -> list[Delivery]:
        now = self.engine.now()
        lease_ms = self.config.default_lease_ms if lease_ms is None else lease_ms
        check_lease_ms(lease_ms)
        out: list[Delivery] = []
        dead: list[tuple[bytes, bytes, bytes]] = []
        with self.lock:
            self.check_open()
            self.requeue_expired(now)
            if self.state.paused:
                return out  # a paused queue hands out nothing; lease expiry still runs
            limit = encode_key(now, MAX_ID, TOMBSTONE)
            barrier = self.commit.barrier()
            max_deliveries = self.config.max_deliveries
            expires = now + lease_ms
            view, leases = self.files.view, self.leases
            after = self.cursor
            from_bytes = int.from_bytes
            while len(out) < count:
                after, hit = view.next_live(after, limit, barrier)
                if hit is None:
                    break
                key, stats, value, source = hit
                enq, req, cnt = decode_stats(stats)
                # ``key_id`` and ``key_deadline`` of the key, read once (``docs/format.md``)
                k = from_bytes(key, "big")
                item_id = (k >> 2) & MAX_ID
                if max_deliveries is not None and cnt >= max_deliveries:
                    dead.append((key, stats, value))
                    continue
                cnt += 1
                receipt = leases.add(item_id, key, (enq, req, cnt), expires, source, now)
                out.append(
                    Delivery(
                        item_id,
                        receipt,
                        value,
                        (k >> 66) & MAX_DEADLINE,
                        ItemStats(enq, req, cnt),
                        expires,
                    )
                )
            self.cursor = after
            if out:
                self.rates.add("dequeue", len(out), now)
        if dead:
            self.engine.dead_letter(self, dead)
        return out

    def next_wakeup(self: Queue) -> int | None:
        with self.lock:
            top = None if self.state.paused else self.files.view.peek(self.cursor)
            times = [key_deadline(top[0])] if top is not None else []
            exp = self.leases.next_expiry()
            if exp is not None:
                times.append(exp)
            return min(times) if times else None

    def stats(self: Queue) -> QueueStats:
        now = self.engine.now()
        with self.lock:
            files = self.files
            mems = files.memsegs()
            head = files.view.peek(self.cursor)
            counted = self.state_counter.count(
                [*mems, *(r.counts for r in files.segments)],
                self.cursor,
                now,
                None if head is None else head[0],
            )
            leased = len(self.leases)
            oldest = None if counted.oldest_due is None else now - counted.oldest_due
            disk = sum(r.file_size for r in files.segments)
            disk += self.commit.wal.size if self.loaded else 0
            for path, _m in files.frozen:
                try:
                    disk += os.path.getsize(path)
                except OSError:
                    pass
            return QueueStats(
                name=self.name,
                config=self.config,
                pending=counted.pending,
                due=counted.due,
                delayed=counted.delayed,
                leased=leased,
                segments=len(files.segments),
                bytes_on_disk=disk,
                oldest_due_age_ms=oldest,
                next_id=self.next_id,
                extra={
                    "frozen": len(files.frozen),
                    "memseg_entries": len(files.memseg),
                    "memory_bytes": sum(m.bytes for m in mems),
                    "failed": int(self.health.failed is not None),
                    "damaged": int(self.health.quarantined),
                    "io_errors": self.health.io_errors,
                    "freeze_failures": files.freeze_failures,
                    "rotation_failures": files.rotation_failures,
                    "recoveries": self.health.recoveries,
                },
            )
