"""boto3 against ``dq serve``: every core SQS action, error shapes, long polling,
visibility timeouts and redelivery (docs/sqs.md)."""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError

from dq.client import Client
from tests.server.live import LiveServer

#: MD5OfMessageAttributes of {SellerName: String "Example Store"}, as computed by
#: Amazon SQS (a vector published with a widely used SQS client library).
SELLER_MD5 = "cd28f3b68aeee4b2eac9c66f2f694b58"


def _error(exc: pytest.ExceptionInfo[ClientError]) -> dict[str, Any]:
    return exc.value.response["Error"]  # type: ignore[no-any-return]


def test_queue_lifecycle_and_urls(sqs: Any, server: LiveServer, qname: str) -> None:
    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    assert url == f"{server.url}/000000000000/{qname}"
    assert sqs.get_queue_url(QueueName=qname)["QueueUrl"] == url
    assert url in sqs.list_queues(QueueNamePrefix=qname)["QueueUrls"]
    # same attributes again: the same queue; different ones: QueueNameExists
    assert sqs.create_queue(QueueName=qname)["QueueUrl"] == url
    with pytest.raises(sqs.exceptions.QueueNameExists) as exc:
        sqs.create_queue(QueueName=qname, Attributes={"VisibilityTimeout": "5"})
    assert _error(exc)["Code"] == "QueueAlreadyExists"
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]
    assert arn == {"QueueArn": f"arn:aws:sqs:us-east-1:000000000000:{qname}"}
    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist) as exc:
        sqs.get_queue_url(QueueName=qname)
    assert _error(exc)["Code"] == "AWS.SimpleQueueService.NonExistentQueue"
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


def test_create_queue_again_with_default_values_is_the_same_queue(sqs: Any, qname: str) -> None:
    """Code that creates its queue on every start, spelling out SQS's defaults, gets the
    queue's URL back whether or not the queue was first created with them."""
    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    defaults = {
        "DelaySeconds": "0",
        "MaximumMessageSize": "262144",
        "MessageRetentionPeriod": "345600",
        "ReceiveMessageWaitTimeSeconds": "0",
        "VisibilityTimeout": "30",
    }
    assert sqs.create_queue(QueueName=qname, Attributes=defaults)["QueueUrl"] == url
    with pytest.raises(sqs.exceptions.QueueNameExists):
        sqs.create_queue(QueueName=qname, Attributes={**defaults, "DelaySeconds": "5"})


def test_list_queues_pages(sqs: Any, qname: str) -> None:
    names = [f"{qname}-{i}" for i in range(5)]
    for n in names:
        sqs.create_queue(QueueName=n)
    seen: list[str] = []
    token = None
    while True:
        kw = {"NextToken": token} if token else {}
        page = sqs.list_queues(QueueNamePrefix=qname, MaxResults=2, **kw)
        seen += [u.rsplit("/", 1)[1] for u in page.get("QueueUrls", [])]
        token = page.get("NextToken")
        if not token:
            break
    assert seen == names


def test_queue_attributes(sqs: Any, qname: str) -> None:
    url = sqs.create_queue(
        QueueName=qname, Attributes={"VisibilityTimeout": "7", "DelaySeconds": "0"}
    )["QueueUrl"]
    sqs.set_queue_attributes(
        QueueUrl=url,
        Attributes={
            "ReceiveMessageWaitTimeSeconds": "3",
            "MessageRetentionPeriod": "86400",
            "MaximumMessageSize": "2048",
            "Policy": '{"Version":"2012-10-17"}',
        },
    )
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["VisibilityTimeout"] == "7"
    assert attrs["ReceiveMessageWaitTimeSeconds"] == "3"
    assert attrs["MessageRetentionPeriod"] == "86400"
    assert attrs["MaximumMessageSize"] == "2048"
    assert attrs["Policy"] == '{"Version":"2012-10-17"}'
    assert attrs["ApproximateNumberOfMessages"] == "0"
    assert int(attrs["CreatedTimestamp"]) <= int(attrs["LastModifiedTimestamp"])
    with pytest.raises(sqs.exceptions.InvalidAttributeName):
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"NoSuchThing": "1"})
    with pytest.raises(sqs.exceptions.InvalidAttributeValue):
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "901"})
    with pytest.raises(sqs.exceptions.UnsupportedOperation):
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"SqsManagedSseEnabled": "true"})
    # the message size limit set above is applied
    with pytest.raises(ClientError) as exc:
        sqs.send_message(QueueUrl=url, MessageBody="x" * 2049)
    assert _error(exc)["Code"] == "InvalidParameterValue"


