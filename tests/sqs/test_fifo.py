"""FIFO queues through boto3 against ``dq serve`` (docs/sqs.md, "FIFO queues"): names
and attributes, what FIFO refuses (in SQS's words), sequence numbers, deduplication
within the window and after it, ``ReceiveRequestAttemptId`` retries, and a message's
group as the item's group."""

from __future__ import annotations

import hashlib
import random
import threading
import time
from dataclasses import replace
from typing import Any

import pytest
from botocore.exceptions import ClientError

from dq.client import Client
from tests.server.live import LiveServer
from tests.sqs.conftest import sqs_client


def _error(exc: pytest.ExceptionInfo[ClientError]) -> dict[str, Any]:
    return exc.value.response["Error"]  # type: ignore[no-any-return]


def _fifo(sqs: Any, name: str, **attributes: str) -> str:
    url: str = sqs.create_queue(
        QueueName=name + ".fifo", Attributes={"FifoQueue": "true", **attributes}
    )["QueueUrl"]
    return url


def _count(sqs: Any, url: str) -> int:
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return sum(
        int(attrs[a])
        for a in (
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        )
    )


def test_a_fifo_queue_is_named_so_and_says_so(sqs: Any, qname: str) -> None:
    with pytest.raises(ClientError) as exc:  # FIFO needs the suffix
        sqs.create_queue(QueueName=qname, Attributes={"FifoQueue": "true"})
    assert _error(exc)["Code"] == "InvalidParameterValue"
    assert "must end with .fifo suffix" in _error(exc)["Message"]
    with pytest.raises(ClientError) as exc:  # and the suffix needs FIFO
        sqs.create_queue(QueueName=qname + ".fifo")
    assert _error(exc)["Code"] == "InvalidParameterValue"
    for attribute, value in (("FifoQueue", "false"), ("ContentBasedDeduplication", "true")):
        with pytest.raises(sqs.exceptions.InvalidAttributeName) as exc:
            sqs.create_queue(QueueName=qname, Attributes={attribute: value})
        assert _error(exc)["Message"] == f"Unknown Attribute {attribute}."
    for attribute, value in (("DeduplicationScope", "queue"), ("FifoThroughputLimit", "perQueue")):
        with pytest.raises(sqs.exceptions.InvalidAttributeName) as exc:
            sqs.create_queue(QueueName=qname, Attributes={attribute: value})
        assert _error(exc)["Message"] == (
            f"You can specify the {attribute} only when FifoQueue is set to true."
        )
    assert qname not in [u.rsplit("/", 1)[1] for u in sqs.list_queues().get("QueueUrls", [])]

    url = _fifo(sqs, qname)
    assert url.endswith(f"/{qname}.fifo")
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert {k: attrs[k] for k in attrs if k.startswith(("Fifo", "Content", "Dedup"))} == {
        "FifoQueue": "true",
        "ContentBasedDeduplication": "false",
        "DeduplicationScope": "queue",
        "FifoThroughputLimit": "perQueue",
    }
    # the values AWS accepts, kept and answered
    high = {
        "ContentBasedDeduplication": "true",
        "DeduplicationScope": "messageGroup",
        "FifoThroughputLimit": "perMessageGroupId",
    }
    sqs.set_queue_attributes(QueueUrl=url, Attributes=high)
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[*high, "FifoQueue"])
    assert got["Attributes"] == {**high, "FifoQueue": "true"}
    # creating it again: the same queue if nothing differs, QueueNameExists if something does
    assert _fifo(sqs, qname, **high) == url
    with pytest.raises(sqs.exceptions.QueueNameExists):
        _fifo(sqs, qname, ContentBasedDeduplication="false")
    for attribute, value in (
        ("ContentBasedDeduplication", "maybe"),
        ("DeduplicationScope", "everything"),
        ("FifoThroughputLimit", "unlimited"),
    ):
        with pytest.raises(sqs.exceptions.InvalidAttributeValue):
            sqs.set_queue_attributes(QueueUrl=url, Attributes={attribute: value})
    with pytest.raises(sqs.exceptions.InvalidAttributeValue) as exc:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"FifoQueue": "false"})
    assert "Modifying queue type is not supported" in _error(exc)["Message"]
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"FifoQueue": "true"})  # no change
    standard = sqs.create_queue(QueueName=qname)["QueueUrl"]
    with pytest.raises(sqs.exceptions.InvalidAttributeName):
        sqs.set_queue_attributes(QueueUrl=standard, Attributes={"FifoQueue": "true"})
    plain = sqs.get_queue_attributes(QueueUrl=standard, AttributeNames=["All"])["Attributes"]
    assert "FifoQueue" not in plain and "ContentBasedDeduplication" not in plain


