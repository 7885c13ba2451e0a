"""The older SQS query protocol (form-encoded ``Action=``, XML answers), as pre-2024
SDKs send it: to ``/`` and to the queue's URL."""

from __future__ import annotations

import hashlib
import xml.etree.ElementTree as ET
from typing import Any

import httpx

from tests.server.live import LiveServer

NS = {"sqs": "http://queue.amazonaws.com/doc/2012-11-05/"}
FORM = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}


def _call(url: str, **params: Any) -> tuple[int, ET.Element]:
    r = httpx.post(url, data={"Version": "2012-11-05", **params}, headers=FORM, timeout=30)
    assert r.headers["content-type"].startswith("text/xml")
    return r.status_code, ET.fromstring(r.content)


def _find(root: ET.Element, path: str) -> str:
    node = root.find(path, NS)
    assert node is not None, ET.tostring(root)
    return node.text or ""


def test_query_protocol_round_trip(server: LiveServer, qname: str) -> None:
    status, root = _call(
        server.url + "/",
        Action="CreateQueue",
        QueueName=qname,
        **{"Attribute.1.Name": "VisibilityTimeout", "Attribute.1.Value": "15"},
    )
    assert status == 200
    url = _find(root, "sqs:CreateQueueResult/sqs:QueueUrl")
    assert url == f"{server.url}/000000000000/{qname}"

    body = 'line one\r\nline <two> & "three"'
    status, root = _call(
        url,  # to the queue's URL, as the query protocol does
        Action="SendMessage",
        MessageBody=body,
        **{
            "MessageAttribute.1.Name": "SellerName",
            "MessageAttribute.1.Value.DataType": "String",
            "MessageAttribute.1.Value.StringValue": "Example Store",
        },
    )
    assert status == 200
    assert (
        _find(root, "sqs:SendMessageResult/sqs:MD5OfMessageBody")
        == hashlib.md5(body.encode()).hexdigest()
    )
    assert (
        _find(root, "sqs:SendMessageResult/sqs:MD5OfMessageAttributes")
        == "cd28f3b68aeee4b2eac9c66f2f694b58"
    )

    status, root = _call(
        url,
        Action="ReceiveMessage",
        **{"AttributeName.1": "All", "MessageAttributeName.1": "All", "WaitTimeSeconds": "1"},
    )
    msg = root.find("sqs:ReceiveMessageResult/sqs:Message", NS)
    assert msg is not None
    assert _find(msg, "sqs:Body") == body  # CR, markup and quotes survive the XML
    attrs = {_find(a, "sqs:Name"): _find(a, "sqs:Value") for a in msg.findall("sqs:Attribute", NS)}
    assert attrs["ApproximateReceiveCount"] == "1"
    (ma,) = msg.findall("sqs:MessageAttribute", NS)
    assert _find(ma, "sqs:Name") == "SellerName"
    assert _find(ma, "sqs:Value/sqs:StringValue") == "Example Store"
    assert _find(ma, "sqs:Value/sqs:DataType") == "String"
    handle = _find(msg, "sqs:ReceiptHandle")

    status, root = _call(
        url,
        Action="DeleteMessageBatch",
        **{
            "DeleteMessageBatchRequestEntry.1.Id": "a",
            "DeleteMessageBatchRequestEntry.1.ReceiptHandle": handle,
            "DeleteMessageBatchRequestEntry.2.Id": "b",
            "DeleteMessageBatchRequestEntry.2.ReceiptHandle": "junk",
        },
    )
    result = root.find("sqs:DeleteMessageBatchResult", NS)
    assert result is not None
    assert _find(result, "sqs:DeleteMessageBatchResultEntry/sqs:Id") == "a"
    assert _find(result, "sqs:BatchResultErrorEntry/sqs:Id") == "b"
    assert _find(result, "sqs:BatchResultErrorEntry/sqs:Code") == "ReceiptHandleIsInvalid"
    assert _find(result, "sqs:BatchResultErrorEntry/sqs:SenderFault") == "true"

    status, root = _call(
        server.url + "/",
        Action="SendMessageBatch",
        QueueUrl=url,
        **{
            "SendMessageBatchRequestEntry.1.Id": "x",
            "SendMessageBatchRequestEntry.1.MessageBody": "one",
            "SendMessageBatchRequestEntry.2.Id": "y",
            "SendMessageBatchRequestEntry.2.MessageBody": "two",
            "SendMessageBatchRequestEntry.2.DelaySeconds": "60",
        },
    )
    ids = [
        e.text
        for e in root.findall(
            "sqs:SendMessageBatchResult/sqs:SendMessageBatchResultEntry/sqs:Id", NS
        )
    ]
    assert ids == ["x", "y"]
    status, root = _call(url, Action="GetQueueAttributes", **{"AttributeName.1": "All"})
    got = {
        _find(a, "sqs:Name"): _find(a, "sqs:Value")
        for a in root.findall("sqs:GetQueueAttributesResult/sqs:Attribute", NS)
    }
    assert got["VisibilityTimeout"] == "15"
    assert got["ApproximateNumberOfMessages"] == "1"
    assert got["ApproximateNumberOfMessagesDelayed"] == "1"

    status, root = _call(server.url + "/", Action="ListQueues", QueueNamePrefix=qname)
    assert [e.text for e in root.findall("sqs:ListQueuesResult/sqs:QueueUrl", NS)] == [url]
    status, root = _call(url, Action="DeleteQueue")
    assert status == 200 and root.find("sqs:ResponseMetadata/sqs:RequestId", NS) is not None


