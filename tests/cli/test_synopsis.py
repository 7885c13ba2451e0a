"""docs/cli.md's synopsis is the real command line: every command and every flag the
parser knows is in it, and nothing in it is unknown to the parser.

The flags every client command shares (``--url``, ``--token``, ``--json``) are described
once below the synopsis, not on every line; ``-h`` is everywhere.
"""

from __future__ import annotations

import argparse
import re

from dq.cli.main import build_parser
from tests.server.live import REPO

COMMON = {"--url", "--token", "--json", "-h", "--help"}
#: commands with subcommands of their own (``dq schedule put``): their flags are the
#: subcommands', and the synopsis may give each subcommand its own ``dq schedule ...``
GROUPS = {"schedule"}


def synopsis() -> dict[str, str]:
    """Each command of the doc's first code block and the text of its synopsis."""
    doc = (REPO / "docs" / "cli.md").read_text()
    block = re.search(r"```\n(dq .*?)```", doc, flags=re.S)
    assert block is not None, "docs/cli.md lost its synopsis"
    joined = re.sub(r"\n\s+", " ", block.group(1))  # continuation lines
    found: dict[str, str] = {}
    for line in joined.splitlines():
        line = line.split("  # ")[0]
        for part in re.split(r"\|\s*(?=dq )", line):
            command = part.split()[1]
            if command in found and command in GROUPS:  # dq schedule put ... | dq schedule list
                found[command] += " " + part
                continue
            assert command not in found, f"{command} twice in the synopsis"
            found[command] = part
    return found


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_command_is_in_the_synopsis() -> None:
    assert set(synopsis()) == set(commands())


def test_every_flag_is_in_the_synopsis_and_every_flag_there_is_real() -> None:
    documented = synopsis()
    for name, parser in commands().items():
        text = documented[name]
        written = set(re.findall(r"(?<![\w-])--?[a-z][a-z0-9-]*", text))
        real: set[str] = set()
        actions = list(parser._actions)
        for action in parser._actions:  # a group's subcommands (``dq schedule put``)
            if isinstance(action, argparse._SubParsersAction):
                actions += [a for p in action.choices.values() for a in p._actions]
        for action in actions:
            flags = {o for o in action.option_strings if o not in COMMON}
            real |= flags
            assert not flags or flags & written, f"dq {name}: {sorted(flags)} not in docs/cli.md"
        assert written <= real, f"dq {name}: docs/cli.md has {sorted(written - real)}"
