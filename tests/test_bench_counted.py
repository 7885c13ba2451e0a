"""bench/counted.py, the parts bench/hot_split.py and bench/ring_split.py share, checked
without valgrind: which module a call is counted under, how the counts print, the
options both take, and a few operations counted by hot_split's own child."""

from __future__ import annotations

import pytest

from bench import counted, hot_split


def test_a_call_counts_under_our_module_or_under_others() -> None:
    assert counted.module_of("/work/wt/x/storage/queue.py") == "storage/queue.py"
    assert counted.module_of("/tmp/dq-tree-1/dq/shm/command_handler.py") == (
        "shm/command_handler.py"
    )
    assert counted.module_of("/usr/lib/python3.11/json/decoder.py") == counted.OTHERS
    # an installed package's folder of the same name is not ours
    site = "/work/.venv/lib/python3.11/site-packages/uvicorn/server/x.py"
    assert counted.module_of(site) == counted.OTHERS
    assert counted.module_of("/work/wt/x/storage/_memseg.c") == counted.OTHERS


def test_call_counts_print_the_total_then_each_module_most_first(
    capsys: pytest.CaptureFixture[str],
) -> None:
    counted.print_calls({"storage/wal.py": 4.0, "storage/queue.py": 11.0, "a.py": 0.4})
    assert capsys.readouterr().out == (
        "Python calls: 15.4\n  storage/queue.py: 11.0\n  storage/wal.py: 4.0\n"
    )


def test_a_split_prints_each_part_and_takes_the_enqueue_off_the_dequeue(
    capsys: pytest.CaptureFixture[str],
) -> None:
    calls = {"enqueue": {"a.py": 2.0}, "dequeue": {"b.py": 5.0}}
    counted.print_split(
        calls, {"enqueue": 100.0, "dequeue": 350.0}.__getitem__, ("E", "D"), "# {title}"
    )
    assert capsys.readouterr().out == (
        "# E\nPython calls: 2.0\n  a.py: 2.0\ninstructions: 100\n"
        "# D\nPython calls: 5.0\n  b.py: 5.0\ninstructions: 250\n"
    )
    counted.print_split(calls, None, ("E", "D"), "# {title}")
    assert "instructions" not in capsys.readouterr().out


def test_the_options_both_take() -> None:
    ap = counted.options("First paragraph.\n\nMore.", 300, "requests", ["work", "calls"])
    assert ap.description == "First paragraph."
    args = ap.parse_args([])
    assert (args.ops, args.tree, args.no_valgrind, args.child, args.part) == (
        300,
        None,
        False,
        None,
        "enqueue",
    )
    assert "requests of each part (N)" in ap.format_help()
    with pytest.raises(SystemExit):
        ap.parse_args(["--child", "replay"])


def test_hot_splits_child_counts_calls_by_module() -> None:
    calls = hot_split.child_calls(5)
    enqueue, dequeue = calls["enqueue"], calls["dequeue"]
    assert enqueue["storage/engine.py"] >= 1 and enqueue["storage/wal.py"] >= 1
    assert enqueue["memseg add_pending"] == 1.0
    assert dequeue["memseg next_after"] >= 1
    # every key is a module of ours, the others, or a call into the in-memory segment
    for key in (*enqueue, *dequeue):
        assert key == counted.OTHERS or key.startswith("memseg ") or key.endswith(".py"), key
        assert not key.startswith("bench/"), key
