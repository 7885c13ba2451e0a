"""The dashboard in a real headless Chromium against a live ``dq serve``.

Each test does what an operator would (click, confirm, type) and checks the effect
through the HTTP API, not through the page. Skipped, with the reason, when Chromium or
the playwright package is missing (tests/server/browser.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.browser import browser_or_skip, new_page, screenshot
from tests.server.live import LiveServer, live_server

# integration: a live dq serve and a browser
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SERVER_ENV = {"DQ_HISTORY_INTERVAL_MS": "200", "DQ_EXPIRE_INTERVAL_MS": "50"}
REFRESH = "?refresh=400"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from browser_or_skip()


@pytest.fixture(scope="module")
def server(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("dq-ui") / "data", env=SERVER_ENV) as s:
        yield s


@pytest.fixture
def api(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    errors: list[str] = []
    p = new_page(browser, errors)
    yield p
    p.context.close()
    assert not errors, errors


@pytest.fixture
def shot(tmp_path: Path) -> Callable[[Any, str], Path]:
    return lambda page, name: screenshot(page, name, tmp_path)


def expect() -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect


def enqueue(api: httpx.Client, queue: str, n: int, **item: Any) -> list[int]:
    r = api.post(f"/v1/queues/{queue}/items", json={"items": [{"value": "v", **item}] * n})
    r.raise_for_status()
    return [i["id"] for i in r.json()["items"]]


def queue_info(api: httpx.Client, queue: str) -> dict[str, Any]:
    r = api.get(f"/v1/queues/{queue}")
    r.raise_for_status()
    info: dict[str, Any] = r.json()
    return info


def paused(api: httpx.Client, queue: str) -> bool:
    info = queue_info(api, queue)
    return bool(info.get("paused", info["stats"].get("paused")))


def cell(page: Any, queue: str, col: str) -> Any:
    return page.locator(f'#queues tr[data-queue="{queue}"] td[data-col="{col}"]')


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    give_up = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < give_up, "condition not met in time"
        time.sleep(0.05)


def confirm(page: Any, typed: str | None = None) -> None:
    dialog = page.locator("dialog#confirm")
    expect()(dialog).to_be_visible()
    if typed is not None:
        page.fill("#confirm-typed", typed)
    page.click("#confirm-ok")
    expect()(dialog).to_be_hidden()


# ------------------------------------------------------------------ overview


def test_overview_shows_the_queues_and_counts(
    page: Any, api: httpx.Client, server: LiveServer
) -> None:
    enqueue(api, "orders", 12)
    enqueue(api, "orders", 3, delay_ms=600_000)
    enqueue(api, "emails", 4)
    api.post("/v1/queues/orders/dequeue", json={"count": 2, "lease_ms": 600_000})
    page.goto(server.url + "/ui/" + REFRESH)
    expect()(cell(page, "orders", "due")).to_have_text("10")
    expect()(cell(page, "orders", "delayed")).to_have_text("3")
    expect()(cell(page, "orders", "leased")).to_have_text("2")
    expect()(cell(page, "emails", "due")).to_have_text("4")


def test_the_bare_address_opens_the_dashboard(
    page: Any, api: httpx.Client, server: LiveServer
) -> None:
    """Typing the server's address into a browser lands on the dashboard; every other
    client of ``GET /`` still gets the 405 of a path that only SQS's POST serves."""
    enqueue(api, "landing", 2)
    page.goto(server.url)
    expect()(page).to_have_url(server.url + "/ui/")
    expect()(cell(page, "landing", "due")).to_have_text("2")
    for accept in (None, "*/*", "application/json", "text/html;q=0"):
        headers = {} if accept is None else {"Accept": accept}
        r = api.get("/", headers=headers)
        assert (r.status_code, r.json()["error"]) == (405, "method_not_allowed"), accept
        assert r.headers["allow"] == "POST"


