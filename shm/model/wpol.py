"""The WPOL submission ring's push/pop and free-list protocols as threads for ``explore``.

Each protocol is written step for step as in the original design (docs/shm.md) or as fixed in
``shm/submission_ring.py``; docs/shm.md ("Submission ring: protocol fixes") explains
every difference. ``check_ring`` and ``check_free_list`` are the correctness conditions:
every push that reported success is popped exactly once, nothing else is popped, and a
quiescent drain leaves the ring empty (no wedge); no slot is ever held by two owners and
the free list ends up holding every slot once.

Memory map of the ring model: cell 0 head, cell 1 tail, cell 2 the "scan" flag (ours,
a reserved header word), cells 3.. the ring entries.
Memory map of the free-list model: cell 0 the free-list head, then per slot its next
pointer, then per slot its holder (0 = nobody). ``END`` is the original design's 0xFFFFFFFF.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator, Sequence
from typing import Any, Literal

from dq.shm.model.explore import Exploration, Memory, Op, Thread, explore, run_solo

__all__ = [
    "END",
    "PopStyle",
    "PushStyle",
    "check_free_list",
    "explore_free_list",
    "explore_ring",
]

HEAD, TAIL, SCAN, ENTRY0 = 0, 1, 2, 3
END = 0xFFFFFFFF

PushStyle = Literal["original", "fixed"]
PopStyle = Literal["original", "fixed"]
Gen = Generator[Op, Any, Any]


def original_push(cap: int, value: int) -> Gen:
    """Original steps 1-10: entry CAS, then an unconditional tail increment."""
    mask = cap - 1
    while True:
        t = yield ("load", TAIL)
        h = yield ("load", HEAD)
        if t - h >= cap:
            return False
        e = yield ("load", ENTRY0 + (t & mask))
        if e != 0:
            return False
        if (yield ("cas", ENTRY0 + (t & mask), 0, value)):
            yield ("add", TAIL, 1)
            return True


def fixed_push(cap: int, value: int) -> Gen:
    """Ours: entry CAS, then tail CAS t -> t+1 (never a blind increment), and anyone who
    finds a written entry at the tail helps the tail past it. If the tail CAS fails,
    either a helper moved the tail past our entry (fine) or our entry CAS was stale and
    landed a lap ahead of the tail ("write-ahead"); we raise the scan flag so that the
    consumer, finding the ring empty, looks for it and skips the tail up to it."""
    mask = cap - 1
    while True:
        t = yield ("load", TAIL)
        h = yield ("load", HEAD)
        if t - h >= cap:
            return False
        e = yield ("load", ENTRY0 + (t & mask))
        if e != 0:
            yield ("cas", TAIL, t, t + 1)
            continue
        if (yield ("cas", ENTRY0 + (t & mask), 0, value)):
            if not (yield ("cas", TAIL, t, t + 1)):
                yield ("store", SCAN, 1)
            return True


def dying_push(cap: int, value: int) -> Gen:
    """Our push by a producer killed right after its entry CAS (before the tail CAS)."""
    mask = cap - 1
    while True:
        t = yield ("load", TAIL)
        h = yield ("load", HEAD)
        if t - h >= cap:
            return False
        e = yield ("load", ENTRY0 + (t & mask))
        if e != 0:
            yield ("cas", TAIL, t, t + 1)
            continue
        if (yield ("cas", ENTRY0 + (t & mask), 0, value)):
            return True


def original_pop(cap: int) -> Gen:
    """Original steps 1-9: head CAS, then clear the entry."""
    mask = cap - 1
    while True:
        h = yield ("load", HEAD)
        t = yield ("load", TAIL)
        if h >= t:
            return 0
        e = yield ("load", ENTRY0 + (h & mask))
        if e == 0:
            return 0
        if (yield ("cas", HEAD, h, h + 1)):
            yield ("store", ENTRY0 + (h & mask), 0)
            return e


def fixed_pop(cap: int, backstop: bool = False) -> Gen:
    """Ours (one consumer): clear the entry, then publish the new head (so a producer
    that sees room never finds the entry still set); skip an empty entry below the tail
    (the tail was skipped over it); when the ring looks empty, help a written tail entry
    along, and if the scan flag is up, skip the tail over empty entries up to the first
    written one (a write-ahead). ``backstop`` scans even with the flag down: the
    server's periodic idle scan, for a producer killed before it raised the flag."""
    mask = cap - 1
    while True:
        h = yield ("load", HEAD)
        t = yield ("load", TAIL)
        if h >= t:
            e = yield ("load", ENTRY0 + (t & mask))
            if e != 0:
                yield ("cas", TAIL, t, t + 1)
                continue
            if not (yield ("load", SCAN)) and not backstop:
                return 0
            yield ("store", SCAN, 0)
            ahead = False
            for k in range(1, cap):
                if (yield ("load", ENTRY0 + ((t + k) & mask))) != 0:
                    ahead = True
                    break
            if not ahead:
                return 0
            yield ("store", SCAN, 1)  # keep scanning until the tail reaches it
            yield ("cas", TAIL, t, t + 1)
            continue
        e = yield ("load", ENTRY0 + (h & mask))
        if e != 0:
            yield ("store", ENTRY0 + (h & mask), 0)
        yield ("store", HEAD, h + 1)
        if e != 0:
            return e


_PUSH: dict[str, Callable[[int, int], Gen]] = {"original": original_push, "fixed": fixed_push}
_POP: dict[str, Callable[[int], Gen]] = {"original": original_pop, "fixed": fixed_pop}