def test_dead_letter_queue_is_of_the_same_kind(sqs: Any, qname: str) -> None:
    url = _fifo(sqs, qname)
    standard = sqs.create_queue(QueueName=qname + "-dlq")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=standard, AttributeNames=["QueueArn"])
    policy = f'{{"deadLetterTargetArn": "{arn["Attributes"]["QueueArn"]}", "maxReceiveCount": 2}}'
    with pytest.raises(sqs.exceptions.InvalidAttributeValue):
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": policy})
    fifo_dlq = _fifo(sqs, qname + "-dlq")
    arn = sqs.get_queue_attributes(QueueUrl=fifo_dlq, AttributeNames=["QueueArn"])
    policy = f'{{"deadLetterTargetArn": "{arn["Attributes"]["QueueArn"]}", "maxReceiveCount": 2}}'
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": policy})


def test_what_fifo_refuses(sqs: Any, qname: str) -> None:
    url = _fifo(sqs, qname)
    with pytest.raises(ClientError) as exc:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageDeduplicationId="d")
    assert _error(exc)["Code"] == "MissingParameter"
    assert _error(exc)["Message"] == "The request must contain the parameter MessageGroupId."
    with pytest.raises(ClientError) as exc:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g")
    assert _error(exc)["Code"] == "InvalidParameterValue"
    assert _error(exc)["Message"] == (
        "The queue should either have ContentBasedDeduplication enabled or "
        "MessageDeduplicationId provided explicitly"
    )
    with pytest.raises(ClientError) as exc:
        sqs.send_message(
            QueueUrl=url,
            MessageBody="x",
            MessageGroupId="g",
            MessageDeduplicationId="d",
            DelaySeconds=5,
        )
    assert _error(exc)["Code"] == "InvalidParameterValue"
    assert _error(exc)["Message"] == (
        "Value 5 for parameter DelaySeconds is invalid. Reason: The request include "
        "parameter that is not valid for this queue type."
    )
    for bad in ("a b", "x" * 129, "é"):
        with pytest.raises(ClientError) as exc:
            sqs.send_message(
                QueueUrl=url, MessageBody="x", MessageGroupId=bad, MessageDeduplicationId="d"
            )
        assert _error(exc)["Code"] == "InvalidParameterValue"
        assert (
            "MessageGroupId can only include alphanumeric and punctuation"
            in (_error(exc)["Message"])
        )
    # a batch with one entry FIFO refuses fails whole, as in SQS: nothing is stored
    entries = [
        {"Id": "ok", "MessageBody": "a", "MessageGroupId": "g", "MessageDeduplicationId": "a"},
        {"Id": "no-group", "MessageBody": "b", "MessageDeduplicationId": "b"},
    ]
    with pytest.raises(ClientError) as exc:
        sqs.send_message_batch(QueueUrl=url, Entries=entries)
    assert _error(exc)["Code"] == "InvalidParameterValue"
    assert _error(exc)["Message"] == "The request must contain the parameter MessageGroupId."
    entries[1] = {"Id": "delayed", "MessageBody": "b", "MessageGroupId": "g", "DelaySeconds": 3}
    with pytest.raises(ClientError) as exc:
        sqs.send_message_batch(QueueUrl=url, Entries=entries)
    assert _error(exc)["Code"] == "InvalidParameterValue"
    assert _count(sqs, url) == 0
    # DelaySeconds 0 is no delay of the message's own: allowed
    sqs.send_message(
        QueueUrl=url,
        MessageBody="x",
        MessageGroupId="g",
        MessageDeduplicationId="d",
        DelaySeconds=0,
    )
    assert _count(sqs, url) == 1