def test_a_count_changes_without_reloading(
    page: Any, api: httpx.Client, server: LiveServer
) -> None:
    enqueue(api, "live", 1)
    page.goto(server.url + "/ui/" + REFRESH)
    expect()(cell(page, "live", "due")).to_have_text("1")
    page.evaluate("window.sameDocument = true")
    enqueue(api, "live", 6)
    expect()(cell(page, "live", "due")).to_have_text("7")
    assert page.evaluate("window.sameDocument") is True  # updated in place, no reload


def test_sorting_by_a_column(page: Any, api: httpx.Client, server: LiveServer) -> None:
    enqueue(api, "zz-busiest", 50)
    page.goto(server.url + "/ui/" + REFRESH)
    page.click('#queues th[data-key="due"]')
    expect()(page.locator("#queues tbody tr").first).to_have_attribute("data-queue", "zz-busiest")
    page.click('#queues th[data-key="due"]')  # again: ascending
    expect()(page.locator("#queues tbody tr").last).to_have_attribute("data-queue", "zz-busiest")


# ------------------------------------------------------------------ one queue


def test_depth_chart_draws_the_history(
    page: Any, api: httpx.Client, server: LiveServer, shot: Any
) -> None:
    for n in range(4):  # the depth grows in steps while the server samples every 0.2 s
        enqueue(api, "charted", 5 + 5 * n)
        enqueue(api, "charted", 3, delay_ms=600_000)
        api.post("/v1/queues/charted/dequeue", json={"count": 2, "lease_ms": 600_000})
        time.sleep(0.4)
    page.goto(server.url + "/ui/" + REFRESH + "#/queue/charted")
    path = page.locator('.chart path[data-series="due"]')
    expect()(path).to_have_count(1)
    eventually(lambda: path.get_attribute("d").count("L") >= 4)
    shot(page, "queue")


def test_chart_axes_tick_at_round_numbers(page: Any, api: httpx.Client, server: LiveServer) -> None:
    """Five due items: the depth chart's y axis reads 0, 2, 4, 6 (steps of 1, 2 or 5
    times a power of ten), not quarters of its top (1.25, 2.5, 3.75); the rates chart's
    ticks are round too, whatever its fractional top."""
    enqueue(api, "ticked", 5)
    page.goto(server.url + "/ui/" + REFRESH + "#/queue/ticked")
    charts = page.locator(".chart")
    depth = charts.nth(0).locator("text.axis.y")

    def labels(chart: Any) -> list[str]:
        return [t.strip() for t in chart.all_text_contents()]

    eventually(lambda: labels(depth) == ["0", "2", "4", "6"])
    rates = [float(v) for v in labels(charts.nth(1).locator("text.axis.y"))]
    step = rates[1]
    assert rates == [round(i * step, 9) for i in range(len(rates))], rates
    assert f"{step:e}"[0] in "125" and f"{step:e}"[1:4] == ".00", rates  # 1, 2 or 5 x 10^k


def test_charts_for_all_queues_and_one(page: Any, api: httpx.Client, server: LiveServer) -> None:
    enqueue(api, "plotted", 4)
    time.sleep(0.5)
    page.goto(server.url + "/ui/" + REFRESH + "#/charts")
    charts = page.locator("#plots .chart")
    expect()(charts).to_have_count(2)
    expect()(charts.first.locator('path[data-series="due"]')).to_have_count(1)
    page.select_option("#pick", "plotted")
    expect()(page.locator("#plots .chart h3").first).to_have_text("Depth by state")
    path = page.locator('#plots path[data-series="due"]')
    eventually(lambda: path.count() == 1 and path.get_attribute("d").count("L") >= 1)
    page.select_option("#window", "900")
    expect()(charts).to_have_count(2)


def test_settings_are_edited(page: Any, api: httpx.Client, server: LiveServer, shot: Any) -> None:
    enqueue(api, "configured", 1)
    page.goto(server.url + "/ui/#/queue/configured/settings")
    page.fill("#s-lease", "45000")
    page.fill("#s-max", "4")
    page.fill("#s-dlq", "configured-dead")
    page.fill("#s-dedup", "60000")
    shot(page, "settings")
    page.click("#settings button[type=submit]")
    expect()(page.locator("#saved")).to_have_text("saved")
    config = queue_info(api, "configured")["config"]
    assert config["default_lease_ms"] == 45000 and config["max_deliveries"] == 4
    assert config["dead_letter_queue"] == "configured-dead"
    assert config["dedup_window_ms"] == 60000


