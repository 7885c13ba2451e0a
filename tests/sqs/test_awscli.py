"""The AWS CLI (``aws sqs ...`` from the ``awscli`` package) against a live server:
standard queues, FIFO queues (groups in order and held) and fair queues."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dq.client import Client
from tests.server.live import LiveServer

AWS = Path(sys.executable).with_name("aws")


def _aws(server: LiveServer, tmp: Path, *args: str) -> Any:
    done = _run(server, tmp, *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else None


def _run(server: LiveServer, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ACCESS_KEY_ID="cli",
        AWS_SECRET_ACCESS_KEY="unused",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_CONFIG_FILE=str(tmp / "no-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp / "no-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
        AWS_MAX_ATTEMPTS="1",
    )
    return subprocess.run(
        [str(AWS), "--endpoint-url", server.url, "--output", "json", "sqs", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_send_and_receive(server: LiveServer, tmp_path: Path) -> None:
    url = _aws(server, tmp_path, "create-queue", "--queue-name", "cli-jobs")["QueueUrl"]
    assert url == f"{server.url}/000000000000/cli-jobs"
    sent = _aws(
        server,
        tmp_path,
        "send-message",
        "--queue-url",
        url,
        "--message-body",
        "from the cli",
        "--message-attributes",
        '{"source": {"DataType": "String", "StringValue": "aws"}}',
    )
    got = _aws(
        server,
        tmp_path,
        "receive-message",
        "--queue-url",
        url,
        "--wait-time-seconds",
        "2",
        "--message-attribute-names",
        "All",
        "--attribute-names",
        "All",
    )
    (m,) = got["Messages"]
    assert m["Body"] == "from the cli"
    assert m["MessageId"] == sent["MessageId"]
    assert m["MessageAttributes"]["source"]["StringValue"] == "aws"
    assert m["Attributes"]["ApproximateReceiveCount"] == "1"
    _aws(
        server,
        tmp_path,
        "delete-message",
        "--queue-url",
        url,
        "--receipt-handle",
        m["ReceiptHandle"],
    )
    assert _aws(server, tmp_path, "receive-message", "--queue-url", url) is None
    attrs = _aws(
        server, tmp_path, "get-queue-attributes", "--queue-url", url, "--attribute-names", "All"
    )
    assert attrs["Attributes"]["ApproximateNumberOfMessages"] == "0"


def test_cli_fifo_queue(server: LiveServer, tmp_path: Path) -> None:
    """A FIFO queue from the command line: content-based deduplication, sequence
    numbers, the group, and SQS's refusal of a message without a group."""
    url = _aws(
        server, tmp_path, "create-queue", "--queue-name", "cli-orders.fifo",
        "--attributes", "FifoQueue=true,ContentBasedDeduplication=true",
    )["QueueUrl"]  # fmt: skip
    send = ("send-message", "--queue-url", url, "--message-group-id", "customer-7")
    first = _aws(server, tmp_path, *send, "--message-body", "open")
    again = _aws(server, tmp_path, *send, "--message-body", "open")
    second = _aws(server, tmp_path, *send, "--message-body", "charge")
    assert again["MessageId"] == first["MessageId"]
    assert again["SequenceNumber"] == first["SequenceNumber"]
    assert int(second["SequenceNumber"]) > int(first["SequenceNumber"])
    got = _aws(
        server, tmp_path, "receive-message", "--queue-url", url, "--attribute-names", "All",
        "--max-number-of-messages", "10",
    )  # fmt: skip
    m = got["Messages"][0]
    assert m["Body"] == "open"
    assert m["Attributes"]["MessageGroupId"] == "customer-7"
    assert m["Attributes"]["SequenceNumber"] == first["SequenceNumber"]
    refused = _run(server, tmp_path, "send-message", "--queue-url", url, "--message-body", "x")
    assert refused.returncode != 0
    assert "MissingParameter" in refused.stderr and "MessageGroupId" in refused.stderr
    attrs = _aws(
        server, tmp_path, "get-queue-attributes", "--queue-url", url, "--attribute-names", "All"
    )["Attributes"]
    assert attrs["FifoQueue"] == "true" and attrs["ContentBasedDeduplication"] == "true"