def test_sequence_numbers_and_groups(sqs: Any, server: LiveServer, qname: str) -> None:
    url = _fifo(sqs, qname)
    sent = [
        sqs.send_message(
            QueueUrl=url,
            MessageBody=f"m{i}",
            MessageGroupId=f"g{i % 2}",
            MessageDeduplicationId=f"d{i}",
        )
        for i in range(3)
    ]
    batch = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {
                "Id": f"b{i}",
                "MessageBody": f"b{i}",
                "MessageGroupId": "g1",
                "MessageDeduplicationId": f"b{i}",
            }
            for i in range(3)
        ],
    )["Successful"]
    numbers = [s["SequenceNumber"] for s in sent] + [b["SequenceNumber"] for b in batch]
    assert all(len(n) == 20 and n.isdigit() for n in numbers)
    assert [int(n) for n in numbers] == sorted({int(n) for n in numbers})  # strictly increasing
    assert numbers == sorted(numbers)  # and as text
    got = sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"], VisibilityTimeout=30
    )["Messages"]
    by_id = {m["MessageId"]: m for m in got}
    for s in sent:
        m = by_id.get(s["MessageId"])
        if m is not None:
            assert m["Attributes"]["SequenceNumber"] == s["SequenceNumber"]
            assert m["Attributes"]["MessageDeduplicationId"] in {"d0", "d1", "d2"}
    # the group is the item's own: the native API sees it
    with Client(server.url) as client:
        item_id = int(sent[1]["SequenceNumber"]) - 10**19
        peeked = client.peek(qname + ".fifo", item_id)
    assert peeked.group == "g1"
    assert peeked.value == b"\xff" + peeked.value[1:]  # enveloped: it keeps its dedup id
    # a standard queue keeps MessageGroupId as the item's group too, and has no sequence
    standard = sqs.create_queue(QueueName=qname)["QueueUrl"]
    plain = sqs.send_message(QueueUrl=standard, MessageBody="tenant", MessageGroupId="t-1")
    assert "SequenceNumber" not in plain
    (m,) = sqs.receive_message(QueueUrl=standard, AttributeNames=["All"])["Messages"]
    assert m["Attributes"]["MessageGroupId"] == "t-1"
    assert "SequenceNumber" not in m["Attributes"]
    with Client(server.url) as client:
        (item,) = client.browse(qname, values=True).items
    assert item.group == "t-1" and item.value == b"tenant"  # no envelope: a plain body


def test_deduplication_within_the_window(sqs: Any, qname: str) -> None:
    url = _fifo(sqs, qname)
    first = sqs.send_message(
        QueueUrl=url, MessageBody="charge", MessageGroupId="c-1", MessageDeduplicationId="o-17"
    )
    again = sqs.send_message(
        QueueUrl=url, MessageBody="charge", MessageGroupId="c-1", MessageDeduplicationId="o-17"
    )
    assert again["MessageId"] == first["MessageId"]
    assert again["SequenceNumber"] == first["SequenceNumber"]
    (m,) = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    # still a duplicate after the first was received and deleted, as SQS
    third = sqs.send_message(
        QueueUrl=url, MessageBody="other", MessageGroupId="c-2", MessageDeduplicationId="o-17"
    )
    assert third["MessageId"] == first["MessageId"]
    assert _count(sqs, url) == 0
    # a batch repeating itself and an earlier message
    res = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "a", "MessageBody": "x", "MessageGroupId": "g", "MessageDeduplicationId": "n"},
            {"Id": "b", "MessageBody": "y", "MessageGroupId": "g", "MessageDeduplicationId": "n"},
            {
                "Id": "c",
                "MessageBody": "z",
                "MessageGroupId": "g",
                "MessageDeduplicationId": "o-17",
            },
        ],
    )["Successful"]
    ids = {r["Id"]: r["MessageId"] for r in res}
    assert ids["a"] == ids["b"] and ids["c"] == first["MessageId"]
    assert _count(sqs, url) == 1