def test_delivery_rules_are_set_and_the_busiest_groups_shown(
    page: Any, api: httpx.Client, server: LiveServer, shot: Any
) -> None:
    """The settings form sets the delivery rules (docs/delivery.md); the Groups tab and
    the "Held back" card show what they hold back; a refused rule says why."""
    enqueue(api, "ruled", 1)
    page.goto(server.url + "/ui/" + REFRESH + "#/queue/ruled/settings")
    page.fill("#s-group-limit", "1")
    page.fill("#s-leased-limit", "10")
    page.check("#s-fair")
    page.fill("#s-rate", "50")
    page.check("#s-per-group")
    page.click("#settings button[type=submit]")
    expect()(page.locator("#saved")).to_have_text("saved")
    config = queue_info(api, "ruled")["config"]
    assert (config["group_limit"], config["leased_limit"], config["fair"]) == (1, 10, True)
    assert config["rate_limit"] == {"per_second": 50.0, "burst": 50, "per_group": True}
    page.fill("#s-group-limit", "0")
    page.click("#settings button[type=submit]")
    expect()(page.locator("#saved")).to_contain_text("not saved: group_limit must be between")
    assert queue_info(api, "ruled")["config"]["group_limit"] == 1
    enqueue(api, "ruled", 3, group="customer-42")
    enqueue(api, "ruled", 1, group="customer-7")
    taken = api.post("/v1/queues/ruled/dequeue", json={"count": 10, "lease_ms": 60_000})
    assert {i["group"] for i in taken.json()["items"]} == {None, "customer-42", "customer-7"}
    page.goto(server.url + "/ui/" + REFRESH + "#/queue/ruled/groups")
    row = page.locator('#groups tr[data-group="customer-42"]')
    expect()(row.locator('[data-col="leased"]')).to_have_text("1")
    expect()(row.locator('[data-col="held"]')).to_have_text("2")
    expect()(page.locator('[data-stat="held back"] .value')).to_have_text("2")
    shot(page, "groups")
    api.put("/v1/queues/ruled", json={}).raise_for_status()  # the rules dropped
    expect()(page.locator('[data-stat="held back"]')).to_have_count(0)


def test_a_refused_save_says_so_beside_the_form(
    page: Any, api: httpx.Client, server: LiveServer
) -> None:
    """A save the server refuses never shows the "saved" of an earlier save: the note
    beside Save says why, and stays after the status line has moved on to a refresh."""
    enqueue(api, "refused-save", 1)
    page.goto(server.url + "/ui/" + REFRESH + "#/queue/refused-save/settings")
    page.fill("#s-lease", "45000")
    page.click("#settings button[type=submit]")
    expect()(page.locator("#saved")).to_have_text("saved")
    page.fill("#s-lease", "99999999999")  # longer than the longest lease the server allows
    page.click("#settings button[type=submit]")
    expect()(page.locator("#saved")).to_contain_text("not saved: default_lease_ms must be between")
    expect()(page.locator("#status")).to_contain_text("updated")  # a refresh came since
    expect()(page.locator("#saved")).to_contain_text("not saved")
    assert queue_info(api, "refused-save")["config"]["default_lease_ms"] == 45000


def test_pause_and_resume_with_confirmation(
    page: Any, api: httpx.Client, server: LiveServer
) -> None:
    enqueue(api, "pausable", 2)
    page.goto(server.url + "/ui/" + REFRESH + "#/queue/pausable")
    page.click("#pause")
    page.click("#confirm-cancel")  # cancelling does nothing
    assert not paused(api, "pausable")
    page.click("#pause")
    confirm(page)
    eventually(lambda: paused(api, "pausable"))
    expect()(page.locator("#badges .paused")).to_be_visible()
    assert api.post("/v1/queues/pausable/dequeue", json={"count": 1}).json()["items"] == []
    page.click("#pause")  # now "Resume…"
    confirm(page)
    eventually(lambda: not paused(api, "pausable"))
    assert len(api.post("/v1/queues/pausable/dequeue", json={"count": 1}).json()["items"]) == 1


