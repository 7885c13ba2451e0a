"""docs/client.md's examples work together as a newcomer runs them: the queue the first
example configures sends its dead letters to the queue "Operating a queue" redrives.

The doc's own statements run against a live server (the first example's ``put_queue``
and the redrive line, taken from the doc as written); between them an item is delivered
past the example's ``max_deliveries``.
"""

from __future__ import annotations

import ast
import re
import time
from pathlib import Path

import pytest

from dq.client import Client
from tests.server.live import REPO, live_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def python_blocks() -> list[str]:
    doc = (REPO / "docs" / "client.md").read_text()
    return re.findall(r"```python\n(.*?)```", doc, flags=re.S)


def statements(block: str, call: str) -> list[str]:
    """The statements of ``block`` (at any depth) that call ``dq.<call>``, as source."""
    found = []
    for node in ast.walk(ast.parse(block)):
        if isinstance(node, ast.Expr | ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Attribute) and func.attr == call:
                found.append(ast.unparse(node))
    return found


def test_the_examples_redrive_the_dead_letter_queue_they_configure(tmp_path: Path) -> None:
    blocks = python_blocks()
    [configure] = statements(blocks[0], "put_queue")
    [redrive] = [s for b in blocks for s in statements(b, "redrive")]
    env = {"DQ_EXPIRE_INTERVAL_MS": "50"}
    with live_server(tmp_path / "data", env=env) as server, Client(server.url) as dq:
        names: dict[str, object] = {"dq": dq}
        exec("from dq.client import QueueConfig\n" + configure, names)  # as written
        dq.enqueue("emails", b"poison")
        give_up = time.monotonic() + 30
        while dq.queue("emails").stats.dead_lettered == 0:  # each lease runs out
            assert time.monotonic() < give_up, "the item was never dead-lettered"
            dq.dequeue("emails", lease_ms=1)
            time.sleep(0.06)
        exec(redrive, names)  # as written
        result = names["result"]
        assert getattr(result, "moved", None) == 1, result
        assert [i.value for i in dq.browse("emails", values=True).items] == [b"poison"]
