"""The lock files pin every dependency pyproject.toml names, at one version each.

`make run` installs ``requirements/serve.txt``, `make spark` ``requirements/spark.txt`` and
`make test` ``requirements/test.txt`` (hash-checked), never pyproject's ranges, so a dependency added to pyproject.toml but not
re-locked (`make lock`) would be missing on a fresh machine. This test says so first.
"""

from __future__ import annotations

import re
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.server.live import REPO

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.M)


def _pins(name: str) -> dict[str, str]:
    text = (REPO / "requirements" / name).read_text()
    return {canonicalize_name(n): v for n, v in _PIN.findall(text)}


def _project() -> dict[str, list[str]]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras: dict[str, list[str]] = data["optional-dependencies"]
    return {"serve": data["dependencies"], "test": extras["test"], "spark": extras["spark"]}


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def test_serving_lock_pins_every_runtime_dependency() -> None:
    missing = _names(_project()["serve"]) - set(_pins("serve.txt"))
    assert not missing, f"not in requirements/serve.txt (run `make lock`): {sorted(missing)}"


def test_test_lock_pins_everything_make_test_installs() -> None:
    deps = _project()
    wanted = _names(deps["serve"] + deps["test"] + deps["spark"])
    missing = wanted - set(_pins("test.txt"))
    assert not missing, f"not in requirements/test.txt (run `make lock`): {sorted(missing)}"


def test_spark_lock_pins_what_make_spark_installs() -> None:
    deps = _project()
    missing = _names(deps["serve"] + deps["spark"]) - set(_pins("spark.txt"))
    assert not missing, f"not in requirements/spark.txt (run `make lock`): {sorted(missing)}"


def test_locked_versions_satisfy_pyproject() -> None:
    pins = _pins("test.txt")
    deps = _project()
    for spec in deps["serve"] + deps["test"] + deps["spark"]:
        req = Requirement(spec)
        version = pins[canonicalize_name(req.name)]
        assert req.specifier.contains(version, prereleases=True), (spec, version)


@pytest.mark.parametrize("lock", ["serve.txt", "spark.txt"])
def test_serving_spark_and_test_locks_agree(lock: str) -> None:
    pins, test = _pins(lock), _pins("test.txt")
    differ = {n: (v, test.get(n)) for n, v in pins.items() if test.get(n) != v}
    assert not differ, f"{lock} then make test would change these versions: {differ}"


def test_pandas_is_one_pyspark_supports() -> None:
    """PySpark 4.3 warns at every session start with pandas 3 ("does not yet fully
    support pandas >= 3.0.0"): the Spark lock stays on pandas 2."""
    for lock in ("spark.txt", "test.txt"):
        assert Version(_pins(lock)["pandas"]) < Version("3"), lock