def test_a_paused_queue_shows_since_when_across_a_restart(page: Any, tmp_path: Path) -> None:
    """The queue page says since when a queue is paused: the time of the pause, kept
    on disk with it, so a restarted server shows the same time."""
    with live_server(tmp_path / "data", env=SERVER_ENV) as server:
        with httpx.Client(base_url=server.url, timeout=10) as api:
            enqueue(api, "on-hold", 1)
            since = api.post("/v1/queues/on-hold/pause").json()["stats"]["paused_since"]
        assert server.terminate() == 0
        server.start()
        page.goto(server.url + "/ui/" + REFRESH + "#/queue/on-hold")
        note = page.locator("#paused-since")
        expect()(note).to_contain_text(f"since {local_time(since)} (")
        expect()(note).to_contain_text("ago)")
        with httpx.Client(base_url=server.url, timeout=10) as api:
            api.post("/v1/queues/on-hold/resume").raise_for_status()
        expect()(note).to_have_count(0)  # running again: no "since"


def test_purge_needs_the_queue_name(page: Any, api: httpx.Client, server: LiveServer) -> None:
    enqueue(api, "purgeable", 7)
    page.goto(server.url + "/ui/#/queue/purgeable")
    page.click("#purge")
    expect()(page.locator("#confirm-message")).to_contain_text("purgeable")
    expect()(page.locator("#confirm-ok")).to_be_disabled()
    page.fill("#confirm-typed", "purgeabl")
    expect()(page.locator("#confirm-ok")).to_be_disabled()
    assert queue_info(api, "purgeable")["stats"]["pending"] == 7
    confirm(page, typed="purgeable")
    eventually(lambda: queue_info(api, "purgeable")["stats"]["pending"] == 0)


def test_items_are_browsed_page_by_page(page: Any, api: httpx.Client, server: LiveServer) -> None:
    ids = enqueue(api, "browsed", 120)
    page.goto(server.url + "/ui/?refresh=600000#/queue/browsed/items")  # no refresh needed
    rows = page.locator("table.items tbody tr[data-id]")
    expect()(rows).to_have_count(50)
    expect()(rows.first).to_have_attribute("data-id", str(ids[0]))
    page.click("#next")
    expect()(rows.first).to_have_attribute("data-id", str(ids[50]))
    page.click("#next")
    expect()(rows).to_have_count(20)
    expect()(page.locator("#next")).to_be_disabled()
    page.click("#prev")
    expect()(rows.first).to_have_attribute("data-id", str(ids[50]))
    page.select_option("#state", "delayed")
    expect()(page.locator("table.items tbody td.muted")).to_have_text("No items.")


def test_leased_items_about_to_expire_are_highlighted(
    page: Any, api: httpx.Client, server: LiveServer, shot: Any
) -> None:
    enqueue(api, "held", 3)
    api.post("/v1/queues/held/dequeue", json={"count": 1, "lease_ms": 8_000})
    api.post("/v1/queues/held/dequeue", json={"count": 1, "lease_ms": 600_000})
    page.goto(server.url + "/ui/" + REFRESH + "#/queue/held/leased")
    rows = page.locator("table.items tbody tr[data-id]")
    expect()(rows).to_have_count(2)
    expect()(page.locator("table.items tr.expiring")).to_have_count(1)
    shot(page, "leased")


def dead_letter(api: httpx.Client, queue: str, n: int) -> list[int]:
    """Make ``n`` items of ``queue`` fail their one allowed delivery."""
    api.put(f"/v1/queues/{queue}", json={"max_deliveries": 1}).raise_for_status()
    ids = enqueue(api, queue, n)
    got = api.post(f"/v1/queues/{queue}/dequeue", json={"count": n, "lease_ms": 50}).json()
    assert len(got["items"]) == n
    time.sleep(0.3)  # the leases run out; the next dequeue moves them to the DLQ
    eventually(
        lambda: not api.post(f"/v1/queues/{queue}/dequeue", json={"count": n}).json()["items"]
    )
    eventually(lambda: queue_info(api, f"{queue}.dlq")["stats"]["pending"] == n)
    return ids


