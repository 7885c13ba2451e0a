"""Dead-letter queues through SQS: RedrivePolicy, the move to the DLQ, and back again
with StartMessageMoveTask; PurgeQueue; MessageDeduplicationId."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest


def _wait_task(sqs: Any, arn: str) -> dict[str, Any]:
    give_up = time.monotonic() + 15
    while time.monotonic() < give_up:
        (task,) = sqs.list_message_move_tasks(SourceArn=arn)["Results"]
        if task["Status"] not in ("RUNNING", "CANCELLING"):
            return task  # type: ignore[no-any-return]
        time.sleep(0.1)
    raise AssertionError("the move task did not finish")


def _arn(sqs: Any, url: str) -> str:
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
    return attrs["Attributes"]["QueueArn"]  # type: ignore[no-any-return]


def test_dead_letter_and_redrive_back(sqs: Any, qname: str) -> None:
    dlq_url = sqs.create_queue(QueueName=qname + "-dlq")["QueueUrl"]
    dlq_arn = _arn(sqs, dlq_url)
    policy = {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1}
    src_url = sqs.create_queue(
        QueueName=qname,
        Attributes={"VisibilityTimeout": "1", "RedrivePolicy": json.dumps(policy)},
    )["QueueUrl"]
    got = sqs.get_queue_attributes(QueueUrl=src_url, AttributeNames=["RedrivePolicy"])
    assert json.loads(got["Attributes"]["RedrivePolicy"]) == policy
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq_url)["queueUrls"] == [src_url]
    with pytest.raises(sqs.exceptions.InvalidAttributeValue):
        missing = {"deadLetterTargetArn": dlq_arn + "-nope", "maxReceiveCount": 1}
        sqs.set_queue_attributes(
            QueueUrl=src_url, Attributes={"RedrivePolicy": json.dumps(missing)}
        )
    for count in (2.7, True):  # no whole count: refused, not rounded to one
        with pytest.raises(sqs.exceptions.InvalidAttributeValue):
            odd = {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": count}
            sqs.set_queue_attributes(
                QueueUrl=src_url, Attributes={"RedrivePolicy": json.dumps(odd)}
            )
    got = sqs.get_queue_attributes(QueueUrl=src_url, AttributeNames=["RedrivePolicy"])
    assert json.loads(got["Attributes"]["RedrivePolicy"]) == policy

    attrs = {"why": {"DataType": "String", "StringValue": "poison"}}
    sent = sqs.send_message(QueueUrl=src_url, MessageBody="poison", MessageAttributes=attrs)
    (first,) = sqs.receive_message(QueueUrl=src_url, AttributeNames=["All"])["Messages"]
    assert first["Body"] == "poison"
    # the second receive finds it over its maxReceiveCount and moves it to the DLQ
    assert "Messages" not in sqs.receive_message(QueueUrl=src_url, WaitTimeSeconds=3)
    (dead,) = sqs.receive_message(
        QueueUrl=dlq_url, WaitTimeSeconds=5, MessageAttributeNames=["All"], AttributeNames=["All"]
    )["Messages"]
    assert dead["Body"] == "poison" and dead["MessageAttributes"] == attrs
    assert dead["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert dead["Attributes"]["SentTimestamp"] == first["Attributes"]["SentTimestamp"]
    assert dead["Attributes"]["ApproximateReceiveCount"] == "2"
    sqs.change_message_visibility(
        QueueUrl=dlq_url, ReceiptHandle=dead["ReceiptHandle"], VisibilityTimeout=0
    )

    # redrive: back to the queue it died in
    with pytest.raises(sqs.exceptions.ResourceNotFoundException):
        sqs.start_message_move_task(SourceArn=dlq_arn + "-nope")
    handle = sqs.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]
    assert handle
    task = _wait_task(sqs, dlq_arn)
    assert task["Status"] == "COMPLETED"
    assert task["ApproximateNumberOfMessagesMoved"] == 1
    (back,) = sqs.receive_message(
        QueueUrl=src_url, WaitTimeSeconds=5, MessageAttributeNames=["All"]
    )["Messages"]
    assert back["Body"] == "poison" and back["MessageAttributes"] == attrs
    sqs.delete_message(QueueUrl=src_url, ReceiptHandle=back["ReceiptHandle"])

    # removing the policy: the queue is no longer a source of the DLQ
    sqs.set_queue_attributes(QueueUrl=src_url, Attributes={"RedrivePolicy": ""})
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq_url)["queueUrls"] == []


def test_move_task_to_a_destination(sqs: Any, qname: str) -> None:
    dlq_url = sqs.create_queue(QueueName=qname + "-dlq")["QueueUrl"]
    other_url = sqs.create_queue(QueueName=qname + "-other")["QueueUrl"]
    policy = {"deadLetterTargetArn": _arn(sqs, dlq_url), "maxReceiveCount": 1}
    sqs.create_queue(QueueName=qname, Attributes={"RedrivePolicy": json.dumps(policy)})
    sqs.send_message_batch(
        QueueUrl=dlq_url, Entries=[{"Id": str(i), "MessageBody": f"m{i}"} for i in range(5)]
    )
    sqs.start_message_move_task(
        SourceArn=_arn(sqs, dlq_url),
        DestinationArn=_arn(sqs, other_url),
        MaxNumberOfMessagesPerSecond=50,
    )
    task = _wait_task(sqs, _arn(sqs, dlq_url))
    assert task["Status"] == "COMPLETED" and task["ApproximateNumberOfMessagesMoved"] == 5
    assert task["DestinationArn"] == _arn(sqs, other_url)
    got = sqs.receive_message(QueueUrl=other_url, MaxNumberOfMessages=10)["Messages"]
    assert sorted(m["Body"] for m in got) == [f"m{i}" for i in range(5)]


def test_purge(sqs: Any, qname: str) -> None:
    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "x"} for i in range(5)]
    )
    assert len(sqs.receive_message(QueueUrl=url)["Messages"]) == 1  # leased: purged too
    sqs.purge_queue(QueueUrl=url)
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessages"] == "0"
    assert attrs["ApproximateNumberOfMessagesNotVisible"] == "0"
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.purge_queue(QueueUrl=url + "-missing")


def test_deduplication_id(sqs: Any, qname: str) -> None:
    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    a = sqs.send_message(QueueUrl=url, MessageBody="once", MessageDeduplicationId="order-17")
    b = sqs.send_message(QueueUrl=url, MessageBody="once", MessageDeduplicationId="order-17")
    assert a["MessageId"] == b["MessageId"]
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"])[
        "Messages"
    ]
    assert len(got) == 1
    assert got[0]["Attributes"]["MessageDeduplicationId"] == "order-17"


def test_cancel_a_move_task(sqs: Any, qname: str) -> None:
    dlq_url = sqs.create_queue(QueueName=qname + "-dlq")["QueueUrl"]
    policy = {"deadLetterTargetArn": _arn(sqs, dlq_url), "maxReceiveCount": 1}
    src_url = sqs.create_queue(QueueName=qname, Attributes={"RedrivePolicy": json.dumps(policy)})[
        "QueueUrl"
    ]
    sqs.send_message_batch(
        QueueUrl=dlq_url, Entries=[{"Id": str(i), "MessageBody": f"m{i}"} for i in range(10)]
    )
    dlq_arn = _arn(sqs, dlq_url)
    # one message a second: cancelled long before all ten are moved
    handle = sqs.start_message_move_task(
        SourceArn=dlq_arn, DestinationArn=_arn(sqs, src_url), MaxNumberOfMessagesPerSecond=1
    )["TaskHandle"]
    with pytest.raises(sqs.exceptions.UnsupportedOperation):  # one task per queue at a time
        sqs.start_message_move_task(SourceArn=dlq_arn)
    (running,) = sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
    assert running["Status"] == "RUNNING" and running["TaskHandle"] == handle
    assert running["ApproximateNumberOfMessagesToMove"] == 10
    sqs.cancel_message_move_task(TaskHandle=handle)
    task = _wait_task(sqs, dlq_arn)
    assert task["Status"] == "CANCELLED"
    moved = task["ApproximateNumberOfMessagesMoved"]
    assert 0 <= moved < 10
    attrs = sqs.get_queue_attributes(
        QueueUrl=dlq_url, AttributeNames=["ApproximateNumberOfMessages"]
    )
    assert attrs["Attributes"]["ApproximateNumberOfMessages"] == str(10 - moved)
    with pytest.raises(sqs.exceptions.ResourceNotFoundException):
        sqs.cancel_message_move_task(TaskHandle=handle)


def test_a_move_task_that_leaves_a_message_in_flight_says_why(sqs: Any, qname: str) -> None:
    """A dead letter someone has received (in flight) is not moved: the task ends FAILED
    with a FailureReason saying so, as SQS reports a task that could not do its work,
    instead of COMPLETED with 0 of 1 moved and no word."""
    dlq_url = sqs.create_queue(QueueName=qname + "-dlq")["QueueUrl"]
    dlq_arn = _arn(sqs, dlq_url)
    policy = {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1}
    src_url = sqs.create_queue(QueueName=qname, Attributes={"RedrivePolicy": json.dumps(policy)})[
        "QueueUrl"
    ]
    sqs.send_message_batch(
        QueueUrl=dlq_url, Entries=[{"Id": str(i), "MessageBody": f"m{i}"} for i in range(3)]
    )
    (held,) = sqs.receive_message(QueueUrl=dlq_url, VisibilityTimeout=60)["Messages"]
    sqs.start_message_move_task(SourceArn=dlq_arn)
    task = _wait_task(sqs, dlq_arn)
    assert task["Status"] == "FAILED"
    assert task["ApproximateNumberOfMessagesToMove"] == 3
    assert task["ApproximateNumberOfMessagesMoved"] == 2
    reason = task["FailureReason"]
    assert "2 messages were moved" in reason and "1 message was in flight" in reason, reason
    moved = sqs.receive_message(QueueUrl=src_url, MaxNumberOfMessages=10, WaitTimeSeconds=2)
    assert sorted(m["Body"] for m in moved["Messages"]) == sorted(
        {"m0", "m1", "m2"} - {held["Body"]}
    )

    # once the message is visible again, a new task moves it and completes without a reason
    sqs.change_message_visibility(
        QueueUrl=dlq_url, ReceiptHandle=held["ReceiptHandle"], VisibilityTimeout=0
    )
    sqs.start_message_move_task(SourceArn=dlq_arn)
    task = _wait_task(sqs, dlq_arn)
    assert task["Status"] == "COMPLETED" and task["ApproximateNumberOfMessagesMoved"] == 1
    assert "FailureReason" not in task


def test_delete_queue_of_a_dead_letter_queue_in_use(sqs: Any, qname: str) -> None:
    """SQS deletes a queue that another's RedrivePolicy names (dq's own API asks for
    force): DeleteQueue keeps doing so."""
    dlq_url = sqs.create_queue(QueueName=qname + "-dlq")["QueueUrl"]
    policy = {"deadLetterTargetArn": _arn(sqs, dlq_url), "maxReceiveCount": 1}
    src_url = sqs.create_queue(QueueName=qname, Attributes={"RedrivePolicy": json.dumps(policy)})[
        "QueueUrl"
    ]
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq_url)["queueUrls"] == [src_url]
    sqs.delete_queue(QueueUrl=dlq_url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName=qname + "-dlq")
