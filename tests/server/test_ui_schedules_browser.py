"""The dashboard's Schedules page in a real headless Chromium against a live ``dq serve``
(``tests/server/test_ui_browser.py``'s way): an operator sees each schedule's next run,
last tick fired, count and lateness change as it fires, and pauses, resumes and runs one;
the effects are checked through the HTTP API, not through the page."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.browser import screenshot
from tests.server.live import LiveServer, live_server
from tests.server.test_ui_browser import (  # noqa: F401 (fixtures)
    REFRESH,
    browser,
    confirm,
    eventually,
    expect,
    page,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def server(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:  # noqa: F811
    env = {"DQ_SCHEDULE_MIN_EVERY_MS": "200"}
    with live_server(tmp_path_factory.mktemp("dq-ui-schedules") / "data", env=env) as s:
        yield s


@pytest.fixture
def api(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


def schedule(api: httpx.Client, queue: str, name: str) -> dict[str, Any]:
    r = api.get(f"/v1/queues/{queue}/schedules/{name}")
    r.raise_for_status()
    doc: dict[str, Any] = r.json()
    return doc


def items(api: httpx.Client, queue: str) -> list[dict[str, Any]]:
    r = api.get(f"/v1/queues/{queue}/items", params={"limit": 1000})
    r.raise_for_status()
    got: list[dict[str, Any]] = r.json()["items"]
    return got


def test_schedules_page_shows_runs_and_pauses_resumes_and_runs(
    page: Any,  # noqa: F811
    api: httpx.Client,
    server: LiveServer,
    tmp_path: Path,
) -> None:
    r = api.put(
        "/v1/queues/nightly/schedules/report",
        json={"cron": "0 3 * * *", "timezone": "Europe/Berlin"},
    )
    assert r.status_code == 200, r.text
    r = api.put("/v1/queues/pulse/schedules/beat", json={"every_ms": 500})
    assert r.status_code == 200, r.text
    page.goto(server.url + "/ui/" + REFRESH + "#/schedules")
    row = page.locator('#schedules tr[data-schedule="pulse/beat"]')
    expect()(row).to_be_visible()
    nightly = page.locator('#schedules tr[data-schedule="nightly/report"]')
    expect()(nightly).to_contain_text("0 3 * * *")
    expect()(nightly).to_contain_text("Europe/Berlin")
    expect()(nightly.locator('td[data-col="last"]')).to_have_text("\u2013")  # none yet
    # it fires: the count, the last tick and the lateness appear without a reload
    eventually(lambda: schedule(api, "pulse", "beat")["fired"] >= 3)
    expect()(row.locator('td[data-col="fired"]')).not_to_have_text("0")
    expect()(row.locator('td[data-col="lateness"]')).to_contain_text("ms")
    expect()(row.locator('td[data-col="next"]')).to_contain_text("(in ")
    screenshot(page, "schedules", tmp_path)

    row.locator('button[data-action="pause"]').click()
    page.click("#confirm-cancel")  # cancelling does nothing
    assert schedule(api, "pulse", "beat")["paused"] is False
    row.locator('button[data-action="pause"]').click()
    confirm(page)
    eventually(lambda: schedule(api, "pulse", "beat")["paused"] is True)
    expect()(row).to_contain_text("paused")
    fired = schedule(api, "pulse", "beat")["fired"]
    count = len(items(api, "pulse"))

    row.locator('button[data-action="run"]').click()
    confirm(page)
    eventually(lambda: len(items(api, "pulse")) == count + 1)
    assert schedule(api, "pulse", "beat")["fired"] == fired  # a run is not a tick

    row.locator('button[data-action="resume"]').click()
    confirm(page)
    eventually(lambda: schedule(api, "pulse", "beat")["fired"] > fired)
    expect()(row.locator('button[data-action="pause"]')).to_be_visible()
