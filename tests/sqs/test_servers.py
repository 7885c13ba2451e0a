"""SQS against servers set up otherwise: tokens (SigV4), relaxed limits, a crash."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.server.live import LiveServer, live_server
from tests.server.threaded import threaded_server
from tests.sqs.conftest import SERVER_ENV, sqs_client

pytestmark = pytest.mark.integration  # live dq serve processes


def test_tokens_require_a_valid_signature(tmp_path: Path) -> None:
    env = {**SERVER_ENV, "DQ_TOKENS": "tok-a,tok-b"}
    with live_server(tmp_path / "data", env=env) as server:
        good = sqs_client(server.url, aws_access_key_id="anyone", aws_secret_access_key="tok-b")
        url = good.create_queue(QueueName="signed")["QueueUrl"]
        good.send_message(QueueUrl=url, MessageBody="ok")
        (m,) = good.receive_message(QueueUrl=url)["Messages"]
        assert m["Body"] == "ok"

        bad = sqs_client(server.url, aws_access_key_id="anyone", aws_secret_access_key="tok-c")
        with pytest.raises(ClientError) as exc:
            bad.send_message(QueueUrl=url, MessageBody="no")
        assert exc.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
        assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403

        import boto3

        unsigned = boto3.client(
            "sqs",
            endpoint_url=server.url,
            region_name="us-east-1",
            config=Config(signature_version=UNSIGNED, retries={"max_attempts": 1}),
        )
        with pytest.raises(ClientError) as exc:
            unsigned.list_queues()
        assert exc.value.response["Error"]["Code"] == "MissingAuthenticationToken"
        # the native API keeps its bearer tokens
        import httpx

        assert httpx.get(server.url + "/v1/queues").status_code == 401
        r = httpx.get(server.url + "/v1/queues", headers={"Authorization": "Bearer tok-a"})
        assert r.status_code == 200


def test_creating_a_queue_past_the_servers_limit_is_over_limit(tmp_path: Path) -> None:
    """One queue more than the server holds is SQS's ``OverLimit`` (403, which SDKs do
    not retry), not an internal error that they retry."""
    with threaded_server(tmp_path / "data") as server:
        sqs = sqs_client(server.url)
        sqs.create_queue(QueueName="first")
        engine = server.engine
        engine.config = replace(engine.config, max_queues=len(engine.list_queues()))
        with pytest.raises(sqs.exceptions.OverLimit) as exc:
            sqs.create_queue(QueueName="one-too-many")
        assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        assert "first" in sqs.list_queues()["QueueUrls"][0]


def test_relaxed_limits(tmp_path: Path) -> None:
    env = {**SERVER_ENV, "DQ_SQS_RELAXED": "1"}
    with live_server(tmp_path / "data", env=env) as server:
        sqs = sqs_client(server.url)
        url = sqs.create_queue(QueueName="big", Attributes={"DelaySeconds": "0"})["QueueUrl"]
        entries = [{"Id": f"m{i}", "MessageBody": f"{i}"} for i in range(50)]
        assert len(sqs.send_message_batch(QueueUrl=url, Entries=entries)["Successful"]) == 50
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=50)["Messages"]
        assert len(got) == 50
        big = "x" * (600 * 1024)
        sqs.send_message(QueueUrl=url, MessageBody=big)
        sqs.send_message(QueueUrl=url, MessageBody="next week", DelaySeconds=7 * 86400)
        attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert attrs["ApproximateNumberOfMessagesDelayed"] == "1"
        # the size limit the queue applies (dq's value limit), not SQS's 256 KiB
        assert attrs["MaximumMessageSize"] == str(1 << 20)
        (m,) = sqs.receive_message(QueueUrl=url)["Messages"]
        assert m["Body"] == big
        with pytest.raises(ClientError):  # dq's own value limit still holds
            sqs.send_message(QueueUrl=url, MessageBody="x" * ((1 << 20) + 1))
        # within the limit by SQS's count, over it once stored with its envelope: only
        # that entry of the batch fails
        attr = {"a": {"DataType": "String", "StringValue": "v"}}
        near = "x" * ((1 << 20) - 20)
        res = sqs.send_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": "ok", "MessageBody": "small", "MessageAttributes": attr},
                {"Id": "big", "MessageBody": near, "MessageAttributes": attr},
            ],
        )
        assert [e["Id"] for e in res["Successful"]] == ["ok"]
        assert [(e["Id"], e["Code"]) for e in res["Failed"]] == [("big", "InvalidParameterValue")]


def _receive_all(sqs: Any, url: str, want: int) -> list[Any]:
    got: list[Any] = []
    give_up = time.monotonic() + 15
    while len(got) < want and time.monotonic() < give_up:
        got += sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, MessageAttributeNames=["All"]
        ).get("Messages", [])
    return got


def test_messages_and_attributes_survive_sigkill(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = LiveServer(data, fsync="always", env=SERVER_ENV).start()
    try:
        sqs = sqs_client(server.url)
        url = sqs.create_queue(
            QueueName="durable",
            Attributes={
                "VisibilityTimeout": "9",
                "DelaySeconds": "0",
                "MessageRetentionPeriod": "600",
            },
            tags={"k": "v"},
        )["QueueUrl"]
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"ReceiveMessageWaitTimeSeconds": "2"})
        attrs = {"color": {"DataType": "String", "StringValue": "red"}}
        sent = [
            sqs.send_message(QueueUrl=url, MessageBody=f"m{i}", MessageAttributes=attrs)
            for i in range(5)
        ]
        leased = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2)["Messages"]
        assert len(leased) == 2
        server.kill()  # SIGKILL: no shutdown, no flush
        server = LiveServer(data, fsync="always", env=SERVER_ENV, port=server.port).start()
        sqs = sqs_client(server.url)
        got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert got["VisibilityTimeout"] == "9"
        assert got["ReceiveMessageWaitTimeSeconds"] == "2"
        assert got["MessageRetentionPeriod"] == "600"
        assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"k": "v"}
        # every message is back (the two leased ones too: receipts do not survive)
        back = _receive_all(sqs, url, 5)
        assert sorted(m["MessageId"] for m in back) == sorted(s["MessageId"] for s in sent)
        for m in back:
            assert m["MessageAttributes"] == attrs
            assert m["MD5OfMessageAttributes"] == sent[0]["MD5OfMessageAttributes"]
        stale = leased[0]["ReceiptHandle"]
        with pytest.raises(ClientError):
            sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=stale, VisibilityTimeout=1)
    finally:
        server.kill()