def test_send_receive_delete_with_attributes(sqs: Any, qname: str) -> None:
    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    attrs = {"SellerName": {"DataType": "String", "StringValue": "Example Store"}}
    sent = sqs.send_message(QueueUrl=url, MessageBody="héllo", MessageAttributes=attrs)
    assert sent["MD5OfMessageBody"] == hashlib.md5("héllo".encode()).hexdigest()
    assert sent["MD5OfMessageAttributes"] == SELLER_MD5
    got = sqs.receive_message(
        QueueUrl=url, MessageAttributeNames=["All"], AttributeNames=["All"], WaitTimeSeconds=1
    )["Messages"]
    assert len(got) == 1
    m = got[0]
    assert m["MessageId"] == sent["MessageId"]
    assert m["Body"] == "héllo"
    assert m["MD5OfBody"] == sent["MD5OfMessageBody"]
    assert m["MessageAttributes"] == attrs
    assert m["MD5OfMessageAttributes"] == SELLER_MD5
    assert m["Attributes"]["ApproximateReceiveCount"] == "1"
    now_ms = time.time() * 1000
    assert abs(int(m["Attributes"]["SentTimestamp"]) - now_ms) < 60_000
    assert int(m["Attributes"]["ApproximateFirstReceiveTimestamp"]) >= int(
        m["Attributes"]["SentTimestamp"]
    )
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    # a binary attribute and a filter by name prefix
    binary = {"Data": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"}}
    sqs.send_message(
        QueueUrl=url,
        MessageBody="b",
        MessageAttributes={**binary, "other": {"DataType": "Number", "StringValue": "12"}},
    )
    (m,) = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["Da.*", "Data"])["Messages"]
    assert m["MessageAttributes"] == binary
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


def test_batches(sqs: Any, qname: str) -> None:
    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    entries = [{"Id": f"m{i}", "MessageBody": f"body {i}"} for i in range(10)]
    entries[3]["MessageAttributes"] = {"bad": {"DataType": "Number", "StringValue": "x"}}
    res = sqs.send_message_batch(QueueUrl=url, Entries=entries)
    assert sorted(s["Id"] for s in res["Successful"]) == sorted(
        e["Id"] for e in entries if e["Id"] != "m3"
    )
    (failed,) = res["Failed"]
    assert failed["Id"] == "m3" and failed["Code"] == "InvalidParameterValue"
    assert failed["SenderFault"] is True
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert sorted(m["Body"] for m in got) == sorted(
        e["MessageBody"] for e in entries if e["Id"] != "m3"
    )
    res = sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[{"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)]
        + [{"Id": "bad", "ReceiptHandle": "not-a-handle"}],
    )
    assert len(res["Successful"]) == 9
    assert [(f["Id"], f["Code"]) for f in res["Failed"]] == [("bad", "ReceiptHandleIsInvalid")]
    too_many = [{"Id": f"m{i}", "MessageBody": "x"} for i in range(11)]
    with pytest.raises(sqs.exceptions.TooManyEntriesInBatchRequest) as exc:
        sqs.send_message_batch(QueueUrl=url, Entries=too_many)
    assert _error(exc)["Code"] == "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"
    with pytest.raises(sqs.exceptions.EmptyBatchRequest):
        sqs.delete_message_batch(QueueUrl=url, Entries=[])
    with pytest.raises(sqs.exceptions.BatchEntryIdsNotDistinct):
        sqs.send_message_batch(
            QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "x"}, {"Id": "a", "MessageBody": "y"}]
        )
    with pytest.raises(sqs.exceptions.InvalidBatchEntryId):
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "a b", "MessageBody": "x"}])


def test_batch_entry_with_invalid_text_fails_alone(sqs: Any, qname: str) -> None:
    """A body that is no valid text (a lone surrogate, which boto3 sends as JSON's
    ``\\ud800``) fails as its entry, InvalidMessageContents; the others are sent."""
    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    res = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[{"Id": "ok", "MessageBody": "fine"}, {"Id": "bad", "MessageBody": "x\ud800"}],
    )
    assert [e["Id"] for e in res["Successful"]] == ["ok"]
    assert [(e["Id"], e["Code"]) for e in res["Failed"]] == [("bad", "InvalidMessageContents")]
    (m,) = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert m["Body"] == "fine"


