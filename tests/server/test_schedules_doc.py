"""docs/schedules.md's examples, sent as written to a server: each definition is taken,
and its next fire times are what the page says they are."""

from __future__ import annotations

import json
import re
import shlex
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx

from tests.server.test_schedules_http import run

DOC = Path(__file__).resolve().parents[2] / "docs" / "schedules.md"


def curl_puts() -> list[tuple[str, dict[str, Any]]]:
    """(path, body) of every ``curl -X PUT`` on the page."""
    text = DOC.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        if not line.startswith("curl -X PUT"):
            continue
        words = shlex.split(line)
        url = words[3]
        body = json.loads(words[words.index("-d") + 1])
        out.append((re.sub(r"^https?://[^/]+", "", url), body))
    return out


def test_the_pages_examples_fire_when_it_says(tmp_path: Path) -> None:
    examples = curl_puts()
    assert len(examples) == 3

    async def call(http: httpx.AsyncClient) -> None:
        answers = {}
        for path, body in examples:
            r = await http.put(path, json=body)
            assert r.status_code == 200, (path, r.text)
            answers[path.rsplit("/", 1)[1]] = r.json()
        weekday = answers["weekday-report"]
        berlin = ZoneInfo("Europe/Berlin")
        for t in weekday["next"]:
            local = datetime.fromtimestamp(t / 1000, berlin)
            assert (local.hour, local.minute, local.second) == (9, 0, 0)
            assert local.isoweekday() <= 5
        assert weekday["value"] == '{"report": "sales"}'
        five = answers["every-5-minutes"]["next"]
        assert all(t % 300_000 == 0 for t in five) and five[1] - five[0] == 300_000
        once = answers["close-november"]
        new_york = datetime(2027, 12, 1, 9, 0, tzinfo=ZoneInfo("America/New_York"))
        assert once["next"] == [int(new_york.timestamp() * 1000)] == [once["at"]]

    run(tmp_path, call)
