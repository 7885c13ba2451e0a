"""docs/settings.md is the server's real settings, and names every ``DQ_*`` variable read.

The page is where an operator looks a setting up, so it must not drift from the code in
either direction: every field of ``Settings`` has its row, with its variable, its flag
(when ``dq serve`` has one) and the default the server really uses; every ``dq serve``
flag is on the row of the setting it sets; ``dq serve --help`` names the same variable
and default; and no row names a setting or flag that does not exist. The variables read
outside the server (command line, compose files, tests, benchmarks) are checked against
the places that read them, both ways too.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from pathlib import Path

import pytest

from dq.cli.main import build_parser
from dq.server.settings import Settings
from dq.shm.command_ring import DEFAULT_SPIN_US
from tests.server.live import REPO

DOC = REPO / "docs" / "settings.md"
SERVER_HEADER = "| variable | flag | default | what it does | change |"
OUTSIDE_HEADER = "| variable | read by | default | what it does |"
#: Settings whose default is worked out at start rather than stored as is: the value the
#: table must give is the one the server then uses.
EFFECTIVE = {"max_body_bytes": Settings().body_limit}
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
#: Where a variable outside the server may be read: Python (``os.environ``), shell and
#: compose files (``$DQ_X``, ``${DQ_X:-...}``).
SOURCES = ("server", "storage", "shm", "client", "cli", "pipeline", "bench", "tests", "docker")


@dataclasses.dataclass(frozen=True)
class Row:
    variables: tuple[str, ...]
    flags: tuple[str, ...]
    default: str
    line: str


def _spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


def _rows(header: str) -> list[Row]:
    """The rows of every table on the page that starts with ``header``."""
    rows: list[Row] = []
    inside = False
    for line in DOC.read_text().splitlines():
        if line == header:
            inside = True
            continue
        if not line.startswith("|"):
            inside = False
            continue
        if not inside or line.startswith("| ---"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        flags = (
            tuple(s for s in _spans(cells[1]) if s.startswith("-"))
            if header == SERVER_HEADER
            else ()
        )
        rows.append(Row(tuple(_spans(cells[0])), flags, cells[2], line))
    return rows


def _serve_actions() -> list[argparse.Action]:
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    serve = sub.choices["serve"]
    return [a for a in serve._actions if not isinstance(a, argparse._HelpAction)]


def _fields() -> dict[str, object]:
    """Every setting the server reads from a ``DQ_*`` variable, with its default."""
    defaults = Settings()
    return {
        f.name: EFFECTIVE.get(f.name, getattr(defaults, f.name))
        for f in dataclasses.fields(Settings)
        if f.name != "extra"
    }


def _value(text: str, like: object) -> object:
    """A default as the page (or ``--help``) writes it, read as the type of ``like``."""
    text = text.strip()
    if isinstance(like, bool):
        assert text in ("on", "off"), f"a boolean default is written on or off: {text!r}"
        return text == "on"
    if isinstance(like, int | float):
        m = re.fullmatch(r"(\d+(?:\.\d+)?)(?: (KiB|MiB|GiB))?", text)
        assert m, f"not a number (with an optional KiB/MiB/GiB): {text!r}"
        return float(m.group(1)) * UNITS.get(m.group(2) or "", 1)
    return text


def _documented_default(row: Row, like: object) -> object:
    """The page's default: the leading code span, or ``none`` for an empty value."""
    if row.default.startswith("none"):
        return () if isinstance(like, tuple) else type(like)()
    spans = _spans(row.default)
    assert spans and row.default.startswith("`"), f"default must start with a value: {row.line}"
    return _value(spans[0], like)


def _server_rows() -> dict[str, Row]:
    by_field: dict[str, Row] = {}
    for row in _rows(SERVER_HEADER):
        for variable in row.variables:
            field = variable.removeprefix("DQ_").lower()
            assert variable.startswith("DQ_"), row.line
            assert field not in by_field, f"{variable} is on the page twice"
            by_field[field] = row
    return by_field


def test_every_setting_is_documented_and_every_documented_one_exists() -> None:
    fields = _fields()
    rows = _server_rows()
    missing = sorted(f"DQ_{name.upper()}" for name in fields.keys() - rows.keys())
    unknown = sorted(f"DQ_{name.upper()}" for name in rows.keys() - fields.keys())
    assert not missing, f"settings missing from docs/settings.md: {missing}"
    assert not unknown, f"docs/settings.md documents settings that do not exist: {unknown}"


def test_documented_defaults_are_the_servers() -> None:
    for name, default in _fields().items():
        if name == "shm_spin_us":  # depends on the machine: the next test
            continue
        row = _server_rows()[name]
        written = _documented_default(row, default)
        assert written == default, (
            f"DQ_{name.upper()}: docs/settings.md says {row.default!r}, the server uses {default!r}"
        )