def test_query_protocol_errors(server: LiveServer) -> None:
    status, root = _call(server.url + "/", Action="GetQueueUrl", QueueName="no-such-queue")
    assert status == 400
    assert _find(root, "sqs:Error/sqs:Code") == "AWS.SimpleQueueService.NonExistentQueue"
    assert _find(root, "sqs:Error/sqs:Type") == "Sender"
    status, root = _call(server.url + "/", Action="Frobnicate")
    assert status == 400 and _find(root, "sqs:Error/sqs:Code") == "InvalidAction"
    # a POST to a two-segment path that is not a query request is still not found
    r = httpx.post(server.url + "/000000000000/q", json={"a": 1})
    assert r.status_code == 404
    assert httpx.get(server.url + "/000000000000/q").status_code == 404


def test_query_protocol_list_member_without_fields_is_malformed(
    server: LiveServer, qname: str
) -> None:
    """``Attribute.1=x`` (a structure's member given as a plain value) is the client's
    mistake: answered ``MalformedQueryString`` (400), never an internal error."""
    status, root = _call(server.url + "/", Action="CreateQueue", QueueName=qname)
    assert status == 200
    url = _find(root, "sqs:CreateQueueResult/sqs:QueueUrl")
    for action, params in [
        ("CreateQueue", {"QueueName": qname + "-x", "Attribute.1": "VisibilityTimeout"}),
        ("TagQueue", {"Tag.1": "team"}),
        ("SendMessage", {"MessageBody": "hi", "MessageAttribute.1": "color"}),
        ("SendMessage", {"MessageBody": "hi", "MessageSystemAttribute.1": "AWSTraceHeader"}),
        (
            "SendMessageBatch",
            {
                "SendMessageBatchRequestEntry.1.Id": "a",
                "SendMessageBatchRequestEntry.1.MessageBody": "hi",
                "SendMessageBatchRequestEntry.1.MessageAttribute.1": "color",
            },
        ),
    ]:
        status, root = _call(url, Action=action, **params)
        assert (status, _find(root, "sqs:Error/sqs:Code")) == (400, "MalformedQueryString"), action
    status, root = _call(url, Action="GetQueueAttributes", **{"AttributeName.1": "All"})
    got = {
        _find(a, "sqs:Name"): _find(a, "sqs:Value")
        for a in root.findall("sqs:GetQueueAttributesResult/sqs:Attribute", NS)
    }
    assert got["ApproximateNumberOfMessages"] == "0"  # nothing half-sent


