"""The AWS CLI (``aws sqs ...`` from the ``awscli`` package) against a live server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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