def test_redrive_dead_letters(page: Any, api: httpx.Client, server: LiveServer, shot: Any) -> None:
    dead_letter(api, "failing", 3)
    page.goto(server.url + "/ui/" + REFRESH + "#/dead")
    expect()(
        page.locator('#dlqs tr[data-queue="failing.dlq"] td[data-col="pending"]')
    ).to_have_text("3")
    page.click('#dlqs a:text("failing.dlq")')
    rows = page.locator("table.items tbody tr[data-id]")
    expect()(rows).to_have_count(3)
    first = rows.first.get_attribute("data-id")
    page.click(f'table.items a[data-open="{first}"]')  # look at one
    expect()(page.locator(".panel.item")).to_contain_text("failing")
    shot(page, "dead-letters")
    page.click(f'button[data-redrive="{first}"]')  # redrive one
    confirm(page)
    eventually(lambda: queue_info(api, "failing")["stats"]["pending"] == 1)
    expect()(rows).to_have_count(2)
    page.click("#redrive-all")  # and the rest
    confirm(page)
    eventually(lambda: queue_info(api, "failing")["stats"]["pending"] == 3)
    assert queue_info(api, "failing.dlq")["stats"]["pending"] == 0


def local_time(ms: int) -> str:
    """A time as the dashboard prints it (the browser's local time, as this process's)."""
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d}"


def test_dead_letters_stand_out_on_the_overview(
    page: Any, api: httpx.Client, server: LiveServer, shot: Any
) -> None:
    """A Dead letters card totals what waits in every dead-letter queue, stands out once
    there is one and leads to the Dead letters view; so does a queue's dead-letter count."""
    page.goto(server.url + "/ui/" + REFRESH)
    card = page.locator('#totals .card[data-total="dead letters"]')
    before = int(card.locator(".value").inner_text().replace(",", ""))
    dead_letter(api, "carded", 2)
    expect()(card.locator(".value")).to_have_text(str(before + 2))
    expect()(card).to_have_class("card alert")
    expect()(cell(page, "carded", "dead").locator("span.alert")).to_have_text("2")
    enqueue(api, "calm", 1)
    expect()(cell(page, "calm", "dead")).to_have_text("\u2013")  # no dead-letter queue
    shot(page, "overview")
    card.click()
    expect()(
        page.locator('#dlqs tr[data-queue="carded.dlq"] td[data-col="pending"] span.alert')
    ).to_have_text("2")


def test_dead_letter_tab_shows_when_each_died_and_its_value(
    page: Any, api: httpx.Client, server: LiveServer
) -> None:
    api.put("/v1/queues/previewed", json={"max_deliveries": 1}).raise_for_status()
    values = [{"value": "order 17: card declined"}, {"value": "long " + "x" * 5000}]
    values.append({"value": "AAEC/w==", "encoding": "base64"})
    api.post("/v1/queues/previewed/items", json={"items": values}).raise_for_status()
    api.post("/v1/queues/previewed/dequeue", json={"count": 3, "lease_ms": 50})
    time.sleep(0.3)  # the leases run out; the next dequeue moves them to the DLQ
    t0 = int(time.time() * 1000)
    eventually(
        lambda: not api.post("/v1/queues/previewed/dequeue", json={"count": 3}).json()["items"]
    )
    t1 = int(time.time() * 1000)
    eventually(lambda: queue_info(api, "previewed.dlq")["stats"]["pending"] == 3)
    page.goto(server.url + "/ui/" + REFRESH + "#/queue/previewed.dlq/dead")
    rows = page.locator("table.items tbody tr[data-id]")
    expect()(rows).to_have_count(3)
    previews = [rows.nth(i).locator('td[data-col="value"]').inner_text() for i in range(3)]
    assert previews[0] == "order 17: card declined"
    assert previews[1].startswith("long xxx") and previews[1].endswith("\u2026")
    assert len(previews[1]) < 200  # a preview, not the 5,000 bytes
    assert previews[2] == "00 01 02 ff"  # binary: hex
    for i in range(3):
        died = rows.nth(i).locator('td[data-col="died"]').inner_text()
        stamp = died.split(" (")[0]
        assert local_time(t0 - 1000) <= stamp <= local_time(t1 + 1000), died
        assert died.endswith("ago)"), died


