"""Queue URLs and ARNs: how SQS names a dq queue, and back.

URLs have ElasticMQ's shape, ``<scheme>://<host:port>/<account>/<queue>``, built from the
``Host`` the client used; ARNs are ``arn:aws:sqs:<region>:<account>:<queue>``. Parsing
takes the queue name from the last path segment or ARN field (the account is not
checked: one server is one account), so every URL and ARN we hand out round-trips.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from dq.server.sqs.errors import SqsError
from dq.storage.types import QUEUE_NAME_PATTERN

__all__ = ["queue_arn", "queue_from_arn", "queue_from_url", "queue_url", "valid_name"]


def valid_name(name: object) -> bool:
    return (
        isinstance(name, str)
        and QUEUE_NAME_PATTERN.fullmatch(name) is not None
        and name not in {".", ".."}
    )


def queue_url(base: str, account: str, name: str) -> str:
    return f"{base}/{account}/{name}"


def queue_arn(region: str, account: str, name: str) -> str:
    return f"arn:aws:sqs:{region}:{account}:{name}"


def queue_from_url(url: object) -> str:
    """The queue a ``QueueUrl`` names; ``InvalidAddress`` if it names none."""
    if not isinstance(url, str) or not url:
        raise SqsError("MissingParameter", "The request must contain the parameter QueueUrl.")
    path = urlsplit(url).path if "://" in url else url
    name = unquote(path.rstrip("/").rsplit("/", 1)[-1])
    if not valid_name(name):
        raise SqsError("InvalidAddress", f"The address {url} is not valid for this endpoint.")
    return name


def queue_from_arn(arn: object, parameter: str) -> str:
    """The queue an SQS ARN names; ``InvalidParameterValue`` if it is not one."""
    parts = arn.split(":", 5) if isinstance(arn, str) else []
    if len(parts) != 6 or parts[0] != "arn" or parts[2] != "sqs" or not valid_name(parts[5]):
        raise SqsError(
            "InvalidParameterValue",
            f"Value {arn} for parameter {parameter} is invalid. Reason: not an SQS queue ARN.",
        )
    return parts[5]
