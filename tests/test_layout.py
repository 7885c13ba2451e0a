"""The repository's folders are installed as one namespace, ``dq``: code imports them as such.

``server/``, ``storage/`` ... install as ``dq.server``, ``dq.storage`` ... (pyproject.toml's
package-dir mapping). Importing a bare ``server`` only works from the repository root and would
load a second copy of a module beside its ``dq.`` twin, so no file of ours may do it, neither as
an import statement nor as a module name in a string (``importlib``, ``python -m``).
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("server", "storage", "shm", "client", "cli", "pipeline")
SKIP = {".venv", ".git", "build", ".typecheck", "node_modules"}
MODULE_NAME = re.compile(rf"^({'|'.join(PACKAGES)})(\.[a-z_][a-z0-9_]*)+$")


def _python_files() -> list[Path]:
    return sorted(
        p
        for p in ROOT.rglob("*.py")
        if not SKIP.intersection(p.relative_to(ROOT).parts)
        and not p.relative_to(ROOT).parts[0].endswith(".egg-info")
    )


def _is_our_module(dotted: str, root: Path) -> bool:
    """``server.app`` names one of our modules if server/app.py or server/app/ exists."""
    path = root.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


@functools.cache
def _tree(path: Path) -> ast.Module:
    """Each file parsed once for all the checks (several walk every module)."""
    return ast.parse(path.read_text(), str(path))


def _bare_imports(path: Path, root: Path = ROOT) -> list[str]:
    tree = _tree(path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and MODULE_NAME.match(node.value)
            and _is_our_module(node.value, root)
        ):
            names = [node.value]
        else:
            continue
        found += [
            f"{path.relative_to(root)}:{node.lineno}: {name}"
            for name in names
            if name.split(".")[0] in PACKAGES
        ]
    return found


def test_the_scan_sees_the_repository() -> None:
    files = {p.relative_to(ROOT).as_posix() for p in _python_files()}
    assert {"server/app.py", "cli/main.py", "tests/test_layout.py", "bench/engine.py"} <= files


def test_no_file_imports_a_bare_top_level_package() -> None:
    bad = [hit for path in _python_files() for hit in _bare_imports(path)]
    assert bad == [], "import these through dq.*:\n" + "\n".join(bad)


def test_the_scan_catches_bare_imports(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import server\nfrom storage.codec import encode\nimport dq.client\n"
        "importlib.import_module('shm.server')\nlog = 'server.log'\n"
    )
    (tmp_path / "shm").mkdir()
    (tmp_path / "shm" / "server.py").touch()
    hits = [h.split(": ", 1)[1].replace(".", "/") for h in _bare_imports(sample, tmp_path)]
    assert hits == ["server", "storage/codec", "shm/server"]  # written as paths: not flagged


@pytest.mark.parametrize("name", [f"dq.{p}" for p in PACKAGES])
def test_dq_packages_import_from_the_repository_folders(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__file__ is not None
    assert Path(module.__file__).resolve().parent == ROOT / name.removeprefix("dq.")


def test_the_c_extension_is_dq_shm_atomics() -> None:
    atomics = importlib.import_module("dq.shm._atomics")
    assert atomics.__name__ == "dq.shm._atomics"


# -- layers: storage/ at the bottom, then shm/ and server/, then cli/ and client/, then
# pipeline/ (docs/architecture.md). The graph is read with ast from every module of ours.

#: What client/ may import of shm/ and storage/: ring layouts, the client side of the
#: rings, and wire types, never the engine. Checked on client's own imports, and on
#: everything those import in turn (``CLIENT_NEVER_REACHES``).
CLIENT_MAY_IMPORT = frozenset(
    {
        "dq.shm.attach",
        "dq.shm.command_codec",
        "dq.shm.command_ring",
        "dq.shm.errors",
        "dq.shm.subscriber",
        "dq.storage.validation",  # the rules' words, for the client's own checks
    }
)
CLIENT_NEVER_REACHES = (
    "dq.server",
    "dq.cli",
    "dq.pipeline",
    "dq.storage.engine",
    "dq.storage.queue",
)

#: Packages whose modules still import each other in a circle through imports deferred
#: into functions or ``if TYPE_CHECKING`` (none does at module level): client/_client.py
#: and _async_client.py build jobs.Consumer, which takes a client. Each closes only
#: through an ``if TYPE_CHECKING`` import (``test_no_import_circles_at_run_time`` holds
#: them to that). Strict: the test fails once a package is clean, so it leaves the list.
DEFERRED_CIRCLES = {"client"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["dq", *parts])


def _our_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in _python_files() if p.relative_to(ROOT).parts[0] in PACKAGES}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_import_nodes(node: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can ever run, in functions too (not ``if TYPE_CHECKING``)."""
    found: list[ast.Import | ast.ImportFrom] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                found += _runtime_import_nodes(other)
            continue
        if isinstance(child, ast.Import | ast.ImportFrom):
            found.append(child)
        found += _runtime_import_nodes(child)
    return found


