"""SigV4 signatures as botocore makes them: accepted with a matching secret, refused
with another, with a body changed after signing, without one, and once too old."""

from __future__ import annotations

import time

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from dq.server.sqs.errors import SqsError
from dq.server.sqs.sigv4 import verify


def _signed(secret: str, body: bytes = b'{"QueueName":"q"}') -> AWSRequest:
    req = AWSRequest(
        method="POST",
        url="http://127.0.0.1:8080/",
        data=body,
        headers={
            "Content-Type": "application/x-amz-json-1.0",
            "X-Amz-Target": "AmazonSQS.GetQueueUrl",
        },
    )
    SigV4Auth(Credentials("AKIDEXAMPLE", secret), "sqs", "eu-west-1").add_auth(req)
    req.headers["Host"] = "127.0.0.1:8080"
    return req


def _verify(req: AWSRequest, secrets: list[str], body: bytes | None = None) -> object:
    headers = [(k.lower().encode(), v.encode()) for k, v in req.headers.items()]
    return verify("POST", "/", b"", headers, req.body if body is None else body, secrets)


def test_sigv4_accepts_botocore_signatures_and_rejects_others() -> None:
    req = _signed("token-1")
    caller = _verify(req, ["other", "token-1"])
    assert caller.access_key == "AKIDEXAMPLE" and caller.region == "eu-west-1"  # type: ignore[attr-defined]
    with pytest.raises(SqsError) as exc:
        _verify(req, ["token-2"])
    assert exc.value.shape == "SignatureDoesNotMatch"
    with pytest.raises(SqsError) as exc:  # body changed after signing
        _verify(req, ["token-1"], body=b'{"QueueName":"r"}')
    assert exc.value.shape == "SignatureDoesNotMatch"
    with pytest.raises(SqsError) as exc:
        verify("POST", "/", b"", [(b"host", b"x")], b"", ["token-1"])
    assert exc.value.shape == "MissingAuthenticationToken"


def test_sigv4_refuses_old_signatures() -> None:
    req = _signed("t")
    headers = [(k.lower().encode(), v.encode()) for k, v in req.headers.items()]
    with pytest.raises(SqsError) as exc:
        verify("POST", "/", b"", headers, req.body, ["t"], now=time.time() + 16 * 60)
    assert "expired" in exc.value.message
