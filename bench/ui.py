"""Dashboard render times in headless Chromium, with many queues and with one large queue.

    python -m bench.ui [--queues 1000] [--items 1000000] [--runs 5]

Builds a data directory with the engine directly (fsync never): ``--queues`` small queues
(a few due, delayed and leased items each) and one queue ``big`` of ``--items`` items of
64 bytes (half due, half delayed). Then serves it with ``dq serve`` and drives Debian's
Chromium through Playwright (tests/server/browser.py) to time, from navigation to the
last row drawn:

- the overview's first full render (all queues fetched in one request, first page drawn);
- a re-sort of the overview (click the name header: the order flips, all rows re-sorted);
- the browse view of ``big``: first page of items, then the next page.

Also prints the server's latency for ``GET /v1/queues`` and one browse page, so render
time and fetch time can be told apart. Prints medians and maxima over ``--runs``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from dq.storage import Engine, EngineConfig, NewItem
from tests.server.browser import CHROMIUM, LAUNCH_ARGS
from tests.server.live import LiveServer

BATCH = 1000


def build(root: Path, queues: int, items: int) -> float:
    """Fill ``root``; returns the seconds it took."""
    t0 = time.monotonic()
    value = os.urandom(32).hex().encode()  # 64 bytes
    with Engine.open(root, EngineConfig(fsync="never", max_batch=BATCH)) as engine:
        for n in range(queues):
            name = f"queue-{n:05d}"
            engine.enqueue(name, [NewItem(value)] * (1 + n % 7))
            engine.enqueue(name, [NewItem(value, delay_ms=3_600_000)] * (n % 3))
        for start in range(0, items, BATCH):
            batch = [
                NewItem(value, delay_ms=0 if (start + k) % 2 else 3_600_000)
                for k in range(min(BATCH, items - start))
            ]
            engine.enqueue("big", batch)
        engine.freeze("big")  # into a segment file, as a long-lived backlog would be
    return time.monotonic() - t0


def timed(runs: int, once: Callable[[], float]) -> tuple[float, float]:
    times = [once() for _ in range(runs)]
    return statistics.median(times), max(times)


def fetch_ms(url: str, runs: int) -> tuple[float, float]:
    with httpx.Client(timeout=60) as http:

        def once() -> float:
            t0 = time.perf_counter()
            http.get(url).raise_for_status()
            return (time.perf_counter() - t0) * 1000

        return timed(runs, once)


def measure(url: str, queues: int, runs: int) -> dict[str, tuple[float, float]]:
    from playwright.sync_api import sync_playwright

    out: dict[str, tuple[float, float]] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        page: Any = browser.new_page(viewport={"width": 1280, "height": 800})
        page.set_default_timeout(120_000)
        total = f"{queues + 1:,}"

        def overview() -> float:
            page.goto("about:blank")
            t0 = time.perf_counter()
            page.goto(url + "/ui/?refresh=600000")
            page.wait_for_selector("#queues tbody tr:nth-child(100)[data-queue]")
            page.wait_for_function(
                "t => document.querySelector('[data-total=queues] .value')?.textContent === t",
                arg=total,
            )
            return (time.perf_counter() - t0) * 1000

        out["overview first render"] = timed(runs, overview)

        def resort() -> float:
            first = page.locator("#queues tbody tr").first.get_attribute("data-queue")
            t0 = time.perf_counter()
            page.click('#queues th[data-key="name"]')  # flips the order each time
            page.wait_for_function(
                "f => document.querySelector('#queues tbody tr').dataset.queue !== f", arg=first
            )
            return (time.perf_counter() - t0) * 1000

        out["overview re-sort"] = timed(runs, resort)

        def browse() -> float:
            page.goto("about:blank")
            t0 = time.perf_counter()
            page.goto(url + "/ui/?refresh=600000#/queue/big/items")
            page.wait_for_selector("table.items tbody tr:nth-child(50)[data-id]")
            return (time.perf_counter() - t0) * 1000

        out["browse big: first page"] = timed(runs, browse)

        def next_page() -> float:
            last = page.locator("table.items tbody tr").last.get_attribute("data-id")
            t0 = time.perf_counter()
            page.click("#next")
            page.wait_for_function(
                "l => document.querySelector('table.items tbody tr')?.dataset.id > l",
                arg=last,
            )
            return (time.perf_counter() - t0) * 1000

        out["browse big: next page"] = timed(runs, next_page)
        browser.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dq-bench-ui-") as tmp:
        root = Path(tmp) / "data"
        built = build(root, args.queues, args.items)
        print(f"built {args.queues:,} queues + 1 queue of {args.items:,} items in {built:.0f} s")
        server = LiveServer(root, fsync="never").start(timeout=600)
        try:
            rows = {
                "GET /v1/queues (server)": fetch_ms(server.url + "/v1/queues", args.runs),
                "GET browse page of big (server)": fetch_ms(
                    server.url + "/v1/queues/big/items?state=all&limit=50", args.runs
                ),
                **measure(server.url, args.queues, args.runs),
            }
        finally:
            server.terminate(timeout=60)
    load = os.getloadavg()
    print(
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} cores, "
        f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )
    print(f"{'what':<36} {'median ms':>10} {'max ms':>10}")
    for name, (median, worst) in rows.items():
        print(f"{name:<36} {median:>10.0f} {worst:>10.0f}")


if __name__ == "__main__":
    main()
