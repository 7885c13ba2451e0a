"""SQS queue URLs and ARNs to dq queue names and back; what is not one of ours is refused."""

from __future__ import annotations

import pytest

from dq.server.sqs.errors import SqsError
from dq.server.sqs.names import queue_arn, queue_from_arn, queue_from_url, queue_url


def test_names_round_trip() -> None:
    url = queue_url("http://h:1", "000000000000", "jobs.dlq")
    assert queue_from_url(url) == "jobs.dlq"
    assert queue_from_arn(queue_arn("eu-west-1", "1", "jobs"), "SourceArn") == "jobs"
    with pytest.raises(SqsError):
        queue_from_url("http://h:1/000000000000/..")
    with pytest.raises(SqsError):
        queue_from_arn("arn:aws:sns:us-east-1:1:topic", "SourceArn")
