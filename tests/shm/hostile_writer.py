"""A hostile ring client, run as its own process by tests/shm/test_session_fuzz.py.

Usage: python tests/shm/hostile_writer.py DATA_DIR SEED COUNT

Attaches to the server of DATA_DIR (bound to the queue "hostile") and writes COUNT
malformed commands into its ring: random ops (known and unknown), random keys, a
``value_size`` beyond the slot, random value bytes, PARTs before anything, batch ops with
bodies that lie about their size; each published with the hand-off of docs/shm.md and
its answer waited for (5 s at most). Half its rings ask for groups at attach, and every
ok FIND answer must say by its GROUPS flag that it carries them exactly then. Every
fourth ring it ends with a broken protocol (head beyond capacity, or head past a slot
not ready) and then must see itself dropped.
Prints how many commands were answered and whether it was dropped.
"""

from __future__ import annotations

import random
import struct
import sys

from dq.shm import _atomics as at
from dq.shm.attach import attach
from dq.shm.command_ring import FLAG_GROUPS

SLOT = 2080
CAPACITY = 8


def main() -> int:
    data, seed, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rnd = random.Random(seed)
    answered = 0
    dropped = 0
    while answered < count:
        groups = rnd.random() < 0.5
        a = attach(data, queue="hostile", capacity=CAPACITY, timeout_s=10, groups=groups)
        mm = a.mm
        head = 0
        for _ in range(rnd.randint(5, 60)):
            burst = rnd.randint(1, CAPACITY - 2)  # and a STATS may follow: never full
            first = head
            for _ in range(burst):
                off = 24 + SLOT * head
                op = rnd.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 9, 10, rnd.randint(11, 255)])
                key = rnd.randbytes(16)
                if op in (9, 10) and rnd.random() < 0.5:  # a count and a size that may lie
                    key = struct.pack("<IIQ", rnd.randint(0, 40), rnd.randint(0, 3000), 0)
                if op == 2:  # a FIND that does not long-poll: answers come within 5 s
                    key = key[:4] + bytes(4) + key[8:]
                    if rnd.random() < 0.5:  # one the server runs: deliveries to answer
                        key = struct.pack("<IIQ", rnd.randint(0, 5), 0, rnd.randint(1, 60_000))
                value = rnd.randbytes(rnd.choice([0, 3, 8, 16, 50, 1024]))
                size = rnd.choice([len(value)] * 6 + [1025, 0xFFFFFFFF])
                mm[off] = 0
                mm[off + 1] = op
                mm[off + 2 : off + 18] = key
                struct.pack_into("<I", mm, off + 18, size)
                mm[off + 22 : off + 22 + len(value)] = value
                struct.pack_into("<I", mm, off + 1046, 0)
                mm[off + 2074] = 0
                at.store_u8(mm, off, 1)
                head = (head + 1) % CAPACITY
            if mm[24 + SLOT * ((head - 1) % CAPACITY) + 1] == 8:  # a PART last: close it
                off = 24 + SLOT * head
                mm[off + 1] = 5
                struct.pack_into("<I", mm, off + 18, 0)
                mm[off + 2074] = 0
                at.store_u8(mm, off, 1)
                head = (head + 1) % CAPACITY
            at.store_u64(mm, 0, head)
            at.futex_wake(mm, 0)
            last = 24 + SLOT * ((head - 1) % CAPACITY)
            if at.spin_wait_u8(mm, last + 2074, 0, 5.0, 0.0) is None:
                print(f"no answer from the server (slots {first}..{head})", file=sys.stderr)
                return 1
            answered += (head - first) % CAPACITY
            for i in range((head - first) % CAPACITY):  # every answer is whole
                off = 24 + SLOT * ((first + i) % CAPACITY)
                (rsize,) = struct.unpack_from("<I", mm, off + 1046)
                if mm[off + 2074] != 1 or not 4 <= rsize <= 1024:
                    print(f"slot {(first + i) % CAPACITY}: answer size {rsize}", file=sys.stderr)
                    return 1
                status, flags = mm[off + 1050], mm[off + 1051]
                if mm[off + 1] == 2 and status == 0 and bool(flags & FLAG_GROUPS) != groups:
                    print(f"a FIND answered flags {flags} (groups {groups})", file=sys.stderr)
                    return 1
        if rnd.random() < 0.25:
            if rnd.random() < 0.5:
                at.store_u64(mm, 0, CAPACITY + rnd.randint(0, 1 << 40))
            else:
                at.store_u8(mm, 24 + SLOT * head, 0)
                at.store_u64(mm, 0, (head + 1) % CAPACITY)
            at.futex_wake(mm, 0)
            a.sock.settimeout(5.0)
            if a.sock.recv(1) != b"":
                print("the server did not drop a ring that broke the protocol", file=sys.stderr)
                return 1
            dropped += 1
        a.close()
    print(answered, dropped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
