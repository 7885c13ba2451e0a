"""The commands of ``docs/replication.md``, "Try it on one machine", run as written: one
etcd and three ``dq serve`` form a group that takes a write. Only the ports and the
directory are swapped for free ones (each swap is checked to apply), so the section
cannot drift from what works. The etcd and ``dq serve`` flags of every command in the
document exist (etcd's are checked against the installed etcd's ``--help``)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.replication.etcd_server import etcd_binary
from tests.server.live import REPO, free_port

# integration: etcd, dq serve members, curl and the dq CLI
pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

DOC = REPO / "docs" / "replication.md"
SECTION = "### Try it on one machine"
#: what the section's commands hold that a test must not use: a fixed directory and ports
FIXED = ("/tmp/dq-trial", "2379", "2380", "8081", "8082", "8083")
_REDIRECT = re.compile(r"^(?P<cmd>.*?)\s*>\s*(?P<log>\S+)\s+2>&1$")


def blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, re.S)


def section() -> str:
    text = DOC.read_text()
    start = text.index(SECTION)
    return text[start : text.index("\n### ", start + len(SECTION))]


def commands(block: str) -> list[tuple[str, str]]:
    """``(command, comment)`` per line of a shell block, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        command, _, comment = line.partition(" # ")
        if command.strip():
            out.append((command.strip(), comment.strip()))
    return out


def argv(words: list[str]) -> list[str]:
    program = {"dq": [sys.executable, "-m", "dq.cli.main"], "etcd": [etcd_binary()]}
    if words[0] == "curl" and shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    return program.get(words[0], [words[0]]) + words[1:]


class Shell:
    """Just enough of a shell for the section: ``&&``, ``mkdir -p``, ``cd``, ``export``,
    ``cmd > log 2>&1 &`` (kept, and stopped at the end) and plain commands."""

    def __init__(self, env: dict[str, str]) -> None:
        self.cwd = Path.cwd()
        self.env = env
        self.background: list[subprocess.Popen[bytes]] = []

    def run(self, line: str) -> subprocess.CompletedProcess[str] | None:
        result = None
        for part in line.split(" && "):
            result = self._one(part.strip())
        return result

    def _one(self, part: str) -> subprocess.CompletedProcess[str] | None:
        words = shlex.split(part.rstrip("&").strip())
        if words[:2] == ["mkdir", "-p"]:
            (self.cwd / words[2]).mkdir(parents=True, exist_ok=True)
            return None
        if words[0] == "cd":
            self.cwd = (self.cwd / words[1]).resolve()
            return None
        if words[0] == "export":
            name, _, value = words[1].partition("=")
            self.env[name] = value
            return None
        if part.endswith("&"):
            found = _REDIRECT.match(part[:-1].strip())
            assert found is not None, f"a background command without its log: {part}"
            with (self.cwd / found["log"]).open("ab") as log:
                self.background.append(
                    subprocess.Popen(
                        argv(shlex.split(found["cmd"])),
                        cwd=self.cwd,
                        env=self.env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
            return None
        return subprocess.run(
            argv(words), cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=90
        )

    def stop(self) -> None:
        for proc in self.background:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.background:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@contextlib.contextmanager
def shell(env: dict[str, str]) -> Iterator[Shell]:
    sh = Shell(env)
    try:
        yield sh
    finally:
        sh.stop()


def formed(answer: subprocess.CompletedProcess[str] | None) -> bool:
    """The member's ``GET /v1/cluster`` lists the three members in the sync set."""
    if answer is None or answer.returncode != 0:
        return False
    with contextlib.suppress(ValueError):
        return sorted(json.loads(answer.stdout).get("sync", [])) == ["dq1", "dq2", "dq3"]
    return False


def test_the_one_machine_trial_forms_a_group_that_takes_a_write(tmp_path: Path) -> None:
    text = section()
    swaps = {"/tmp/dq-trial": str(tmp_path / "dq-trial")}
    swaps.update({port: str(free_port()) for port in FIXED[1:]})
    for fixed, mine in swaps.items():
        assert fixed in text, f"the section no longer uses {fixed}: update this test"
        text = text.replace(fixed, mine)
    start, use = blocks(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DQ_", "ETCD"))}
    t0 = time.monotonic()
    with shell(env) as sh:
        for command, _ in commands(start):
            sh.run(command)
        assert len(sh.background) == 4  # etcd and three members
        steps = commands(use)
        command, comment = steps[0]
        assert command.startswith("curl") and "until" in comment
        give_up = time.monotonic() + 120
        while not formed(answer := sh.run(command)):
            dead = [p.args for p in sh.background if p.poll() is not None]
            assert not dead, f"exited: {dead}"
            assert time.monotonic() < give_up, f"no group after 120 s: {answer}"
            time.sleep(0.5)
        formed_s = time.monotonic() - t0
        outputs = [sh.run(command) for command, _ in steps[1:]]
        took = time.monotonic() - t0
    put, get = (o for o in outputs if o is not None)
    assert put.returncode == 0, put.stderr
    assert get.returncode == 0 and "hello" in get.stdout, (get.stdout, get.stderr)
    print(
        f"trial: the group formed {formed_s:.1f} s after the first command; wrote and read by {took:.1f} s"
    )


def test_the_documented_flags_exist() -> None:
    """Every ``--flag`` of an ``etcd`` or ``dq serve`` command in the document is one the
    installed etcd (Debian's 3.4 here) or ``dq serve`` takes."""
    etcd_help = subprocess.run(
        [etcd_binary(), "--help"], capture_output=True, text=True, timeout=30
    ).stdout
    dq_help = subprocess.run(
        [sys.executable, "-m", "dq.cli.main", "serve", "--help"],
        cwd=REPO, capture_output=True, text=True, timeout=30,
    ).stdout  # fmt: skip
    seen = {"etcd": 0, "dq serve": 0}
    for block in blocks(DOC.read_text()):
        for command, _ in commands(block):
            for program, helptext in (("etcd", etcd_help), ("dq serve", dq_help)):
                if not command.startswith(program + " "):
                    continue
                seen[program] += 1
                for flag in re.findall(r"(?<!\S)(--[a-z][a-z0-9-]*)", command):
                    assert re.search(rf"(?<![\w-]){flag}(?![\w-])", helptext), (program, flag)
    assert seen["etcd"] >= 2 and seen["dq serve"] >= 4, seen
