"""The deploy files agree with the server they deploy.

Every ``DQ_*`` name the compose file or the Dockerfile sets is one the server reads, and
``docs/deploy.md`` documents every variable the server reads; a new setting fails here
until it is documented.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import yaml

from dq.server.settings import Settings

REPO = Path(__file__).resolve().parents[2]
SETTINGS_VARS = {"DQ_" + f.name.upper() for f in dataclasses.fields(Settings) if f.name != "extra"}


def test_compose_sets_only_variables_the_server_reads() -> None:
    compose = yaml.safe_load((REPO / "docker" / "docker-compose.yml").read_text())
    env = compose["services"]["dq"]["environment"]
    names = set(env)
    assert names, "the dq service passes no DQ_* configuration"
    assert names <= SETTINGS_VARS, f"unknown to server/settings.py: {names - SETTINGS_VARS}"
    assert compose["services"]["dq"]["volumes"] == ["dq-data:/var/lib/dq"]
    assert "dq-data" in compose["volumes"]
    assert compose["services"]["spark-job"]["profiles"] == ["spark"]


def test_dockerfile_sets_only_variables_the_server_reads() -> None:
    text = (REPO / "docker" / "Dockerfile").read_text()
    names = set(re.findall(r"\b(DQ_[A-Z_]+)=", text))
    assert {"DQ_DATA_DIR", "DQ_PORT"} <= names
    # DQ_URL belongs to the Spark image's wait-for-dq entrypoint, not to the server.
    assert names - {"DQ_URL"} <= SETTINGS_VARS


def test_deploy_doc_lists_every_setting() -> None:
    doc = (REPO / "docs" / "deploy.md").read_text()
    documented = set(re.findall(r"^\| `(DQ_[A-Z_]+)` \|", doc, flags=re.MULTILINE))
    missing = SETTINGS_VARS - documented
    assert not missing, f"docs/deploy.md does not document {sorted(missing)}"
