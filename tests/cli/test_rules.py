"""The delivery rules from the command line (``docs/cli.md``, ``docs/delivery.md``):
``dq create`` sets them, ``dq config`` changes only what its flags give, ``none`` drops
a limit, ``dq stats`` shows them, and a value the server refuses is its words on stderr
with exit 1 — ``dq`` subprocesses against a live server."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from dq.client import Client, QueueConfig, RateLimit, RetryPolicy
from tests.cli.test_operate import dq, run
from tests.server.live import LiveServer, live_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("dq") / "data") as s:
        yield s


def test_create_and_config_set_the_rules_and_keep_what_they_do_not_name(
    server: LiveServer,
) -> None:
    made = dq(server, "create", "jobs", "--group-limit", "5", "--fair", "--json")
    assert made.returncode == 0, made.stderr
    config = json.loads(made.stdout)["config"]
    assert (config["group_limit"], config["fair"], config["leased_limit"]) == (5, True, None)
    with Client(server.url) as c:  # a retry policy set elsewhere is kept by dq config
        retry = RetryPolicy(delays_ms=(1000,))
        c.put_queue("jobs", QueueConfig(group_limit=5, fair=True, retry=retry))
    changed = dq(server, "config", "jobs", "--leased-limit", "20", "--rate-limit", "50")
    assert changed.returncode == 0, changed.stderr
    with Client(server.url) as c:
        got = c.queue("jobs").config
    assert got.group_limit == 5 and got.fair and got.leased_limit == 20
    assert got.rate_limit == RateLimit(per_second=50, burst=50, per_group=False)
    assert got.retry == retry
    dropped = dq(server, "config", "jobs", "--group-limit", "none", "--no-fair")
    assert dropped.returncode == 0, dropped.stderr
    shown = dq(server, "stats", "jobs")
    assert "leased limit 20, rate 50/s (burst 50)" in shown.stdout, shown.stdout
    with Client(server.url) as c:
        got = c.queue("jobs").config
    assert got.group_limit is None and not got.fair and got.leased_limit == 20


def test_a_value_the_server_refuses_is_its_words_and_exit_1(server: LiveServer) -> None:
    assert dq(server, "create", "strict", "--group-limit", "3").returncode == 0
    bad = dq(server, "config", "strict", "--group-limit", "0")
    assert bad.returncode == 1
    assert "group_limit must be between 1 and 4294967295" in bad.stderr, bad.stderr
    rate = dq(server, "config", "strict", "--rate-limit", "0")
    assert rate.returncode == 1 and "per_second must be a number above 0" in rate.stderr
    with Client(server.url) as c:
        assert c.queue("strict").config.group_limit == 3  # nothing changed


def test_unknown_limit_text_is_refused_before_asking() -> None:
    out = run("config", "q", "--group-limit", "lots", "--url", "http://127.0.0.1:9")
    assert out.returncode == 2 and "not a number or 'none'" in out.stderr