def _bodies(got: Any) -> list[str]:
    return sorted(m["Body"] for m in (got or {}).get("Messages", []))


@pytest.mark.integration
def test_cli_fifo_groups_in_order_and_held(server: LiveServer, tmp_path: Path) -> None:
    """A group's messages one at a time and in order, the group held while one is in
    flight (also once its visibility timeout ran out: it comes back ahead of the rest),
    the other group not held; a message's own delay refused as SQS refuses it."""
    url = _aws(
        server, tmp_path, "create-queue", "--queue-name", "cli-held.fifo",
        "--attributes", "FifoQueue=true,ContentBasedDeduplication=true",
    )["QueueUrl"]  # fmt: skip
    entries = [
        {"Id": body, "MessageBody": body, "MessageGroupId": group}
        for body, group in (("a1", "A"), ("a2", "A"), ("b1", "B"), ("b2", "B"))
    ]
    _aws(
        server, tmp_path, "send-message-batch", "--queue-url", url, "--entries", json.dumps(entries)
    )
    receive = ("receive-message", "--queue-url", url, "--max-number-of-messages", "10")
    handles: dict[str, str] = {}

    def got(*args: str) -> list[str]:
        answer = _aws(server, tmp_path, *receive, *args)
        handles.update({m["Body"]: m["ReceiptHandle"] for m in (answer or {}).get("Messages", [])})
        return _bodies(answer)

    # 8 s: longer than the next few CLI calls take on a busy machine
    assert got("--visibility-timeout", "8") == ["a1", "b1"]
    assert got() == []  # a2 and b2 wait behind their groups' first
    _aws(server, tmp_path, "delete-message", "--queue-url", url, "--receipt-handle", handles["b1"])
    assert got() == ["b2"]  # B goes on; A is still held by a1 in flight
    # the long poll's answer is a1 once its visibility timeout runs out: a1 again, not a2
    assert got("--wait-time-seconds", "20") == ["a1"]
    _aws(server, tmp_path, "delete-message", "--queue-url", url, "--receipt-handle", handles["a1"])
    assert got("--wait-time-seconds", "2") == ["a2"]
    refused = _run(
        server, tmp_path, "send-message", "--queue-url", url, "--message-body", "later",
        "--message-group-id", "A", "--delay-seconds", "5",
    )  # fmt: skip
    assert refused.returncode != 0
    assert "InvalidParameterValue" in refused.stderr and "DelaySeconds" in refused.stderr


@pytest.mark.integration
def test_cli_fair_queue(server: LiveServer, tmp_path: Path) -> None:
    """Tenants named by --message-group-id on a standard queue take turns: the quiet
    tenant's messages come in the first receive, ahead of the noisy one's backlog."""
    url = _aws(server, tmp_path, "create-queue", "--queue-name", "cli-tenants")["QueueUrl"]
    for tenant, first, n in (
        ("noisy", 0, 10),
        ("noisy", 10, 10),
        ("noisy", 20, 10),
        ("quiet", 0, 2),
    ):
        entries = [
            {"Id": f"m{i}", "MessageBody": f"{tenant}-{i}", "MessageGroupId": tenant}
            for i in range(first, first + n)
        ]
        _aws(
            server,
            tmp_path,
            "send-message-batch",
            "--queue-url",
            url,
            "--entries",
            json.dumps(entries),
        )
    with Client(server.url) as client:
        assert client.queue("cli-tenants").config.fair is True
    first_ten = _bodies(
        _aws(
            server,
            tmp_path,
            "receive-message",
            "--queue-url",
            url,
            "--max-number-of-messages",
            "10",
        )
    )
    assert {"quiet-0", "quiet-1"} <= set(first_ten), first_ten