def test_dead_letter_tab_shows_why_each_died(
    page: Any, api: httpx.Client, server: LiveServer, shot: Callable[[Any, str], Path]
) -> None:
    """The reason column shows each dead letter's last error (a consumer's fail, or an
    expired lease); opening one lists every reason it keeps, newest first."""
    api.put("/v1/queues/declined", json={"max_deliveries": 2}).raise_for_status()
    api.post("/v1/queues/declined/items", json={"items": [{"value": "charge 9"}]})
    for attempt in (1, 2):
        body = {"count": 1, "wait_ms": 2000}
        item = api.post("/v1/queues/declined/dequeue", json=body).json()["items"][0]
        fail = {
            "id": item["id"],
            "receipt": item["receipt"],
            "error": f"CardDeclined: try {attempt}",
        }
        api.post("/v1/queues/declined/fail", json={"items": [fail]}).raise_for_status()

    def moved() -> bool:  # a dequeue once it is due again moves it to declined.dlq
        assert not api.post("/v1/queues/declined/dequeue", json={"count": 1}).json()["items"]
        return bool(queue_info(api, "declined.dlq")["stats"]["pending"] == 1)

    eventually(moved)
    page.goto(server.url + "/ui/" + REFRESH + "#/queue/declined.dlq/dead")
    reason = page.locator('table.items tbody tr[data-id] td[data-col="reason"]')
    expect()(reason).to_have_text("CardDeclined: try 2")
    page.locator("table.items tbody tr[data-id] a[data-open]").click()
    reasons = page.locator("ol.reasons li pre.reason")
    expect()(reasons).to_have_count(2)
    assert [reasons.nth(i).inner_text() for i in range(2)] == [
        "CardDeclined: try 2",
        "CardDeclined: try 1",
    ]
    shot(page, "dead-letter-reasons")


def test_select_and_delete_dead_letters(page: Any, api: httpx.Client, server: LiveServer) -> None:
    dead_letter(api, "doomed", 3)
    page.goto(server.url + "/ui/" + REFRESH + "#/queue/doomed.dlq/dead")
    boxes = page.locator("table.items input[data-select]")
    expect()(boxes).to_have_count(3)
    boxes.nth(0).check()
    boxes.nth(1).check()
    page.click("#delete-selected")
    confirm(page)
    eventually(lambda: queue_info(api, "doomed.dlq")["stats"]["pending"] == 1)
    assert queue_info(api, "doomed")["stats"]["pending"] == 0


def test_a_refused_action_stays_in_the_status_line(
    page: Any, api: httpx.Client, server: LiveServer
) -> None:
    """Deleting a dead letter that someone else deleted meanwhile fails (404), and the
    status line keeps saying so after the next refreshes, until the next action."""
    dead_letter(api, "raced", 2)
    page.goto(server.url + "/ui/" + REFRESH + "#/queue/raced.dlq/dead")
    expect()(page.locator("table.items tbody tr[data-id]")).to_have_count(2)
    dlq_ids = [
        int(i)
        for i in page.locator("table.items tbody tr[data-id]").evaluate_all(
            "rows => rows.map((r) => r.dataset.id)"
        )
    ]
    page.click(f'button[data-delete="{dlq_ids[0]}"]')
    api.delete(f"/v1/queues/raced.dlq/items/{dlq_ids[0]}").raise_for_status()
    confirm(page)
    status = page.locator("#status")
    expect()(status).to_contain_text("item_not_found")
    expect()(status).to_contain_text("figures updated")  # a refresh came, the error stayed
    expect()(page.locator("table.items tbody tr[data-id]")).to_have_count(1)
    page.click(f'button[data-delete="{dlq_ids[1]}"]')  # the next action clears it
    confirm(page)
    expect()(status).to_contain_text("deleted 1 item")
    assert queue_info(api, "raced.dlq")["stats"]["pending"] == 0


