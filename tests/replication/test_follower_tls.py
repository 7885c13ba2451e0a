"""A follower reaching an HTTPS leader checks its certificate: against DQ_REPLICA_CA when
set (a private CA, or a self-signed certificate), else the system's CAs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from dq.server.replication.follower import Follower
from dq.server.replication.member import leader_tls
from dq.server.settings import Settings
from dq.storage import Engine, EngineConfig
from dq.storage.replication import KIND_CONTROL, Frame
from tests.replication.fake_leader import FakeLeader
from tests.server.certificate import NEEDS_OPENSSL, self_signed

# integration: a fake leader served over HTTPS
pytestmark = [pytest.mark.integration, NEEDS_OPENSSL]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    cert, key = self_signed(tmp_path_factory.mktemp("dq-tls"))
    return str(cert), str(key)


@pytest.fixture
def leader(certificate: tuple[str, str]) -> Iterator[FakeLeader]:
    with FakeLeader(epoch=2, tls=certificate) as fake:
        fake.add(Frame(1, "q", KIND_CONTROL, b'{"op":"put_queue","config":{}}'))
        yield fake


class Recording:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.installed = 0

    def set_role(self, writable: bool, leader: str | None) -> None:
        self.engine.set_role(writable, leader)

    def replace_queues(self, src_dir: str) -> None:
        self.engine.replace_queues(src_dir)
        self.installed += 1

    def apply(
        self, frames: list[Frame], stopping: Callable[[], bool] | None = None
    ) -> Future[None]:
        return self.engine.apply(frames, stopping)


def _follow(
    tmp_path: Path, leader: FakeLeader, settings: Settings
) -> tuple[Follower, Recording, list[tuple[str, str]], Engine]:
    engine = Engine.open(tmp_path / "f", EngineConfig(fsync="always"))
    recording = Recording(engine)
    reports: list[tuple[str, str]] = []
    follower = Follower(
        recording,
        str(tmp_path / "f"),
        "f1",
        ssl_context=leader_tls(settings),
        report=lambda code, message: reports.append((code, message)),
        wait_ms=100,
        backoff_s=(0.05, 0.05),
    )
    follower.follow(leader.url, 2)
    return follower, recording, reports, engine


def test_a_leader_checked_against_the_replica_ca_is_followed(
    tmp_path: Path, leader: FakeLeader, certificate: tuple[str, str]
) -> None:
    assert leader.url.startswith("https://")
    follower, recording, reports, engine = _follow(
        tmp_path, leader, Settings(replica_ca=certificate[0])
    )
    try:
        leader.wait_for(lambda: any(p.body["after"] == 1 for p in leader.pulls()))
        assert recording.installed == 1 and reports == []
        assert engine.list_queues() == ["q"]  # the frame pulled over HTTPS is applied
    finally:
        follower.stop()
        engine.close()


def test_without_the_ca_the_leader_is_refused_and_reported(
    tmp_path: Path, leader: FakeLeader
) -> None:
    follower, recording, reports, engine = _follow(tmp_path, leader, Settings())
    try:
        leader.wait_for(lambda: len(reports) >= 2)
        assert {code for code, _ in reports} == {"unreachable"}
        assert "CERTIFICATE_VERIFY_FAILED" in reports[0][1]
        assert recording.installed == 0 and leader.requests == []
    finally:
        follower.stop()
        engine.close()


def test_the_setting(tmp_path: Path) -> None:
    assert Settings.from_env({"DQ_REPLICA_CA": "/etc/dq/ca.pem"}).replica_ca == "/etc/dq/ca.pem"
    assert leader_tls(Settings()) is None
    with pytest.raises(FileNotFoundError):
        leader_tls(Settings(replica_ca=str(tmp_path / "missing.pem")))
