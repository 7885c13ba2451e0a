"""Test files mirror the modules they test: ``storage/wal.py`` → ``tests/storage/test_wal.py``.

A module has logic when one of its functions branches or loops. Such a module is
*mirrored* when a test folder named after one of its packages (``tests/server`` or
``tests/replication`` for ``server/replication/follower.py``) holds ``test_<name>.py`` or
``test_<name>_<aspect>.py`` (``test_wal_corruption.py``), ``<name>`` without its leading
underscore (``client/_wire.py`` → ``tests/client/test_wire.py``).

The modules tested elsewhere, through the module that drives them or end to end, are in
``COVERED_ELSEWHERE`` under the test files that cover them. The list should only shrink:
a new module gets a test file of its name, and a module listed here that gets one must
leave the list (a test below says so).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("server", "storage", "shm", "client", "cli", "pipeline")

#: test file -> the modules it covers though they have no test file of their name
COVERED_ELSEWHERE: dict[str, tuple[str, ...]] = {
    # the command line, run as users run it
    "tests/cli/test_main.py": (
        "cli/_remote.py",
        "cli/admin.py",
        "cli/items.py",
        "cli/serve.py",
        "server/runner.py",
    ),
    "tests/cli/test_operate.py": ("cli/_local.py",),
    "tests/cli/test_times.py": ("cli/_format.py",),
    "tests/cli/test_storage_tools.py": ("storage/tools.py",),
    # the client's halves, against scripted and live servers
    "tests/client/test_http_transport.py": (
        "client/_async_client.py",
        "client/_common.py",
        "client/_transport.py",
        "client/errors.py",
    ),
    "tests/client/test_wire.py": ("client/types.py",),
    "tests/server/test_consumer_routes.py": (
        "client/groups.py",
        "server/consumer_schemas.py",
        "server/routers/consumers.py",
    ),
    # the Spark data source
    "tests/pipeline/test_spark_batch.py": ("pipeline/options.py", "pipeline/writer.py"),
    "tests/pipeline/test_spark_stream.py": (
        "pipeline/jobs/event_counts.py",
        "pipeline/jobs/produce_events.py",
    ),
    # the HTTP server: routes end to end, the fast path beside the framework
    "tests/server/test_e2e.py": (
        "server/routers/_common.py",
        "server/routers/items.py",
        "server/routers/queues.py",
    ),
    "tests/server/test_new_items.py": ("server/schemas.py",),
    "tests/server/test_hot_path.py": ("server/hot_routes.py",),
    "tests/server/test_known_heads.py": ("server/protocol.py",),
    "tests/server/test_lifespan.py": ("server/app.py",),
    "tests/server/test_hostile_input.py": (
        "server/batch_limit.py",
        "server/limits.py",
        "server/path_guard.py",
    ),
    "tests/server/test_auth_limits.py": ("server/dependencies.py",),
    "tests/server/test_metrics.py": ("server/calls.py",),
    "tests/server/test_durable_cancel.py": ("server/completions.py",),
    "tests/server/test_long_poll_parity.py": ("storage/waits.py",),
    "tests/server/test_operate_http.py": ("storage/moved.py",),
    "tests/server/test_errors.py": ("storage/errors.py",),
    "tests/server/test_keyed_batches.py": ("storage/dedup.py",),
    "tests/replication/test_routes.py": ("server/replication/hot_pull.py",),
    "tests/replication/test_follower_tls.py": ("server/replication/member.py",),
    # SQS, through boto3
    "tests/sqs/test_boto3.py": (
        "server/sqs/admin.py",
        "server/sqs/batches.py",
        "server/sqs/context.py",
        "server/sqs/params.py",
        "server/sqs/protocol.py",
        "server/sqs/queue_attrs.py",
        "server/sqs/receive.py",
        "server/sqs/receives.py",
        "server/sqs/send.py",
        "server/sqs/sidecar.py",
    ),
    "tests/sqs/test_redrive.py": ("server/sqs/moves.py",),
    # the shared-memory rings
    "tests/shm/test_server.py": ("shm/attach.py",),
    "tests/shm/test_command_ring.py": ("shm/command_codec.py", "shm/errors.py"),
    "tests/shm/test_broadcast_ring_events.py": (
        "shm/events.py",
        "shm/rings_host.py",
        "shm/subscriber.py",
    ),
    "tests/shm/test_submission_ring.py": ("shm/submission_drain.py", "shm/submitter.py"),
    "tests/shm/test_wpol.py": ("shm/model/explore.py",),
    # the storage engine: the queue's parts through the engine and its model
    "tests/storage/test_engine.py": (
        "storage/config.py",
        "storage/queue.py",
        "storage/types.py",
        "storage/validation.py",
        "storage/view.py",
    ),
    "tests/storage/test_operations.py": ("storage/browse.py", "storage/queue_state.py"),
    "tests/storage/test_retry.py": ("storage/item_notes.py",),
    "tests/storage/test_itemmeta_format_doc.py": ("storage/sidecar.py",),
    "tests/storage/test_faults_recovery.py": ("storage/queue_config.py",),
    "tests/storage/test_state_counts.py": ("storage/segment_counts.py",),
    "tests/storage/test_replication.py": ("storage/replica_engine.py",),
    "tests/storage/test_format_doc.py": ("storage/codec.py",),
    "tests/storage/test_merge.py": ("storage/compactor.py", "storage/merge_policy.py"),
    "tests/storage/test_powerloss.py": ("storage/fileio.py",),
    "tests/storage/test_write_future.py": ("storage/futures.py",),
    "tests/storage/test_fault_matrix.py": ("storage/worker.py", "storage/worker_wire.py"),
}

_BRANCHES = (
    ast.If,
    ast.IfExp,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.Try,
    ast.Match,
    ast.comprehension,
)


def has_logic(source: str) -> bool:
    """Whether a function (or method) in ``source`` branches or loops."""
    return any(
        isinstance(node, _BRANCHES)
        for func in ast.walk(ast.parse(source))
        if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in ast.walk(func)
    )


def mirrored(module: str, root: Path = ROOT) -> bool:
    """Whether ``module`` (``server/replication/follower.py``) has a test file of its name."""
    *packages, filename = module.split("/")
    name = filename.removesuffix(".py").lstrip("_")
    return any(
        test.stem == f"test_{name}" or test.stem.startswith(f"test_{name}_")
        for package in packages
        for test in (root / "tests" / package).glob("test_*.py")
    )


@functools.cache
def modules_with_logic(root: Path = ROOT) -> list[str]:
    return sorted(
        path.relative_to(root).as_posix()
        for package in PACKAGES
        for path in (root / package).rglob("*.py")
        if path.name != "__init__.py" and has_logic(path.read_text())
    )


def _listed() -> list[str]:
    return [module for modules in COVERED_ELSEWHERE.values() for module in modules]


def test_every_module_with_logic_has_a_test_file_of_its_name_or_says_where_it_is_tested() -> None:
    listed = set(_listed())
    missing = [m for m in modules_with_logic() if not mirrored(m) and m not in listed]
    assert missing == [], (
        "these modules have no test file of their name (tests/<package>/test_<name>.py):\n"
        + "\n".join(missing)
        + "\nadd one, or list the module in COVERED_ELSEWHERE under the test that covers it"
    )


def test_the_list_of_modules_tested_elsewhere_is_current() -> None:
    listed = _listed()
    assert len(listed) == len(set(listed)), "a module is listed twice"
    with_logic = set(modules_with_logic())
    stale = [m for m in listed if m not in with_logic]
    assert stale == [], f"gone, or without logic now: take them off the list: {stale}"
    now_mirrored = [m for m in listed if mirrored(m)]
    assert now_mirrored == [], f"these have a test file of their name now: unlist {now_mirrored}"
    no_such_test = [t for t in COVERED_ELSEWHERE if not (ROOT / t).is_file()]
    assert no_such_test == [], f"no such test file: {no_such_test}"


def test_the_scan_sees_the_packages() -> None:
    found = modules_with_logic()
    assert {"storage/wal.py", "server/replication/follower.py", "client/_wire.py"} <= set(found)
    assert "storage/wal.py" in found and mirrored("storage/wal.py")
    assert len(found) > 100


def test_logic_is_a_branch_or_a_loop_in_a_function() -> None:
    assert not has_logic("X = 1\nclass A:\n    y: int = 2\n")
    assert not has_logic("def f(x):\n    return x + 1\n")
    assert not has_logic("if X:\n    Y = 1\n")  # at module level: set-up, not logic
    for body in ("if x: pass", "for i in x: pass", "return [i for i in x]", "return a if x else b"):
        assert has_logic(f"class A:\n    def f(self, x):\n        {body}\n"), body


def test_a_test_file_of_the_name_in_a_folder_of_one_of_the_packages_mirrors(
    tmp_path: Path,
) -> None:
    for test in ("server/test_hot_path.py", "replication/test_follower_tls.py"):
        (tmp_path / "tests" / test).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tests" / test).write_text("")
    assert mirrored("server/replication/follower.py", tmp_path)  # test_follower_tls.py
    assert mirrored("server/_hot.py", tmp_path)  # test_hot_path.py, underscore dropped
    assert not mirrored("server/replication/follow.py", tmp_path)  # not test_follow*.py
    assert not mirrored("storage/follower.py", tmp_path)  # tests/storage has none
    assert not mirrored("server/tls.py", tmp_path)  # a name must start the test's name