def test_find_an_item_by_id(page: Any, api: httpx.Client, server: LiveServer, shot: Any) -> None:
    [text_id] = enqueue(api, "findable", 1, value="hello, find me")
    [bin_id] = enqueue(api, "findable", 1, value="AAEC/w==", encoding="base64")
    page.goto(server.url + "/ui/#/find")
    page.fill("#find-queue", "findable")
    page.fill("#find-id", str(text_id))
    page.click("#find button[type=submit]")
    panel = page.locator(".panel.item")
    expect()(panel.locator('dd[data-field="state"]')).to_have_text("due")
    expect()(panel.locator("pre.value")).to_have_text("hello, find me")
    shot(page, "find")
    panel.locator("input[value=hex]").check()
    expect()(panel.locator("pre.value")).to_contain_text("68 65 6c 6c 6f")
    page.fill("#find-id", str(bin_id))
    page.click("#find button[type=submit]")
    expect()(page.locator("pre.value")).to_contain_text("00 01 02 ff")  # binary: hex at once
    page.fill("#find-id", "999999")
    page.click("#find button[type=submit]")
    expect()(page.locator("#not-found")).to_be_visible()


def test_find_a_gone_item(page: Any, api: httpx.Client, server: LiveServer) -> None:
    """An item released since has no deadline: the page says so, not "55 years ago"."""
    [item_id] = enqueue(api, "left", 1)
    api.delete(f"/v1/queues/left/items/{item_id}").raise_for_status()
    page.goto(server.url + f"/ui/#/find?queue=left&id={item_id}")
    panel = page.locator(".panel.item")
    expect()(panel.locator('dd[data-field="state"]')).to_have_text("gone")
    expect()(panel.locator('dd[data-field="deadline"]')).to_have_text(
        "\u2013"
    )  # an en dash: no deadline


def test_find_a_moved_item_follows_it(page: Any, api: httpx.Client, server: LiveServer) -> None:
    """A dead-lettered item's old id says where it went, and one click shows it there."""
    [old_id] = dead_letter(api, "moving", 1)
    [dead] = api.get("/v1/queues/moving.dlq/items").json()["items"]
    page.goto(server.url + f"/ui/#/find?queue=moving&id={old_id}")
    panel = page.locator(".panel.item")
    expect()(panel.locator('dd[data-field="state"]')).to_have_text("gone")
    link = panel.locator("#moved-to")
    expect()(link).to_have_text(f"moving.dlq as item {dead['id']}")
    link.click()
    expect()(page.locator("#find-queue")).to_have_value("moving.dlq")
    expect()(panel.locator('dd[data-field="state"]')).to_have_text("due")
    expect()(panel.locator('dd[data-field="dead-lettered from"]')).to_have_text("moving")


def test_find_by_key_then_reschedule_and_cancel(
    page: Any, api: httpx.Client, server: LiveServer, shot: Any
) -> None:
    """An item found by its key shows in full; while it waits it can be rescheduled and
    cancelled through that key."""
    body = {"items": [{"value": "expire order 7", "delay_ms": 3_600_000, "key": "order/7"}]}
    [done] = api.post("/v1/queues/bykey/items", json=body).json()["items"]
    page.goto(server.url + "/ui/#/find")
    page.fill("#find-queue", "bykey")
    page.fill("#find-key", "order/7")
    page.click("#find button[type=submit]")
    panel = page.locator(".panel.item")
    expect()(panel.locator("pre.value")).to_have_text("expire order 7")
    expect()(panel.locator('dd[data-field="state"]')).to_have_text("delayed")
    page.fill("#reschedule-s", "0")
    page.click("#reschedule")
    expect()(panel.locator('dd[data-field="state"]')).to_have_text("due")
    assert api.get("/v1/queues/bykey/keys/order/7").json()["deadline"] < done["deadline"]
    shot(page, "find-by-key")
    page.click("#cancel-key")
    confirm(page)
    expect()(page.locator("#not-found")).to_contain_text("names no item")
    assert api.get("/v1/queues/bykey").json()["stats"]["pending"] == 0