def _producer(push: Callable[[int, int], Gen], cap: int, values: Sequence[int]) -> Thread:
    def run() -> Gen:
        pushed = []
        for value in values:
            for _attempt in range(2):  # a caller retries a refused push once
                if (yield from push(cap, value)):
                    pushed.append(value)
                    break
        return ("producer", tuple(pushed))

    return run


def _consumer(pop: Callable[[int], Gen], cap: int, attempts: int) -> Thread:
    def run() -> Gen:
        popped = []
        for _ in range(attempts):
            value = yield from pop(cap)
            if value != 0:
                popped.append(value)
        return ("consumer", tuple(popped))

    return run


def _drain(pop: Callable[[int], Gen], cap: int, limit: int) -> Thread:
    def run() -> Gen:
        popped = []
        for _ in range(limit):
            value = yield from pop(cap)
            if value == 0:
                break
            popped.append(value)
        return tuple(popped)

    return run


def explore_ring(
    push: PushStyle,
    pop: PopStyle,
    cap: int,
    producers: Sequence[Sequence[int]],
    consumers: int = 1,
    pop_attempts: int = 2,
    dying: int = 0,
) -> Exploration:
    """Every interleaving of ``producers`` (each pushes its values in order; the first
    ``dying`` of them are killed between entry CAS and tail CAS) and ``consumers`` (each
    tries ``pop_attempts`` pops), then a quiescent drain."""
    push_fn, pop_fn = _PUSH[push], _POP[pop]
    threads = [
        _producer(dying_push if i < dying else push_fn, cap, vals)
        for i, vals in enumerate(producers)
    ]
    threads += [_consumer(pop_fn, cap, pop_attempts) for _ in range(consumers)]
    total = sum(len(v) for v in producers)
    memory: Memory = (0, 0, 0) + (0,) * cap

    def check(mem: Memory, results: tuple[Any, ...]) -> str | None:
        drain_pop = pop_fn
        if dying and pop == "fixed":
            drain_pop = lambda cap: fixed_pop(cap, backstop=True)  # noqa: E731
        end_mem, drained = run_solo(_drain(drain_pop, cap, total + cap + 2), mem)
        pushed = Counter(v for kind, vals in results if kind == "producer" for v in vals)
        popped = Counter(v for kind, vals in results if kind == "consumer" for v in vals)
        popped.update(drained)
        dup = [v for v, n in popped.items() if n > 1]
        if dup:
            return f"duplicated entries {dup}"
        lost = sorted(set(pushed) - set(popped))
        if lost:
            return f"lost entries {lost} (ring after drain {end_mem})"
        ghost = sorted(set(popped) - set(pushed))
        if ghost:
            return f"popped entries that were never pushed {ghost}"
        if end_mem[HEAD] != end_mem[TAIL] or any(end_mem[ENTRY0:]):
            return f"drained ring is not empty: {end_mem}"
        return None

    return explore(threads, memory, check)


# ---- free list -------------------------------------------------------------------------


def _alloc(tagged: bool, nslots: int, tid: int) -> Gen:
    """Original allocation steps 1-4 (plus the holder check); ``tagged`` CASes (index, tag)."""
    while True:
        head = yield ("load", 0)
        index = head[0] if tagged else head
        if index == END:
            return None
        nxt = yield ("load", 1 + index)
        new = (nxt, head[1] + 1) if tagged else nxt
        if (yield ("cas", 0, head, new)):
            break
    # The original design reuses "next" as the task id once allocated.
    yield ("store", 1 + index, 100 + tid)
    if not (yield ("cas", 1 + nslots + index, 0, tid)):
        return ("double", index)
    return index


def _free(tagged: bool, nslots: int, index: int) -> Gen:
    """Original deallocation steps 1-4 (the holder is cleared before the slot is published)."""
    yield ("store", 1 + nslots + index, 0)
    while True:
        head = yield ("load", 0)
        yield ("store", 1 + index, head[0] if tagged else head)
        new = (index, head[1] + 1) if tagged else index
        if (yield ("cas", 0, head, new)):
            return


def explore_free_list(tagged: bool, nslots: int = 3, threads: int = 2) -> Exploration:
    """Each thread allocates two slots and frees them; no slot may have two holders."""

    def worker(tid: int) -> Thread:
        def run() -> Gen:
            got = []
            for _ in range(2):
                index = yield from _alloc(tagged, nslots, tid)
                if isinstance(index, tuple):
                    return index
                if index is not None:
                    got.append(index)
            for index in reversed(got):
                yield from _free(tagged, nslots, index)
            return None

        return run

    head: Any = (0, 0) if tagged else 0
    nexts = (*range(1, nslots), END)
    memory: Memory = (head, *nexts) + (0,) * nslots
    return explore(
        [worker(t + 1) for t in range(threads)],
        memory,
        lambda mem, results: check_free_list(mem, results, tagged, nslots),
    )


def check_free_list(mem: Memory, results: tuple[Any, ...], tagged: bool, nslots: int) -> str | None:
    """No double allocation, and the final free list holds every slot exactly once."""
    for result in results:
        if result is not None:
            return f"slot {result[1]} allocated to two holders at once"
    index = mem[0][0] if tagged else mem[0]
    seen: list[int] = []
    while index != END and len(seen) <= nslots:
        seen.append(index)
        index = mem[1 + index]
        if not isinstance(index, int) or (index != END and not 0 <= index < nslots):
            return f"free list points at a non-slot {index!r} after {seen}"
    if sorted(seen) != list(range(nslots)):
        return f"free list holds {seen}, not every slot once"
    return None
