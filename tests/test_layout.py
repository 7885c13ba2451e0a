"""The repository's folders are installed as one namespace, ``dq``: code imports them as such.

``server/``, ``storage/`` ... install as ``dq.server``, ``dq.storage`` ... (pyproject.toml's
package-dir mapping). Importing a bare ``server`` only works from the repository root and would
load a second copy of a module beside its ``dq.`` twin, so no file of ours may do it, neither as
an import statement nor as a module name in a string (``importlib``, ``python -m``).
"""

from __future__ import annotations

import ast
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


def _bare_imports(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
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