def test_server_view(page: Any, api: httpx.Client, server: LiveServer, shot: Any) -> None:
    enqueue(api, "stored", 2)
    page.goto(server.url + "/ui/#/server")
    expect()(page.locator('dd[data-field="data directory"]')).to_have_text(str(server.data_dir))
    expect()(page.locator('dd[data-field="fsync"]')).to_have_text("never")
    expect()(page.locator('#disk tr[data-queue="stored"]')).to_be_visible()
    shot(page, "server")


def test_swagger_ui_works_offline(page: Any, server: LiveServer, shot: Any) -> None:
    outside: list[str] = []

    def only_local(route: Any) -> None:
        if route.request.url.startswith(server.url):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", only_local)
    page.goto(server.url + "/docs")
    expect()(page.locator(".swagger-ui .btn.authorize")).to_be_visible()
    expect()(page.locator(".opblock-summary-path").first).to_be_visible()
    assert outside == []
    shot(page, "docs")


# ------------------------------------------------------------------ auth


def test_a_server_out_of_reach_is_said_so(
    page: Any, browser: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The server stops under an open page: the status line says it cannot reach the
    server (not the browser's bare "TypeError: Failed to fetch")."""
    with live_server(tmp_path_factory.mktemp("dq-ui-gone") / "data", env=SERVER_ENV) as s:
        page.goto(s.url + "/ui/" + REFRESH)
        expect()(page.locator("#status")).to_contain_text("updated")
        s.kill()
        expect()(page.locator("#status")).to_contain_text("unreachable: cannot reach the server")


@pytest.fixture(scope="module")
def guarded(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {**SERVER_ENV, "DQ_TOKENS": "s3cret", "DQ_READ_TOKENS": "viewer"}
    with live_server(tmp_path_factory.mktemp("dq-ui-auth") / "data", env=env) as s:
        yield s


def test_sign_in_with_a_token(page: Any, guarded: LiveServer, shot: Any) -> None:
    httpx.post(
        guarded.url + "/v1/queues/private/items",
        json={"items": [{"value": "x"}]},
        headers={"Authorization": "Bearer s3cret"},
    ).raise_for_status()
    page.goto(guarded.url + "/ui/" + REFRESH)
    expect()(page.locator("#login")).to_be_visible()
    expect()(page.locator("#nav")).to_be_hidden()
    assert page.locator("#queues").count() == 0  # nothing but the form
    shot(page, "login")
    page.fill("#token", "wrong")
    page.click("#login button[type=submit]")
    expect()(page.locator("#login-error")).to_have_text("That token was refused.")
    page.fill("#token", "s3cret")
    page.click("#login button[type=submit]")
    expect()(cell(page, "private", "due")).to_have_text("1")
    page.click("#logout")
    expect()(page.locator("#login")).to_be_visible()
    assert page.locator("#queues").count() == 0


def test_a_read_only_token_sees_no_actions(page: Any, guarded: LiveServer) -> None:
    httpx.post(
        guarded.url + "/v1/queues/watched/items",
        json={"items": [{"value": "x"}]},
        headers={"Authorization": "Bearer s3cret"},
    ).raise_for_status()
    page.goto(guarded.url + "/ui/" + REFRESH)
    page.fill("#token", "viewer")
    page.click("#login button[type=submit]")
    expect()(cell(page, "watched", "due")).to_have_text("1")
    page.goto(guarded.url + "/ui/" + REFRESH + "#/queue/watched/settings")
    expect()(page.locator(".toolbar .read-note")).to_be_visible()
    for hidden in ("#pause", "#purge", "#settings button[type=submit]"):
        expect()(page.locator(hidden)).to_be_hidden()