def test_error_shapes(sqs: Any, server: LiveServer, qname: str) -> None:
    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    missing = url + "-missing"
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.send_message(QueueUrl=missing, MessageBody="x")
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.receive_message(QueueUrl=missing)
    with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid) as exc:
        sqs.delete_message(QueueUrl=url, ReceiptHandle="garbage")
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    with pytest.raises(ClientError) as exc:
        sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=11)
    assert _error(exc)["Code"] == "InvalidParameterValue"
    with pytest.raises(ClientError) as exc:
        sqs.send_message(QueueUrl=url, MessageBody="x" * (256 * 1024 + 1))
    assert _error(exc)["Code"] == "InvalidParameterValue"
    with pytest.raises(sqs.exceptions.InvalidMessageContents):
        sqs.send_message(QueueUrl=url, MessageBody="bad \x00 char")
    with pytest.raises(ClientError) as exc:
        sqs.send_message(QueueUrl=url, MessageBody="x", DelaySeconds=901)
    assert _error(exc)["Code"] == "InvalidParameterValue"
    # the raw shape: __type, message, x-amzn-query-error
    import httpx

    r = httpx.post(
        server.url + "/",
        content=b'{"QueueName": "nope-nope"}',
        headers={
            "X-Amz-Target": "AmazonSQS.GetQueueUrl",
            "Content-Type": "application/x-amz-json-1.0",
        },
    )
    assert r.status_code == 400
    assert r.json()["__type"] == "com.amazonaws.sqs#QueueDoesNotExist"
    assert r.json()["message"]
    assert r.headers["x-amzn-query-error"] == "AWS.SimpleQueueService.NonExistentQueue;Sender"


def test_long_poll_wakes_on_send(sqs: Any, server: LiveServer, qname: str) -> None:
    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    t0 = time.monotonic()
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)
    assert 0.9 <= time.monotonic() - t0 < 5
    got: list[Any] = []
    waiter = threading.Thread(
        target=lambda: got.append(sqs.receive_message(QueueUrl=url, WaitTimeSeconds=10))
    )
    t0 = time.monotonic()
    waiter.start()
    time.sleep(0.5)
    from tests.sqs.conftest import sqs_client

    sqs_client(server.url).send_message(QueueUrl=url, MessageBody="wake")
    waiter.join(15)
    assert not waiter.is_alive()
    assert time.monotonic() - t0 < 5
    assert got[0]["Messages"][0]["Body"] == "wake"
    # the queue's ReceiveMessageWaitTimeSeconds is the default wait
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"ReceiveMessageWaitTimeSeconds": "1"})
    t0 = time.monotonic()
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    assert time.monotonic() - t0 >= 0.9


def test_visibility_timeout_expiry_redelivers(sqs: Any, qname: str) -> None:
    url = sqs.create_queue(QueueName=qname, Attributes={"VisibilityTimeout": "2"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="again")
    (first,) = sqs.receive_message(QueueUrl=url, AttributeNames=["All"])["Messages"]
    assert first["Attributes"]["ApproximateReceiveCount"] == "1"
    assert "Messages" not in sqs.receive_message(QueueUrl=url)  # invisible now
    (second,) = sqs.receive_message(
        QueueUrl=url, WaitTimeSeconds=10, MessageSystemAttributeNames=["All"]
    )["Messages"]
    assert second["MessageId"] == first["MessageId"]
    assert second["ReceiptHandle"] != first["ReceiptHandle"]
    assert second["Attributes"]["ApproximateReceiveCount"] == "2"
    assert (
        second["Attributes"]["ApproximateFirstReceiveTimestamp"]
        == first["Attributes"]["ApproximateFirstReceiveTimestamp"]
    )
    # the first receipt is over: deleting with it succeeds and deletes nothing (as SQS);
    # changing its visibility is refused
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    with pytest.raises(ClientError) as exc:
        sqs.change_message_visibility(
            QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=5
        )
    assert _error(exc)["Code"] == "InvalidParameterValue"
    attrs = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    assert attrs == {"ApproximateNumberOfMessagesNotVisible": "1"}
    sqs.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2)


def test_change_message_visibility(sqs: Any, qname: str) -> None:
    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "a"}, {"Id": "b", "MessageBody": "b"}]
    )
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2, VisibilityTimeout=3)["Messages"]
    a = next(m for m in got if m["Body"] == "a")
    b = next(m for m in got if m["Body"] == "b")
    # a: hidden for 30 s more; b: visible again at once
    res = sqs.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "a", "ReceiptHandle": a["ReceiptHandle"], "VisibilityTimeout": 30},
            {"Id": "b", "ReceiptHandle": b["ReceiptHandle"], "VisibilityTimeout": 0},
            {"Id": "c", "ReceiptHandle": "x.y", "VisibilityTimeout": 0},
        ],
    )
    assert sorted(s["Id"] for s in res["Successful"]) == ["a", "b"]
    assert [f["Code"] for f in res["Failed"]] == ["ReceiptHandleIsInvalid"]
    (again,) = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2)["Messages"]
    assert again["Body"] == "b"
    time.sleep(3.2)  # a's original 3 s lease would have run out by now
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=a["ReceiptHandle"], VisibilityTimeout=0
    )
    (back,) = sqs.receive_message(QueueUrl=url, AttributeNames=["ApproximateReceiveCount"])[
        "Messages"
    ]
    assert back["Body"] == "a" and back["Attributes"]["ApproximateReceiveCount"] == "2"


