"""The guard that keeps ``make check`` free of processes and servers (``tests/tiers.py``).

The first tests arm a guard of their own, installed over the session's, and try each way
of starting a process or a server; the last runs pytest on sample tests with
``tests/conftest.py`` and checks which pass, which fail and what the failure says.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import socket
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from tests.tiers import Guard, StartRefused

HERE = Path(__file__).resolve()


@pytest.fixture
def guard() -> Iterator[Guard]:
    guard = Guard()
    guard.install()
    try:
        yield guard
    finally:
        guard.uninstall()


def _refused(guard: Guard, start: Callable[[], Any]) -> str:
    """Run ``start`` under the armed guard: it must be refused and recorded; the record."""
    with guard.arming(True) as starts, pytest.raises(StartRefused):
        start()
    assert len(starts) == 1, starts
    return str(starts[0])


def test_a_subprocess_is_refused_and_the_record_names_the_command_and_the_line(
    guard: Guard,
) -> None:
    record = _refused(guard, lambda: subprocess.run(["true"], timeout=10))
    assert record.startswith("a subprocess ['true'], from")
    assert "tests/test_tiers.py:" in record and "subprocess.run" in record


def test_every_way_of_starting_a_process_is_refused(guard: Guard, tmp_path: Path) -> None:
    def mp(method: str) -> Callable[[], None]:
        return lambda: multiprocessing.get_context(method).Process(target=print).start()

    async def asyncio_subprocess() -> None:
        await asyncio.create_subprocess_exec("true")

    starts: dict[str, Callable[[], Any]] = {
        "Popen": lambda: subprocess.Popen(["true"]),
        "os.popen": lambda: os.popen("true"),
        "asyncio": lambda: asyncio.run(asyncio_subprocess()),
        "os.fork": os.fork,
        "os.forkpty": os.forkpty,
        "os.spawnv": lambda: os.spawnv(os.P_WAIT, "/bin/true", ["true"]),
        "os.posix_spawn": lambda: os.posix_spawn("/bin/true", ["true"], {}),
        "os.posix_spawnp": lambda: os.posix_spawnp("true", ["true"], {}),
        "os.system": lambda: os.system("true"),
        "multiprocessing fork": mp("fork"),
        "multiprocessing spawn": mp("spawn"),
        "multiprocessing forkserver": mp("forkserver"),
    }
    for name, start in starts.items():
        record = _refused(guard, start)
        assert "a process" in record or "a subprocess" in record, (name, record)


def test_a_tcp_server_is_refused_a_unix_socket_or_a_tcp_client_is_not(
    guard: Guard, tmp_path: Path
) -> None:
    def tcp_listen(family: socket.AddressFamily, host: str) -> None:
        with socket.socket(family) as s:
            s.bind((host, 0))
            s.listen()

    assert "TCP server socket listening on 127.0.0.1:" in _refused(
        guard, lambda: tcp_listen(socket.AF_INET, "127.0.0.1")
    )
    if socket.has_ipv6:
        assert "TCP server socket listening on ::1:" in _refused(
            guard, lambda: tcp_listen(socket.AF_INET6, "::1")
        )
    assert "TCP server socket" in _refused(
        guard, lambda: socket.create_server(("127.0.0.1", 0)).close()
    )

    async def asyncio_server() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        server.close()

    assert "TCP server socket" in _refused(guard, lambda: asyncio.run(asyncio_server()))

    with guard.arming(True) as starts:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(tmp_path / "attach.sock"))
            s.listen()
        with socket.socket() as s:  # a client's socket, bound but not listening
            s.bind(("127.0.0.1", 0))
    assert starts == []


def test_a_uvicorn_server_is_refused_even_on_a_unix_socket(guard: Guard, tmp_path: Path) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("never served")

    config = uvicorn.Config(app, uds=str(tmp_path / "app.sock"), lifespan="off")
    server = uvicorn.Server(config)
    record = _refused(guard, lambda: asyncio.run(server.startup()))
    assert record.startswith("a uvicorn server")


def test_a_refusal_the_test_catches_is_still_recorded(guard: Guard) -> None:
    with guard.arming(True) as starts:
        try:
            subprocess.run(["true"], timeout=10)
        except Exception:
            pass
    assert len(starts) == 1


def test_a_disarmed_guard_lets_calls_through_and_uninstalling_restores_the_originals(
    tmp_path: Path,
) -> None:
    before = (subprocess.Popen._execute_child, os.fork, socket.socket.listen)  # type: ignore[attr-defined]
    guard = Guard()
    guard.install()
    try:
        assert subprocess.Popen._execute_child is not before[0]  # type: ignore[attr-defined]
        with guard.arming(False) as starts, socket.socket(socket.AF_UNIX) as s:
            s.bind(str(tmp_path / "s.sock"))
            s.listen()  # passes through this guard to the session's (which allows it)
        assert starts == []
    finally:
        guard.uninstall()
    assert (subprocess.Popen._execute_child, os.fork, socket.socket.listen) == before  # type: ignore[attr-defined]


SAMPLE = """
import subprocess

import pytest

from tests.tiers import starts_servers


def start() -> None:
    subprocess.run(["true"], check=True, timeout=10)


@pytest.fixture
@starts_servers
def declared():
    start()
    yield


@pytest.fixture
def undeclared():
    start()
    yield


def test_pure():
    assert True


def test_quietly_starts_a_process():
    start()


def test_uses_an_undeclared_fixture(undeclared):
    pass


@pytest.mark.integration
def test_marked():
    start()


def test_uses_a_declared_fixture(declared):
    pass
"""


@pytest.mark.integration  # the sample's marked tests start processes
def test_conftest_fails_unmarked_tests_that_start_processes(pytester: pytest.Pytester) -> None:
    pytester.makeconftest((HERE.parent / "conftest.py").read_text())
    pytester.makeini(
        textwrap.dedent("""
        [pytest]
        addopts = --strict-markers -p no:cacheprovider
        markers = integration: starts a subprocess or a server
        """)
    )
    pytester.makepyfile(test_sample=SAMPLE)

    everything = pytester.runpytest_inprocess("-rA")
    everything.assert_outcomes(passed=3, failed=1, errors=1)
    out = everything.stdout.str()
    assert "FAILED test_sample.py::test_quietly_starts_a_process" in out
    assert "ERROR test_sample.py::test_uses_an_undeclared_fixture" in out
    assert "this test is not marked integration but started a subprocess ['true'], from\n" in out
    lines = SAMPLE.strip().splitlines()  # as pytester writes it
    in_test = lines.index("def test_quietly_starts_a_process():") + 2
    in_fixture = lines.index("def undeclared():") + 2
    assert f"test_sample.py:{in_test}: start()\n" in out
    assert f"test_sample.py:{in_fixture}: start()\n" in out
    assert "mark it (or its module, or the fixture that starts it) integration" in out

    fast = pytester.runpytest_inprocess("-m", "not integration")
    fast.assert_outcomes(passed=1, failed=1, errors=1, deselected=2)
    slow = pytester.runpytest_inprocess("-m", "integration", "-rA")
    slow.assert_outcomes(passed=2, deselected=3)
    slow.stdout.fnmatch_lines(["PASSED test_sample.py::test_marked", "PASSED *declared_fixture"])