def test_query_protocol_empty_lists(server: LiveServer, qname: str) -> None:
    """Pre-2024 botocore sends an empty list as its name with no value
    (``receive_message(AttributeNames=[])`` posts ``AttributeNames=``): an empty list,
    as SQS reads it, not an invalid parameter."""
    status, root = _call(server.url + "/", Action="CreateQueue", QueueName=qname)
    url = _find(root, "sqs:CreateQueueResult/sqs:QueueUrl")
    _call(url, Action="SendMessage", MessageBody="hello")
    status, root = _call(url, Action="ReceiveMessage", AttributeNames="", MessageAttributeNames="")
    assert status == 200, ET.tostring(root)
    assert _find(root, "sqs:ReceiveMessageResult/sqs:Message/sqs:Body") == "hello"
    status, root = _call(url, Action="GetQueueAttributes", AttributeNames="")
    assert status == 200, ET.tostring(root)
    status, root = _call(url, Action="UntagQueue", TagKeys="")
    assert status == 200, ET.tostring(root)
    status, root = _call(url, Action="DeleteMessageBatch", Entries="")
    assert status == 400
    assert _find(root, "sqs:Error/sqs:Code") == "AWS.SimpleQueueService.EmptyBatchRequest"


def test_query_protocol_empty_results_keep_their_element(server: LiveServer, qname: str) -> None:
    """A receive from an empty queue (and any other empty result) still has its
    ``<ActionResult>`` element, which SDKs look for; actions that answer nothing have none."""
    status, root = _call(server.url + "/", Action="CreateQueue", QueueName=qname)
    url = _find(root, "sqs:CreateQueueResult/sqs:QueueUrl")
    for action in ("ReceiveMessage", "ListQueueTags"):
        status, root = _call(url, Action=action)
        assert status == 200
        result = root.find(f"sqs:{action}Result", NS)
        assert result is not None and len(result) == 0, ET.tostring(root)
    status, root = _call(server.url + "/", Action="ListQueues", QueueNamePrefix=qname + "-none")
    assert root.find("sqs:ListQueuesResult", NS) is not None, ET.tostring(root)
    status, root = _call(url, Action="PurgeQueue")
    assert status == 200 and root.find("sqs:PurgeQueueResult", NS) is None


def test_query_protocol_fifo_queue(server: LiveServer, qname: str) -> None:
    """A FIFO queue as a pre-2024 SDK uses it: the attributes at creation, a batch with
    groups and deduplication ids, SequenceNumber in the XML answers, an attempt id."""
    status, root = _call(
        server.url + "/",
        Action="CreateQueue",
        QueueName=qname + ".fifo",
        **{"Attribute.1.Name": "FifoQueue", "Attribute.1.Value": "true"},
    )
    assert status == 200
    url = _find(root, "sqs:CreateQueueResult/sqs:QueueUrl")
    entries = {}
    for i, (group, dedup) in enumerate((("g", "one"), ("g", "two"), ("g", "one")), 1):
        entries |= {
            f"SendMessageBatchRequestEntry.{i}.Id": f"e{i}",
            f"SendMessageBatchRequestEntry.{i}.MessageBody": f"body {i}",
            f"SendMessageBatchRequestEntry.{i}.MessageGroupId": group,
            f"SendMessageBatchRequestEntry.{i}.MessageDeduplicationId": dedup,
        }
    status, root = _call(url, Action="SendMessageBatch", **entries)
    assert status == 200
    results = root.findall("sqs:SendMessageBatchResult/sqs:SendMessageBatchResultEntry", NS)
    numbers = {_find(r, "sqs:Id"): _find(r, "sqs:SequenceNumber") for r in results}
    assert numbers["e3"] == numbers["e1"] < numbers["e2"]  # e3 repeats e1
    status, root = _call(
        url, Action="ReceiveMessage", ReceiveRequestAttemptId="r-1", **{"AttributeName.1": "All"}
    )
    msg = root.find("sqs:ReceiveMessageResult/sqs:Message", NS)
    assert msg is not None
    attrs = {_find(a, "sqs:Name"): _find(a, "sqs:Value") for a in msg.findall("sqs:Attribute", NS)}
    assert attrs["SequenceNumber"] == numbers["e1"] and attrs["MessageGroupId"] == "g"
    _, again = _call(url, Action="ReceiveMessage", ReceiveRequestAttemptId="r-1")
    assert _find(again, "sqs:ReceiveMessageResult/sqs:Message/sqs:ReceiptHandle") == _find(
        msg, "sqs:ReceiptHandle"
    )
    status, root = _call(url, Action="SendMessage", MessageBody="x", MessageDeduplicationId="d")
    assert status == 400
    assert _find(root, "sqs:Error/sqs:Code") == "MissingParameter"
