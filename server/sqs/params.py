"""Reading action parameters: the JSON protocol's typed values, checked as SQS checks them.

Every getter names the parameter in its error the way SQS does, so a client sees
``InvalidParameterValue`` / ``MissingParameter`` with a useful message rather than a 500.
"""

from __future__ import annotations

from typing import Any

from dq.server.sqs.errors import SqsError

__all__ = ["get_bool", "get_int", "get_list", "get_map", "get_str", "invalid"]


def invalid(name: str, value: object, reason: str) -> SqsError:
    return SqsError(
        "InvalidParameterValue",
        f"Value {value} for parameter {name} is invalid. Reason: {reason}",
    )


def _missing(name: str) -> SqsError:
    return SqsError("MissingParameter", f"The request must contain the parameter {name}.")


def get_str(p: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    value = p.get(name)
    if value is None:
        if required:
            raise _missing(name)
        return None
    if not isinstance(value, str):
        raise invalid(name, value, "must be a string.")
    return value


def get_int(
    p: dict[str, Any], name: str, lo: int, hi: int, *, default: int | None = None
) -> int | None:
    value = p.get(name)
    if value is None:
        return default
    if isinstance(value, bool):
        raise invalid(name, value, "must be an integer.")
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise invalid(name, value, "must be an integer.") from None
    if not isinstance(value, int):
        raise invalid(name, value, "must be an integer.")
    if not lo <= value <= hi:
        raise invalid(name, value, f"must be between {lo} and {hi}, if provided.")
    return value


def get_bool(p: dict[str, Any], name: str) -> bool | None:
    value = p.get(name)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in {"true", "false"}:
        return value.lower() == "true"
    raise invalid(name, value, "must be true or false.")


def get_list(p: dict[str, Any], name: str, *, required: bool = False) -> list[Any]:
    value = p.get(name)
    if value is None:
        if required:
            raise _missing(name)
        return []
    if not isinstance(value, list):
        raise invalid(name, value, "must be a list.")
    return value


def get_map(p: dict[str, Any], name: str) -> dict[str, Any]:
    value = p.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(name, value, "must be a map.")
    return value
