"""Fair queues through boto3 against ``dq serve`` (docs/sqs.md, "Fair queues"): a
``MessageGroupId`` on a standard queue names the tenant and makes the queue fair, so a
tenant's backlog does not hold up another tenant's messages."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from dq.client import Client
from tests.server.live import LiveServer


def _send(sqs: Any, url: str, tenant: str, n: int) -> None:
    for i in range(0, n, 10):
        sqs.send_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": f"m{j}", "MessageBody": f"{tenant}-{j}", "MessageGroupId": tenant}
                for j in range(i, min(n, i + 10))
            ],
        )


def _served(sqs: Any, url: str, n: int) -> list[str]:
    """``n`` messages received ten at a time, each batch deleted: the order they are
    served in."""
    out: list[str] = []
    while len(out) < n:
        got = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=2, VisibilityTimeout=60
        ).get("Messages", [])
        assert got, f"nothing more after {len(out)} of {n}"
        out += [m["Body"] for m in got]
        sqs.delete_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)
            ],
        )
    return out


@pytest.mark.integration
def test_a_noisy_tenant_does_not_starve_a_quiet_one(
    sqs: Any, server: LiveServer, qname: str
) -> None:
    """1,000 messages of one tenant, then 10 of another: the tenants take turns, so the
    quiet tenant's 10 are among the first deliveries, not after the noisy backlog."""
    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    with Client(server.url) as client:
        assert client.queue(qname).config.fair is False  # no group yet: dequeue's plain walk
        _send(sqs, url, "noisy", 1000)
        _send(sqs, url, "quiet", 10)
        assert client.queue(qname).config.fair is True
    served = _served(sqs, url, 1010)
    quiet = [i for i, body in enumerate(served) if body.startswith("quiet-")]
    assert max(quiet) < 20, quiet  # turn by turn: all 10 within the first 20
    assert [served[i] for i in quiet] == [f"quiet-{j}" for j in range(10)]  # each in order
    assert [b for b in served if b.startswith("noisy-")] == [f"noisy-{j}" for j in range(1000)]
    assert "Messages" not in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)


@pytest.mark.integration
def test_fair_is_turned_on_once(sqs: Any, server: LiveServer, qname: str) -> None:
    """A queue made natively becomes fair at its first grouped SQS message; an operator
    who turns ``fair`` off afterwards is not overruled by the next one."""
    with Client(server.url) as client:
        client.put_queue(qname)
        url = sqs.get_queue_url(QueueName=qname)["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody="plain")
        assert client.queue(qname).config.fair is False
        sqs.send_message(QueueUrl=url, MessageBody="t", MessageGroupId="tenant-a")
        config = client.queue(qname).config
        assert config.fair is True
        client.put_queue(qname, replace(config, fair=False))
        sqs.send_message(QueueUrl=url, MessageBody="t", MessageGroupId="tenant-b")
        assert client.queue(qname).config.fair is False


@pytest.mark.integration
def test_a_standard_queue_without_groups_stays_as_it_is(
    sqs: Any, server: LiveServer, qname: str
) -> None:
    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="plain")
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "plain too"}])
    with Client(server.url) as client:
        config = client.queue(qname).config
    assert config.fair is False and config.group_limit is None
