"""The Jepsen-style run: three etcd members and three replicated ``dq serve`` in network
namespaces, a workload, every fault of ``tests/jepsen/nemesis.py``, then the checker.

Needs root (namespaces, iptables, tc) and etcd; skips with the reason otherwise. The
nemesis runs ``DQ_JEPSEN_SECONDS`` (default 40; for a longer run set it higher), and at
least one of each fault. Once drained, every member must hold the same items. A failed
run's artifacts (history, checker report, every process's log) stay in
``$DQ_JEPSEN_ARTIFACTS`` or ``tests/jepsen/artifacts/<time>-<pid>/`` and the failure
message names the directory; a passing run's are removed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from tests.jepsen.checker import check
from tests.jepsen.history import load
from tests.jepsen.nemesis import FAULTS, LEADER_LOSING
from tests.jepsen.support import REPO, artifacts_dir, runner_argv, runner_env, why_not
from tests.jepsen.workload import TIMEOUT_S

SECONDS = float(os.environ.get("DQ_JEPSEN_SECONDS", "40"))
_SKIP = why_not()
# integration: clusters of processes in network namespaces
pytestmark = [pytest.mark.integration, pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")]


@pytest.mark.timeout(SECONDS + 400)
def test_replicated_queue_survives_the_nemesis() -> None:
    out = artifacts_dir()
    where = f"artifacts kept in {out}"
    run = subprocess.run(
        runner_argv(out, "--seconds", str(SECONDS)),
        cwd=REPO,
        env=runner_env(),
        capture_output=True,
        text=True,
        timeout=SECONDS + 360,
    )
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    assert run.returncode == 0, (
        f"the run failed ({where}): {summary.get('error')}\n{run.stderr[-2000:]}"
    )
    report = check(load(out / "history.jsonl"))
    assert report.ok, f"checker failed ({where}):\n{report.describe()}"
    applied = {f["fault"] for f in summary["faults"] if "skipped" not in f}
    assert applied == set(FAULTS), f"faults not applied ({where}): {summary['faults']}"
    no_leader = [f for f in summary["faults"] if f.get("leader_after_s") is None]
    assert not no_leader, f"no leader after a heal ({where}): {no_leader}"
    kept = [
        f for f in summary["faults"]
        if f["fault"] in LEADER_LOSING and "skipped" not in f
        and f["epoch_after"] <= f["epoch_before"]
    ]  # fmt: skip
    assert not kept, f"the leader outlived a fault that takes it away ({where}): {kept}"
    # a leader stopped for many leases: the writes go on at the new leader a client
    # timeout after its election (the requests in flight at the stop time out), long
    # before the stopped one wakes
    stalls = [f for f in summary["faults"] if f["fault"] == "stall_leader" and "skipped" not in f]
    measured = [o for o in summary["outages"] if o["fault"] == "stall_leader"]
    assert stalls and len(stalls) == len(measured), f"stall_leader not measured ({where})"
    for stall, outage in zip(stalls, measured, strict=True):
        assert "elected_after_s" in stall, f"no new leader in a stall ({where}): {stall}"
        bound = stall["elected_after_s"] + TIMEOUT_S + 3.0
        after = outage["writes_after_s"]
        assert after is not None and after <= bound, (
            f"writes stopped {after} s in a leader stall, elected after "
            f"{stall['elected_after_s']} s ({where}): {outage}"
        )
        assert after < outage["healed_after_s"] and outage["acked_during"] > 0, (where, outage)
    assert summary["missing"] == 0, where
    replicas = summary["replicas"]
    views = {tuple(sorted(v.items())) for v in replicas["nodes"].values()}
    assert replicas["caught_up"] and len(views) == 1, f"members disagree ({where}): {replicas}"
    assert report.summary["enqueue"].get("ok", 0) >= 100, f"too few acknowledged ({where})"
    shutil.rmtree(out)