def test_content_based_deduplication(sqs: Any, qname: str) -> None:
    url = _fifo(sqs, qname, ContentBasedDeduplication="true")
    a = sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g")
    b = sqs.send_message(
        QueueUrl=url,
        MessageBody="same",
        MessageGroupId="g",
        MessageAttributes={"x": {"DataType": "String", "StringValue": "attributes do not count"}},
    )
    c = sqs.send_message(QueueUrl=url, MessageBody="different", MessageGroupId="h")
    # a given id wins over the body's hash
    d = sqs.send_message(
        QueueUrl=url, MessageBody="same", MessageGroupId="k", MessageDeduplicationId="own"
    )
    assert a["MessageId"] == b["MessageId"]
    assert len({a["MessageId"], c["MessageId"], d["MessageId"]}) == 3
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"])
    dedup = {m["Body"]: m["Attributes"]["MessageDeduplicationId"] for m in got["Messages"]}
    assert dedup["different"] == hashlib.sha256(b"different").hexdigest()
    assert _count(sqs, url) == 3


def test_deduplication_scope(sqs: Any, qname: str) -> None:
    def send(url: str, group: str) -> str:
        r = sqs.send_message(
            QueueUrl=url, MessageBody=group, MessageGroupId=group, MessageDeduplicationId="same"
        )
        return str(r["MessageId"])

    per_queue = _fifo(sqs, qname)
    assert send(per_queue, "g1") == send(per_queue, "g2")
    per_group = _fifo(sqs, qname + "-g", DeduplicationScope="messageGroup")
    one, two = send(per_group, "g1"), send(per_group, "g2")
    assert one != two and send(per_group, "g1") == one
    assert _count(sqs, per_queue) == 1 and _count(sqs, per_group) == 2


def test_deduplication_after_the_window(sqs: Any, server: LiveServer, qname: str) -> None:
    """The window is the queue's dedup_window_ms (5 minutes as created through SQS);
    shortened through the native API, a repeat after it is a new message."""
    url = _fifo(sqs, qname)
    with Client(server.url) as client:
        info = client.queue(qname + ".fifo")
        assert info.config.dedup_window_ms == 300_000
        client.put_queue(qname + ".fifo", replace(info.config, dedup_window_ms=3_000))
    first = sqs.send_message(
        QueueUrl=url, MessageBody="x", MessageGroupId="g", MessageDeduplicationId="k"
    )
    assert (
        sqs.send_message(
            QueueUrl=url, MessageBody="x", MessageGroupId="g", MessageDeduplicationId="k"
        )["MessageId"]
        == first["MessageId"]
    )
    time.sleep(3.2)
    later = sqs.send_message(
        QueueUrl=url, MessageBody="x", MessageGroupId="g", MessageDeduplicationId="k"
    )
    assert later["MessageId"] != first["MessageId"]
    assert int(later["SequenceNumber"]) > int(first["SequenceNumber"])
    assert _count(sqs, url) == 2


def test_queue_delay_applies_to_fifo_messages(sqs: Any, qname: str) -> None:
    url = _fifo(sqs, qname, DelaySeconds="2", ContentBasedDeduplication="true")
    sqs.send_message(QueueUrl=url, MessageBody="later", MessageGroupId="g")
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    assert [m["Body"] for m in got] == ["later"]


def test_delete_with_an_expired_receipt_handle(sqs: Any, qname: str) -> None:
    url = _fifo(sqs, qname, VisibilityTimeout="1", ContentBasedDeduplication="true")
    sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g")
    (m,) = sqs.receive_message(QueueUrl=url)["Messages"]
    time.sleep(1.2)
    with pytest.raises(ClientError) as exc:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert _error(exc)["Code"] == "InvalidParameterValue"
    assert _error(exc)["Message"].endswith("Reason: The receipt handle has expired.")
    res = sqs.delete_message_batch(
        QueueUrl=url, Entries=[{"Id": "old", "ReceiptHandle": m["ReceiptHandle"]}]
    )
    assert [f["Code"] for f in res["Failed"]] == ["InvalidParameterValue"]
    assert _count(sqs, url) == 1  # nothing was deleted


