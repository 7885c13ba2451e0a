"""The Python halves of the deploy: ``docker/wait-for-dq.py``, ``docker/smoke_check.py`` and
``docker/replicated_check.py``.

They run here against real ``dq serve`` on 127.0.0.1 (no container engine needed), so
``make test`` catches a change to the API that would break ``make docker-smoke`` (or
``make docker-smoke-replicated``). The smoke check runs across a real restart of the
server on the same data directory; the replicated check across a SIGKILL of the leader
of three replicating members (etcd started by the test; skipped without etcd).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dq.client import Client
from tests.server.live import LiveServer, free_port, live_server

pytestmark = pytest.mark.integration  # runs the deploy scripts against live servers

REPO = Path(__file__).resolve().parents[2]
WAIT = REPO / "docker" / "wait-for-dq.py"
CHECK = REPO / "docker" / "smoke_check.py"
REPLICATED = REPO / "docker" / "replicated_check.py"


def run(
    args: list[str], env: dict[str, str], timeout: float = 60, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        env=os.environ | env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    s = LiveServer(tmp_path / "data", fsync="always")
    s.start()
    try:
        yield s
    finally:
        s.kill()


def test_wait_for_dq_runs_the_command_once_healthy(server: LiveServer) -> None:
    out = run([str(WAIT), sys.executable, "-c", "print('job ran')"], {"DQ_URL": server.url})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "job ran"


def test_wait_for_dq_gives_up_without_running_the_command() -> None:
    env = {"DQ_URL": f"http://127.0.0.1:{free_port()}", "DQ_WAIT_S": "1"}
    out = run([str(WAIT), sys.executable, "-c", "print('job ran')"], env)
    assert out.returncode == 1
    assert "job ran" not in out.stdout
    assert "not healthy" in out.stderr


def test_wait_for_dq_needs_a_command() -> None:
    assert run([str(WAIT)], {}).returncode == 2


def test_smoke_check_passes_across_a_restart(server: LiveServer, tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    env = {"SMOKE_GAMMA_DELAY_MS": "1500"}
    before = run([str(CHECK), "before", server.url, str(state)], env)
    assert before.returncode == 0, before.stderr
    assert server.terminate() == 0
    server.start()
    after = run([str(CHECK), "after", server.url, str(state)], env)
    assert after.returncode == 0, after.stderr + server.log()
    assert "beta and gamma came back" in after.stdout


def test_smoke_check_fails_when_the_data_is_gone(server: LiveServer, tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    env = {"SMOKE_GAMMA_DELAY_MS": "1500"}
    assert run([str(CHECK), "before", server.url, str(state)], env).returncode == 0
    with live_server(tmp_path / "empty", fsync="always") as empty:
        after = run([str(CHECK), "after", empty.url, str(state)], env)
    assert after.returncode == 1
    assert "FAILED" in after.stderr


def test_smoke_check_spark_phases(server: LiveServer, tmp_path: Path) -> None:
    """spark-after accepts exactly the counts spark-before enqueued, once all are released."""
    state = tmp_path / "state.json"
    assert run([str(CHECK), "spark-before", server.url, str(state)], {}).returncode == 0
    expected = state.read_text()
    spark_after = [str(CHECK), "spark-after", server.url, str(state)]
    leased = run(spark_after, {}, stdin=expected)
    assert leased.returncode == 1 and "released every item" in leased.stderr
    with Client(server.url) as dq:
        items = dq.dequeue("events", count=100)
        assert len(items) == 51
        dq.release_many("events", items)
    assert run(spark_after, {}, stdin=expected).returncode == 0
    wrong = run(spark_after, {}, stdin='{"click": 39, "buy": 10, "_malformed": 1}')
    assert wrong.returncode == 1 and "Parquet" in wrong.stderr


def test_replicated_check_across_a_leader_kill(tmp_path: Path) -> None:
    """``docker/replicated_check.py``'s three phases against three local members and etcd,
    with the leader SIGKILLed between ``before`` and ``failover`` and started again before
    ``rejoin``, as ``make docker-smoke-replicated`` does to the leader's container."""
    from tests.replication.etcd_server import running_etcd

    with running_etcd(tmp_path / "etcd") as etcd, contextlib.ExitStack() as stack:
        members = []
        for i in range(3):
            port = free_port()
            env = {
                "DQ_ETCD": etcd.url,
                "DQ_NODE": f"dq{i + 1}",
                "DQ_ADVERTISE_URL": f"http://127.0.0.1:{port}",
                "DQ_CLUSTER": "smoke",
                "DQ_SHM": "0",
            }
            member = LiveServer(tmp_path / f"dq{i + 1}", fsync="always", env=env, port=port)
            stack.callback(member.kill)
            members.append(member.start())
        urls = ",".join(m.url for m in members)
        state = tmp_path / "state.json"
        env = {"SMOKE_ELECT_S": "30", "SMOKE_FAILOVER_S": "30", "SMOKE_REJOIN_S": "60"}
        before = run([str(REPLICATED), "before", urls, str(state)], env, timeout=90)
        assert before.returncode == 0, before.stderr + "".join(m.log() for m in members)
        leader = next(m for m in members if m.env["DQ_NODE"] == before.stdout.split()[-1])
        leader.kill()
        failover = run([str(REPLICATED), "failover", urls, str(state)], env, timeout=90)
        assert failover.returncode == 0, failover.stderr + "".join(m.log() for m in members)
        assert "all 20 acknowledged items delivered" in failover.stdout
        leader.start()
        rejoin = run([str(REPLICATED), "rejoin", urls, str(state)], env, timeout=120)
        assert rejoin.returncode == 0, rejoin.stderr + "".join(m.log() for m in members)