def test_spin_default_follows_the_core_count() -> None:
    """The one default that depends on the machine: both values and the rule are written."""
    row = _server_rows()["shm_spin_us"]
    many, few = (_value(s, 0.0) for s in _spans(row.default)[:2])
    assert "1\N{EN DASH}2 cores" in row.default
    assert (many if (os.cpu_count() or 1) > 2 else few) == DEFAULT_SPIN_US


def test_every_serve_flag_is_on_its_settings_row() -> None:
    fields = _fields()
    rows = _server_rows()
    documented = [flag for row in _rows(SERVER_HEADER) for flag in row.flags]
    assert len(documented) == len(set(documented)), "a flag is on docs/settings.md twice"
    real: set[str] = set()
    for action in _serve_actions():
        flags = set(action.option_strings)
        real |= flags
        if action.dest in fields:
            row = rows[action.dest]
            assert set(row.flags) == flags, f"{sorted(flags)} belong on the row of {row.line}"
        else:  # a flag with no variable (``--access-log``): a row of its own, no variable
            [row] = [r for r in _rows(SERVER_HEADER) if flags & set(r.flags)]
            assert not row.variables and set(row.flags) == flags, row.line
            assert _value(_spans(row.default)[0], action.default) == action.default, row.line
    assert set(documented) <= real, f"not flags of dq serve: {sorted(set(documented) - real)}"
    for name, row in rows.items():
        assert not row.flags or any(a.dest == name for a in _serve_actions()), row.line


def test_serve_help_names_the_same_variable_and_default() -> None:
    fields = _fields()
    for action in _serve_actions():
        if action.dest not in fields:
            continue
        variable = f"DQ_{action.dest.upper()}"
        named = re.findall(r"\bDQ_[A-Z0-9_]+", action.help or "")
        assert named == [variable], f"{action.option_strings}: help names {named}, not {variable}"
        said = re.search(r"default ([^;,)]+)", action.help or "")
        if said is None:
            continue
        row = _server_rows()[action.dest]
        if row.default.startswith("none"):  # described in words, on both sides
            assert said.group(1) in row.default, (action.help, row.line)
        else:
            default = fields[action.dest]
            assert _value(said.group(1), default) == default, (action.help, default)


def _read_outside_settings() -> set[str]:
    """Every ``DQ_*`` name the repository reads, other than through ``Settings``."""
    python = re.compile(r"""(?:environ(?:\.get)?[\[(]\s*|getenv\()["'](DQ_[A-Z0-9_]+)""")
    shell = re.compile(r"\$\{?(DQ_[A-Z0-9_]+)")
    names: set[str] = set()
    for top in SOURCES:
        for path in (REPO / top).rglob("*"):
            if not path.is_file() or ".venv" in path.parts or path.suffix in (".so", ".pyc"):
                continue
            text = path.read_text(errors="replace")
            names |= set(python.findall(text))
            if path.suffix in (".sh", ".yml", ".yaml", "") or path.name == "Dockerfile":
                names |= set(shell.findall(text))
    return names - {f"DQ_{name.upper()}" for name in _fields()}


def test_every_variable_read_outside_the_server_is_documented_and_real() -> None:
    read = _read_outside_settings()
    documented: list[str] = [v for row in _rows(OUTSIDE_HEADER) for v in row.variables]
    documented = [v for v in documented if v.startswith("DQ_")]
    assert len(documented) == len(set(documented)), "a variable is on docs/settings.md twice"
    assert not read - set(documented), (
        f"read but not on docs/settings.md: {sorted(read - set(documented))}"
    )
    assert not set(documented) - read, (
        f"on docs/settings.md, read nowhere: {sorted(set(documented) - read)}"
    )
    assert not set(documented) & set(_server_rows()), "a variable is in two sections"


@pytest.mark.parametrize("page", ["http.md", "replication.md", "deploy.md", "sqs.md"])
def test_the_pages_that_had_settings_tables_link_here(page: str) -> None:
    [path] = (REPO / "docs").rglob(page)
    assert "settings.md" in path.read_text(), f"{path} should link to docs/settings.md"


def test_no_other_page_repeats_a_settings_row() -> None:
    for path in (REPO / "docs").rglob("*.md"):
        if path == DOC:
            continue
        repeated = [line for line in path.read_text().splitlines() if line.startswith("| `DQ_")]
        assert not repeated, f"{path} repeats rows of docs/settings.md: {repeated[:3]}"


def test_the_page_is_where_the_code_points() -> None:
    assert "docs/settings.md" in Path(REPO / "server" / "settings.py").read_text()