def _import_nodes(
    tree: ast.Module, *, module_level: bool, runtime: bool = False
) -> list[ast.Import | ast.ImportFrom]:
    """Import statements; ``module_level``: only those that run when the module is
    imported (not in functions or classes, not under ``if TYPE_CHECKING``); ``runtime``:
    every one that can run, at any time (not under ``if TYPE_CHECKING``)."""
    if runtime:
        return _runtime_import_nodes(tree)
    if not module_level:
        return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    found: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node):
                todo += node.body
            todo += node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody
            for handler in node.handlers:
                todo += handler.body
        elif isinstance(node, ast.With):
            todo += node.body
    return found


def _targets(name: str, path: Path, node: ast.Import | ast.ImportFrom, known: set[str]) -> set[str]:
    """Our modules one import statement names (``from dq.x import y``: ``dq.x.y`` when it
    is a module, else ``dq.x``)."""
    if isinstance(node, ast.Import):
        bases = [alias.name for alias in node.names]
        return {b for b in bases if b in known}
    if node.level:
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{node.module}" if node.module else package
    else:
        base = node.module or ""
    out = set()
    for alias in node.names:
        if f"{base}.{alias.name}" in known:
            out.add(f"{base}.{alias.name}")
        elif _is_compiled(f"{base}.{alias.name}"):
            continue  # ``from dq.storage import _wal``: a C extension imports none of ours
        elif base in known:
            out.add(base)
    return out


def _is_compiled(dotted: str) -> bool:
    """``dq.storage._wal`` is one of our compiled modules if storage/_wal.c exists."""
    parts = dotted.split(".")
    if parts[0] == "dq":
        parts = parts[1:]
    return bool(parts) and ROOT.joinpath(*parts).with_suffix(".c").is_file()


@functools.cache
def _graph(*, module_level: bool, runtime: bool = False) -> dict[str, set[str]]:
    modules = _our_modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = _tree(path)
        edges: set[str] = set()
        for node in _import_nodes(tree, module_level=module_level, runtime=runtime):
            edges |= _targets(name, path, node, known)
        graph[name] = edges - {name}
    return graph


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_storage_imports_nothing_of_ours_above_it() -> None:
    graph = _graph(module_level=False)
    bad = [
        f"{m} imports {t}"
        for m, targets in sorted(graph.items())
        if _within(m, "dq.storage")
        for t in sorted(targets)
        if not _within(t, "dq.storage")
    ]
    assert bad == []


def test_client_imports_only_ring_layouts_and_wire_types_below_it() -> None:
    graph = _graph(module_level=False)
    bad = [
        f"{m} imports {t}"
        for m, targets in sorted(graph.items())
        if _within(m, "dq.client")
        for t in sorted(targets)
        if not _within(t, "dq.client") and t not in CLIENT_MAY_IMPORT
    ]
    assert bad == []
    reached: set[str] = set()
    todo = [m for m in graph if _within(m, "dq.client")]
    while todo:
        m = todo.pop()
        for t in graph[m] - reached:
            reached.add(t)
            todo.append(t)
    assert sorted(t for t in reached if any(_within(t, p) for p in CLIENT_NEVER_REACHES)) == []


def test_the_graph_sees_imports() -> None:
    graph = _graph(module_level=True)
    assert "dq.storage.types" in graph["dq.storage.engine"]
    assert "dq.client.jobs" not in graph["dq.client._client"]  # deferred and TYPE_CHECKING
    assert "dq.client.jobs" in _graph(module_level=False)["dq.client._client"]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles() -> None:
    """Among the imports that run when a module is imported (not under TYPE_CHECKING)."""
    circles = [" <-> ".join(c) for c in _circles(_graph(module_level=True))]
    assert circles == [], "import circles:\n" + "\n".join(circles)


def test_no_import_circles_at_run_time() -> None:
    """Among every import that can run, deferred ones in functions included: what is left
    in ``DEFERRED_CIRCLES`` below is type-only (``if TYPE_CHECKING``: the client's helpers
    name ``Client``), never an import that executes in a circle."""
    graph = _graph(module_level=False, runtime=True)
    assert "dq.client.jobs" in graph["dq.client._client"]  # deferred imports are seen
    circles = [" <-> ".join(c) for c in _circles(graph)]
    assert circles == [], "import circles:\n" + "\n".join(circles)


@pytest.mark.parametrize(
    "package",
    [
        pytest.param(p, marks=pytest.mark.xfail(strict=True, reason="see DEFERRED_CIRCLES"))
        if p in DEFERRED_CIRCLES
        else p
        for p in PACKAGES
    ],
)
def test_no_import_circles_through_deferred_imports(package: str) -> None:
    """Counting imports inside functions too: a deferred import that closes a circle
    hides a knot rather than removing it."""
    graph = _graph(module_level=False)
    circles = [
        " <-> ".join(c) for c in _circles(graph) if any(_within(m, f"dq.{package}") for m in c)
    ]
    assert circles == [], "import circles:\n" + "\n".join(circles)