def test_replicated_check_fails_without_a_leader(server: LiveServer, tmp_path: Path) -> None:
    """A single node (no etcd) and two dead addresses: no leader is ever elected, and
    ``before`` gives up, saying so."""
    urls = ",".join([server.url, *(f"http://127.0.0.1:{free_port()}" for _ in range(2))])
    out = run(
        [str(REPLICATED), "before", urls, str(tmp_path / "state.json")], {"SMOKE_ELECT_S": "2"}
    )
    assert out.returncode == 1
    assert "one leader with a follower in its sync set" in out.stderr
    assert f"'{server.url}': ('single', 0, [])" in out.stderr, out.stderr


SETUP = REPO / "docker" / "podman-setup.sh"
#: apt-get's stand-in: records its arguments; ``install`` puts a stand-in of each package
#: in the stand-ins' directory
APT_GET = """echo "$*" >> LOG
[ "$1" = install ] || exit 0
for p in "$@"; do
    case "$p" in
        -*|install) ;;
        *) printf '#!/bin/sh\\necho "%s version 4.3.1"\\n' "$p" > "BIN/$p"; chmod +x "BIN/$p" ;;
    esac
done"""


def _stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def podman_setup(
    tmp_path: Path, *, have: tuple[str, ...], uid: int
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run docker/podman-setup.sh against stand-ins: ``have`` are the commands already
    installed, ``id -u`` answers ``uid``, and ``apt-get install`` records what it was
    asked for and installs stand-ins for it. Nothing of the machine is touched: as
    "root" the script writes its config to PODMAN_SETUP_CONF, so a script that did not
    read it would write /etc/containers/ of the machine running the tests (when that
    user may), and is not run."""
    if uid == 0:
        assert 'conf="${PODMAN_SETUP_CONF:-' in SETUP.read_text(), "refusing to run as root"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    calls = tmp_path / "apt-get.log"
    for name in ("bash", "mkdir", "cat", "dirname", "chmod"):
        (bin_dir / name).symlink_to(shutil.which(name) or f"/bin/{name}")
    _stub(bin_dir, "id", f"echo {uid}")
    apt_get = APT_GET.replace("LOG", str(calls)).replace("BIN", str(bin_dir))
    _stub(bin_dir, "apt-get", apt_get)
    for name in have:
        _stub(bin_dir, name, f'echo "{name} version 4.3.1"')
    env = {"PATH": str(bin_dir), "PODMAN_SETUP_SBIN": "", "HOME": str(tmp_path)}
    env["PODMAN_SETUP_CONF"] = str(tmp_path / "etc" / "containers.conf")
    done = subprocess.run(
        [str(bin_dir / "bash"), str(SETUP)], env=env, capture_output=True, text=True, timeout=60
    )
    return done, calls.read_text().splitlines() if calls.exists() else []


def test_podman_setup_installs_runc_when_podman_is_there_without_it(tmp_path: Path) -> None:
    """A machine with podman and no runc got no runc, and make docker-smoke failed with
    'default OCI runtime "runc" not found'."""
    done, apt = podman_setup(tmp_path, have=("podman",), uid=0)
    assert done.returncode == 0, done.stderr
    assert apt == ["update -qq", "install -y -qq runc"]
    assert "podman-setup: installing runc" in done.stderr
    assert 'runtime = "runc"' in (tmp_path / "etc" / "containers.conf").read_text()


def test_podman_setup_installs_both_or_nothing(tmp_path: Path) -> None:
    done, apt = podman_setup(tmp_path / "none", have=(), uid=0)
    assert done.returncode == 0 and apt == ["update -qq", "install -y -qq podman runc"]
    assert done.stdout.splitlines()[-1] == "podman version 4.3.1"  # the one installed
    done, apt = podman_setup(tmp_path / "both", have=("podman", "runc"), uid=0)
    assert done.returncode == 0 and apt == [], done.stderr


def test_podman_setup_without_root_names_what_to_install(tmp_path: Path) -> None:
    done, apt = podman_setup(tmp_path, have=("podman",), uid=1000)
    assert done.returncode == 1 and apt == []
    assert "podman-setup: runc missing and we are not root; install runc" in done.stderr
    assert not (tmp_path / "etc").exists()