def test_receive_request_attempt_id(sqs: Any, qname: str) -> None:
    url = _fifo(sqs, qname, ContentBasedDeduplication="true")
    for i in range(3):
        sqs.send_message(QueueUrl=url, MessageBody=f"m{i}", MessageGroupId=f"g{i}")

    def receive(attempt: str | None, n: int = 2, visibility: int = 4) -> list[dict[str, Any]]:
        kw = {} if attempt is None else {"ReceiveRequestAttemptId": attempt}
        got = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=n, VisibilityTimeout=visibility, **kw
        )
        return got.get("Messages", [])  # type: ignore[no-any-return]

    first = receive("try-1")
    assert len(first) == 2
    # the answer was "lost": the same attempt id gets the same messages and handles
    time.sleep(2.5)
    retry = receive("try-1")
    assert [(m["MessageId"], m["ReceiptHandle"]) for m in retry] == [
        (m["MessageId"], m["ReceiptHandle"]) for m in first
    ]
    # ... and restarted their visibility timeout: past the first receive's 4 s they are
    # still in flight; another receive gets the third message only
    time.sleep(2.5)
    others = receive(None, n=10)
    assert [m["Body"] for m in others] == ["m2"]
    # once the consumer deleted one of them, the attempt id is spent
    sqs.delete_message(QueueUrl=url, ReceiptHandle=retry[0]["ReceiptHandle"])
    with pytest.raises(ClientError) as exc:
        receive("try-1")
    assert _error(exc)["Code"] == "InvalidParameterValue"
    assert "ReceiveRequestAttemptId" in _error(exc)["Message"]
    # an attempt id whose messages all became visible again receives anew
    sqs.send_message(QueueUrl=url, MessageBody="m3", MessageGroupId="g3")
    (later,) = receive("try-2", n=1, visibility=1)
    assert later["Body"] == "m3"
    time.sleep(1.3)
    anew = {m["Body"]: m["ReceiptHandle"] for m in receive("try-2", n=10)}
    assert anew["m3"] != later["ReceiptHandle"]
    with pytest.raises(ClientError) as exc:
        receive("not valid")
    assert _error(exc)["Code"] == "InvalidParameterValue"
    # a standard queue takes no attempt id into account, as SQS
    standard = sqs.create_queue(QueueName=qname)["QueueUrl"]
    sqs.send_message_batch(
        QueueUrl=standard, Entries=[{"Id": f"s{i}", "MessageBody": f"s{i}"} for i in range(2)]
    )
    a = sqs.receive_message(QueueUrl=standard, ReceiveRequestAttemptId="same")["Messages"]
    b = sqs.receive_message(QueueUrl=standard, ReceiveRequestAttemptId="same")["Messages"]
    assert a[0]["MessageId"] != b[0]["MessageId"]


@pytest.mark.integration
def test_a_group_is_held_while_a_message_is_in_flight(sqs: Any, qname: str) -> None:
    """g1's second message waits while its first is in flight, g2 and g3 go on; a delete,
    a visibility timeout running out, or a visibility change to 0 frees the group, and
    a message that comes back is its group's next again."""
    url = _fifo(sqs, qname, ContentBasedDeduplication="true")
    for body, group in (("a1", "g1"), ("a2", "g1"), ("b1", "g2"), ("a3", "g1")):
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group)

    def receive(visibility: int = 30, wait: int = 0) -> list[str]:
        got = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=visibility,
            WaitTimeSeconds=wait,
        ).get("Messages", [])
        handles.update({m["Body"]: m["ReceiptHandle"] for m in got})
        return sorted(m["Body"] for m in got)

    handles: dict[str, str] = {}
    assert receive(visibility=2) == ["a1", "b1"]
    assert receive() == []  # a2 waits behind a1 in flight
    # a group that comes along meanwhile is not held by g1
    sqs.send_message(QueueUrl=url, MessageBody="c1", MessageGroupId="g3")
    assert receive() == ["c1"]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handles["b1"])
    time.sleep(2.3)  # a1's visibility timeout runs out: a1 again, not a2
    assert receive(wait=2) == ["a1"]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handles["a1"], VisibilityTimeout=0)
    assert receive(wait=2) == ["a1"]  # visible again at once, still ahead of a2
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handles["a1"])
    assert receive(wait=2) == ["a2"]
    assert receive() == []
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handles["a2"])
    assert receive(wait=2) == ["a3"]


