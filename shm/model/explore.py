"""A tiny explicit-state model checker: every interleaving of atomic memory steps.

A thread is a generator that yields one ``Op`` (load, store, cas, fetch-add) per atomic
step and receives the step's result; its return value is the thread's result. Memory is
sequentially consistent (the real rings use acquire/release atomics plus full fences
where the docs say so). A thread's local state is identified by the history of results
it has observed, so the generator itself never needs copying: a step replays the
history into a fresh generator. States are ``(memory, histories)`` and are visited once.

Invariant kept: every reachable terminal state is handed to ``check``; the exploration
stops at the first violation and reports the schedule (thread indices) that reached it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Exploration", "Op", "Thread", "explore"]

# ("load", addr) | ("store", addr, value) | ("cas", addr, expected, new) | ("add", addr, delta)
Op = tuple[Any, ...]
Thread = Callable[[], Generator[Op, Any, Any]]
Memory = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Exploration:
    """What ``explore`` found: states visited, terminal states checked, first violation."""

    states: int
    terminals: int
    violation: str | None
    schedule: tuple[int, ...]


class _Runner:
    """Replays one thread's history to find its next op (memoised: histories repeat)."""

    def __init__(self, thread: Thread) -> None:
        self._thread = thread
        self._cache: dict[tuple[Any, ...], tuple[bool, Any]] = {}

    def next(self, history: tuple[Any, ...]) -> tuple[bool, Any]:
        """(False, op) if the thread wants another step, (True, result) if it returned."""
        hit = self._cache.get(history)
        if hit is not None:
            return hit
        gen = self._thread()
        try:
            out: tuple[bool, Any] = (False, next(gen))
            for value in history:
                out = (False, gen.send(value))
        except StopIteration as stop:
            out = (True, stop.value)
        self._cache[history] = out
        return out


def _apply(mem: Memory, op: Op) -> tuple[Memory, Any]:
    kind, addr = op[0], op[1]
    if kind == "load":
        return mem, mem[addr]
    cells = list(mem)
    if kind == "store":
        cells[addr] = op[2]
        return tuple(cells), None
    if kind == "cas":
        if mem[addr] == op[2]:
            cells[addr] = op[3]
            return tuple(cells), True
        return mem, False
    if kind == "add":
        cells[addr] = mem[addr] + op[2]
        return tuple(cells), mem[addr]
    raise ValueError(f"unknown op {op!r}")


def run_solo(thread: Thread, mem: Memory) -> tuple[Memory, Any]:
    """Run one thread alone to completion (used for the quiescent drain after a run)."""
    gen = thread()
    try:
        op = next(gen)
        while True:
            mem, result = _apply(mem, op)
            op = gen.send(result)
    except StopIteration as stop:
        return mem, stop.value


def explore(
    threads: Sequence[Thread],
    memory: Memory,
    check: Callable[[Memory, tuple[Any, ...]], str | None],
    max_states: int = 2_000_000,
) -> Exploration:
    """Depth-first search of every interleaving; ``check(memory, results)`` at each end.

    ``check`` returns ``None`` when the terminal state is correct, else a description.
    Raises ``RuntimeError`` past ``max_states`` so a model that grew too big fails loudly
    instead of silently checking less.
    """
    runners = [_Runner(t) for t in threads]
    start = (memory, tuple(() for _ in threads))
    seen = {start}
    stack: list[tuple[Memory, tuple[tuple[Any, ...], ...], tuple[int, ...]]] = [
        (memory, start[1], ())
    ]
    terminals = 0
    while stack:
        mem, hists, schedule = stack.pop()
        results: list[Any] = []
        moved = False
        for i, runner in enumerate(runners):
            finished, value = runner.next(hists[i])
            if finished:
                results.append(value)
                continue
            moved = True
            new_mem, result = _apply(mem, value)
            new_hists = (*hists[:i], (*hists[i], result), *hists[i + 1 :])
            key = (new_mem, new_hists)
            if key in seen:
                continue
            seen.add(key)
            if len(seen) > max_states:
                raise RuntimeError(f"model exceeded {max_states} states")
            stack.append((new_mem, new_hists, (*schedule, i)))
        if not moved:
            terminals += 1
            problem = check(mem, tuple(results))
            if problem is not None:
                return Exploration(len(seen), terminals, problem, schedule)
    return Exploration(len(seen), terminals, None, ())
