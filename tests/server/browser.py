"""A headless Chromium for the dashboard tests, driven by Playwright's Python package.

The browser is Debian's ``chromium`` (``DQ_CHROMIUM`` to point elsewhere); Playwright's
own browser downloads are never used. Without Chromium or the ``playwright`` package the
tests are skipped with a reason that says what is missing. Pages record their JavaScript
errors; a test fails if the page threw. Screenshots go to ``DQ_UI_SCREENSHOTS`` when set
(docs/img/ is made from them), else to the test's temporary directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["CHROMIUM", "LAUNCH_ARGS", "browser_or_skip", "new_page", "screenshot"]

CHROMIUM = os.environ.get("DQ_CHROMIUM", "/usr/bin/chromium")
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def browser_or_skip() -> Iterator[Any]:
    """Yield a launched Chromium, or skip the calling tests saying why."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"browser tests skipped: no Chromium at {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("browser tests skipped: the playwright package is not installed")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def new_page(browser: Any, errors: list[str]) -> Any:
    context = browser.new_context(viewport={"width": 1280, "height": 760})
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return page


def screenshot(page: Any, name: str, fallback: Path) -> Path:
    folder = Path(os.environ.get("DQ_UI_SCREENSHOTS") or fallback)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    page.screenshot(path=str(path))
    return path