@pytest.mark.integration
def test_group_order_under_concurrent_receivers(sqs: Any, server: LiveServer, qname: str) -> None:
    """Four receivers, six groups of eight messages: every group's messages are
    processed in the order they were sent, never two of one group at once, each once."""
    url = _fifo(sqs, qname, ContentBasedDeduplication="true")
    groups, per_group = 6, 8
    entries = [
        {"Id": f"{g}-{n}", "MessageBody": f"{g}-{n}", "MessageGroupId": f"g{g}"}
        for n in range(per_group)
        for g in range(groups)
    ]
    for i in range(0, len(entries), 10):
        sqs.send_message_batch(QueueUrl=url, Entries=entries[i : i + 10])
    lock = threading.Lock()
    in_flight: set[str] = set()
    processed: dict[str, list[int]] = {f"g{g}": [] for g in range(groups)}
    overlaps: list[str] = []
    errors: list[BaseException] = []
    give_up = time.monotonic() + 60

    def receiver(seed: int) -> None:
        client = sqs_client(server.url)
        rnd = random.Random(seed)
        try:
            while time.monotonic() < give_up:
                with lock:
                    if sum(map(len, processed.values())) == groups * per_group:
                        return
                got = client.receive_message(
                    QueueUrl=url,
                    MaxNumberOfMessages=rnd.randint(1, 3),
                    WaitTimeSeconds=1,
                    AttributeNames=["MessageGroupId"],
                ).get("Messages", [])
                with lock:  # in flight from now: two of one group at once is an overlap
                    for m in got:
                        group = m["Attributes"]["MessageGroupId"]
                        if group in in_flight:
                            overlaps.append(m["Body"])
                        in_flight.add(group)
                for m in got:
                    group, n = m["Attributes"]["MessageGroupId"], int(m["Body"].split("-")[1])
                    time.sleep(rnd.uniform(0, 0.02))  # the work
                    with lock:  # done with it before the delete frees the group
                        processed[group].append(n)
                        in_flight.discard(group)
                    client.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=receiver, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors and not overlaps
    assert processed == {f"g{g}": list(range(per_group)) for g in range(groups)}
    assert _count(sqs, url) == 0


@pytest.mark.integration
def test_a_fifo_queue_has_group_limit_one(sqs: Any, server: LiveServer, qname: str) -> None:
    """The rule lives in the queue: a native consumer of a FIFO queue is held alike. A
    queue of a FIFO name made natively without the rule is not the FIFO queue asked for."""
    url = _fifo(sqs, qname, ContentBasedDeduplication="true")
    assert _fifo(sqs, qname, ContentBasedDeduplication="true") == url  # the same queue
    with Client(server.url) as client:
        assert client.queue(qname + ".fifo").config.group_limit == 1
        client.put_queue(qname + "-native.fifo")
        with pytest.raises(sqs.exceptions.QueueNameExists):
            _fifo(sqs, qname + "-native")
        sqs.send_message(QueueUrl=url, MessageBody="first", MessageGroupId="g")
        sqs.send_message(QueueUrl=url, MessageBody="second", MessageGroupId="g")
        (item,) = client.dequeue(qname + ".fifo", count=10)
        assert item.group == "g"
        assert "Messages" not in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
        client.release(qname + ".fifo", item.id, item.receipt)
    (m,) = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert m["Body"] == "second"