def test_delays(sqs: Any, qname: str) -> None:
    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="soon", DelaySeconds=2)
    later = int(time.time() * 1000) + 3_600_000
    sent = sqs.send_message(
        QueueUrl=url,
        MessageBody="in an hour",
        MessageAttributes={"dq.Deadline": {"DataType": "Number", "StringValue": str(later)}},
    )
    assert sent["MD5OfMessageAttributes"]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessagesDelayed"] == "2"
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    (m,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=10)["Messages"]
    assert m["Body"] == "soon"
    # a deadline out of dq's range fails its own entry only
    far = {"dq.Deadline": {"DataType": "Number", "StringValue": "1e20"}}
    res = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "far", "MessageBody": "x", "MessageAttributes": far},
            {"Id": "ok", "MessageBody": "x", "DelaySeconds": 60},
        ],
    )
    assert [e["Id"] for e in res["Successful"]] == ["ok"]
    assert [(e["Id"], e["Code"]) for e in res["Failed"]] == [("far", "InvalidParameterValue")]
    # the queue's DelaySeconds applies to messages that give none
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "2"})
    sqs.send_message(QueueUrl=url, MessageBody="queue delay")
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    (m,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=10)["Messages"]
    assert m["Body"] == "queue delay"


def test_tags(sqs: Any, qname: str) -> None:
    url = sqs.create_queue(QueueName=qname, tags={"team": "a"})["QueueUrl"]
    sqs.tag_queue(QueueUrl=url, Tags={"env": "test"})
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "a", "env": "test"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["team"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"env": "test"}


def test_tags_and_policies_must_be_text(sqs: Any, qname: str) -> None:
    """A tag or policy holding a character no answer can carry (NUL, a lone surrogate)
    is refused when set: stored, it broke every query-protocol (XML) answer about the
    queue."""
    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    for bad in ("a\x00b", "x\ud800"):
        with pytest.raises(ClientError) as exc:
            sqs.tag_queue(QueueUrl=url, Tags={"team": bad})
        assert _error(exc)["Code"] == "InvalidParameterValue"
        with pytest.raises(sqs.exceptions.InvalidAttributeValue):
            sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": bad})
    assert "Tags" not in sqs.list_queue_tags(QueueUrl=url)
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert "Policy" not in attrs


def test_native_interop(sqs: Any, server: LiveServer, qname: str) -> None:
    """Plain SQS messages are plain values; native values reach SQS consumers."""
    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody='{"job": 1}')
    with Client(server.url) as dq:
        (item,) = dq.dequeue(qname, count=1)
        assert item.value == b'{"job": 1}'
        dq.release(qname, item.id, item.receipt)
        dq.enqueue(qname, b"\xff\xfe binary")
    (m,) = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"]
    assert m["MessageAttributes"] == {
        "dq.Encoding": {"DataType": "String", "StringValue": "base64"}
    }
    import base64

    assert base64.b64decode(m["Body"]) == b"\xff\xfe binary"


def test_native_value_like_a_broken_envelope_is_delivered_as_binary(
    sqs: Any, server: LiveServer, qname: str
) -> None:
    """A native value that starts like an envelope but whose header is no message's
    (an attribute that is not a structure) reaches SQS consumers as binary, base64 with
    ``dq.Encoding``; it failed every receive that met it, hiding the messages with it."""
    import base64
    import json
    import struct

    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="good")
    header = json.dumps({"MessageAttributes": {"a": "not a structure"}}).encode()
    odd = b"\xffDQSQS\x00\x01" + struct.pack(">I", len(header)) + header + b"body"
    with Client(server.url) as dq:
        dq.enqueue(qname, odd)
    got = sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], WaitTimeSeconds=1
    )["Messages"]
    assert sorted(m["Body"] for m in got) == sorted(["good", base64.b64encode(odd).decode()])
    (binary,) = [m for m in got if m["Body"] != "good"]
    assert binary["MessageAttributes"]["dq.Encoding"]["StringValue"] == "base64"
