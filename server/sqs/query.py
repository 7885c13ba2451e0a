"""SQS's older query protocol: form-encoded ``Action=...`` in, XML out.

SDKs from before SQS moved to JSON (botocore < 1.34.90, the AWS CLI bundling it, other
SDKs of that age) POST ``Action=SendMessage&QueueUrl=...&MessageAttribute.1.Name=...``
to ``/`` or to the queue's URL, and read XML. This module only translates: flattened
form parameters become the JSON protocol's parameter object, and the action's answer
(or error) becomes the query protocol's XML; the actions themselves are the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

from dq.server.sqs.errors import SqsError

__all__ = ["error_xml", "params_from_form", "result_xml"]

_NS = "http://queue.amazonaws.com/doc/2012-11-05/"
# XML would turn a raw CR into LF; keep it (and the markup characters) exact.
_ENTITIES = {"\r": "&#xD;", '"': "&quot;"}

#: flattened request lists: query name → JSON name
_LISTS = {
    "AttributeName": "AttributeNames",
    "MessageAttributeName": "MessageAttributeNames",
    "MessageSystemAttributeName": "MessageSystemAttributeNames",
    "TagKey": "TagKeys",
}
_ENTRIES = (
    "SendMessageBatchRequestEntry",
    "DeleteMessageBatchRequestEntry",
    "ChangeMessageVisibilityBatchRequestEntry",
)
#: An empty list arrives under its JSON name with no value (botocore's query serializer
#: sends ``AttributeNames=``): it is an empty list, as SQS reads it.
_EMPTY_LISTS = frozenset([*_LISTS.values(), "Entries"])
#: answer lists: JSON name → XML element of each member (``Successful`` depends on the action)
_MEMBERS = {
    "QueueUrls": "QueueUrl",
    "queueUrls": "QueueUrl",
    "Messages": "Message",
    "Failed": "BatchResultErrorEntry",
    "Results": "ListMessageMoveTasksResultEntry",
}


def _tree(pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """``A.1.B=x`` → ``{"A": {1: {"B": "x"}}}``."""
    root: dict[str, Any] = {}
    for key, value in pairs:
        node = root
        parts: list[Any] = [int(p) if p.isdigit() else p for p in key.split(".")]
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[parts[-1]] = value
    return root


def _members(node: object) -> list[Any]:
    if not isinstance(node, dict):
        raise SqsError(
            "MalformedQueryString", "A list parameter is not numbered (Name.1, Name.2...)."
        )
    return [node[k] for k in sorted(k for k in node if isinstance(k, int))]


def _structs(node: object, key: str) -> list[dict[Any, Any]]:
    """The members of a list of structures (``Attribute.1.Name=...``): a member given
    as a plain value (``Attribute.1=x``) names no field, and is refused as malformed."""
    members = _members(node)
    if not all(isinstance(m, dict) for m in members):
        raise SqsError(
            "MalformedQueryString", f"Each {key}.N must have fields ({key}.N.Name, ...)."
        )
    return members


def _attribute_value(v: Any) -> dict[str, str]:
    if not isinstance(v, dict):
        return {}
    return {k: v[k] for k in ("DataType", "StringValue", "BinaryValue") if k in v}


def _convert(tree: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, node in tree.items():
        if key in _LISTS:
            out[_LISTS[key]] = _members(node)
        elif key == "Attribute":
            out["Attributes"] = {m.get("Name"): m.get("Value", "") for m in _structs(node, key)}
        elif key == "Tag":
            tags = {m.get("Key"): m.get("Value", "") for m in _structs(node, key)}
            out["tags" if "QueueName" in tree else "Tags"] = tags
        elif key in ("MessageAttribute", "MessageSystemAttribute"):
            out[key + "s"] = {
                m.get("Name"): _attribute_value(m.get("Value")) for m in _structs(node, key)
            }
        elif key in _ENTRIES:
            out["Entries"] = [_convert(m) if isinstance(m, dict) else m for m in _members(node)]
        elif key in _EMPTY_LISTS and node == "":
            out[key] = []
        elif isinstance(node, dict):
            raise SqsError("MalformedQueryString", f"Unknown parameter {key}.")
        else:
            out[key] = node
    return out


def params_from_form(
    body: bytes, query: bytes, queue_path: str | None
) -> tuple[str, dict[str, Any]]:
    """(action, parameters) of a query-protocol request; the queue URL may be its path."""
    try:
        pairs = parse_qsl(query.decode(), keep_blank_values=True)
        pairs += parse_qsl(body.decode(), keep_blank_values=True, strict_parsing=bool(body))
    except (UnicodeDecodeError, ValueError):
        raise SqsError("MalformedQueryString", "The request is not form-encoded.") from None
    tree = _tree((k, v) for k, v in pairs if k not in ("Version", "Action"))
    actions = [v for k, v in pairs if k == "Action"]
    if not actions:
        raise SqsError("MissingParameter", "The request must contain the parameter Action.")
    params = _convert(tree)
    if queue_path is not None:
        params.setdefault("QueueUrl", queue_path)
    return actions[0], params


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return escape(str(value), _ENTITIES)


def _xml(key: str, value: Any, successful: str) -> str:
    if key in ("Attributes", "Tags") and isinstance(value, dict):
        tag, k, v = (
            ("Attribute", "Name", "Value") if key == "Attributes" else ("Tag", "Key", "Value")
        )
        return "".join(
            f"<{tag}><{k}>{_text(name)}</{k}><{v}>{_text(val)}</{v}></{tag}>"
            for name, val in value.items()
        )
    if key == "MessageAttributes" and isinstance(value, dict):
        return "".join(
            f"<MessageAttribute><Name>{_text(name)}</Name><Value>"
            + "".join(f"<{f}>{_text(x)}</{f}>" for f, x in a.items())
            + "</Value></MessageAttribute>"
            for name, a in value.items()
        )
    if isinstance(value, list):
        tag = successful if key == "Successful" else _MEMBERS.get(key, key)
        return "".join(f"<{tag}>{_body(v, successful)}</{tag}>" for v in value)
    if isinstance(value, dict):
        return f"<{key}>{_body(value, successful)}</{key}>"
    return f"<{key}>{_text(value)}</{key}>"


def _body(value: Any, successful: str) -> str:
    if isinstance(value, dict):
        return "".join(_xml(k, v, successful) for k, v in value.items())
    return _text(value)


#: Actions that answer nothing: the only ones whose answer has no ``<ActionResult>``.
_NO_RESULT = frozenset(
    [
        "ChangeMessageVisibility",
        "DeleteMessage",
        "DeleteQueue",
        "PurgeQueue",
        "SetQueueAttributes",
        "TagQueue",
        "UntagQueue",
    ]
)


def result_xml(action: str, result: dict[str, Any], request_id: str) -> str:
    """The answer's XML. Every action with a result has its ``<ActionResult>`` element,
    empty too (a receive from an empty queue, no tags): SDKs look for it (botocore
    raised ``KeyError: 'ReceiveMessageResult'`` on an empty receive without it)."""
    inner = _body(result, f"{action}ResultEntry")
    wrapped = "" if action in _NO_RESULT else f"<{action}Result>{inner}</{action}Result>"
    return (
        f'<?xml version="1.0"?><{action}Response xmlns="{_NS}">{wrapped}'
        f"<ResponseMetadata><RequestId>{request_id}</RequestId></ResponseMetadata>"
        f"</{action}Response>"
    )


def error_xml(err: SqsError, request_id: str) -> str:
    kind = "Sender" if err.sender_fault else "Receiver"
    return (
        f'<?xml version="1.0"?><ErrorResponse xmlns="{_NS}"><Error><Type>{kind}</Type>'
        f"<Code>{_text(err.code)}</Code><Message>{_text(err.message)}</Message><Detail/></Error>"
        f"<RequestId>{request_id}</RequestId></ErrorResponse>"
    )
