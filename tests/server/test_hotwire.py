"""The compiled reader of the hot routes' bodies (``server/_hotwire.c`` through
``server/hot_bodies.py``) against the routes' pydantic schemas, and its answers against
the Python that wrote them before.

The reader's contract: a body it reads gives exactly what ``TypeAdapter(...).
validate_json`` and ``to_new_items`` / ``to_releases`` give (the same objects, field by
field, of the same types); a body pydantic refuses, or whose batch is over the limit, it
declines (``None``: the FastAPI app words the refusal); a body as clients write it
(``json.dumps``, any spacing, ASCII-escaped or not) it reads. Hypothesis generates valid
bodies and hostile ones — truncated, a byte changed or inserted, invalid UTF-8, NUL,
lone surrogates, repeated keys, floats, strings and bools where integers go, huge
numbers, deep nesting — and ``make sanitize`` runs this module against the extension
built with ASan/UBSan, so a read past the body or an overflow fails the run.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from dq.server import _hotwire
from dq.server.answers import dequeued_json, enqueued_json, outcome_dict, results_json
from dq.server.hot_bodies import dequeue_body, enqueue_body, release_body
from dq.server.schemas import (
    DequeueRequest,
    EnqueueRequest,
    InvalidItem,
    ReleaseRequest,
    encode_value,
    to_new_items,
    to_releases,
)
from dq.storage.codec import MAX_DEADLINE, MAX_ID
from dq.storage.types import Delivery, Enqueued, ItemOutcome, ItemStats
from dq.storage.validation import MAX_LEASE_MS

_ENQUEUE = TypeAdapter(EnqueueRequest)
_RELEASE = TypeAdapter(ReleaseRequest)
_DEQUEUE = TypeAdapter(DequeueRequest)
LIMIT = 4
MANY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Refused:
    """pydantic (or ``to_new_items``) refuses the body."""


REFUSED = Refused()


def _shape(x: Any) -> Any:
    """``x`` with every value's exact type beside it (so ``1`` is not ``True``)."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        fields = [(f.name, _shape(getattr(x, f.name))) for f in dataclasses.fields(x)]
        return (type(x).__name__, fields)
    if isinstance(x, list | tuple):
        return (type(x).__name__, [_shape(v) for v in x])
    return (type(x).__name__, x)


def pydantic_enqueue(body: bytes) -> Any:
    try:
        return to_new_items(_ENQUEUE.validate_json(body).items)
    except (ValidationError, InvalidItem):
        return REFUSED


def pydantic_release(body: bytes) -> Any:
    try:
        return to_releases(_RELEASE.validate_json(body).items)
    except ValidationError:
        return REFUSED


def pydantic_dequeue(body: bytes) -> Any:
    try:
        r = _DEQUEUE.validate_json(body)
    except ValidationError:
        return REFUSED
    release = None if r.release is None else to_releases(r.release)
    return (r.count, r.lease_ms, r.wait_ms, r.encoding, release)


def _batch_of(result: Any) -> list[Any]:
    if isinstance(result, tuple):  # a dequeue's: its releases
        return result[4] or []
    return list(result)


def check(body: bytes, ours: Any, theirs: Any) -> None:
    """The compiled reader's result ``ours`` agrees with pydantic's ``theirs``."""
    if ours is None:
        return  # declined: the app answers, whatever pydantic says
    assert theirs is not REFUSED, f"read a body pydantic refuses: {body!r}"
    assert len(_batch_of(ours)) <= LIMIT
    assert _shape(ours) == _shape(theirs), body


def check_all(body: bytes) -> None:
    for read, reference in (
        (enqueue_body, pydantic_enqueue),
        (release_body, pydantic_release),
        (dequeue_body, pydantic_dequeue),
    ):
        ours = read(body, LIMIT)
        theirs = reference(body)
        check(body, ours, theirs)
        if ours is None and theirs is not REFUSED:
            # declined though valid: only a batch over the limit, or an unusual writing
            # (tests below check that plain bodies are read)
            pass
        # the buffer protocol: a bytearray reads the same
        assert _shape(read(bytearray(body), LIMIT)) == _shape(ours)


# ------------------------------------------------------------------ valid bodies

_text = st.text(max_size=20)
_times = st.integers(0, MAX_DEADLINE)
_absent = st.just(dataclasses.MISSING)


@st.composite
def new_items(draw: st.DrawFn) -> dict[str, Any]:
    item: dict[str, Any] = {}
    if draw(st.booleans()):
        item["encoding"] = "base64"
        item["value"] = base64.b64encode(draw(st.binary(max_size=20))).decode()
    else:
        if draw(st.booleans()):
            item["encoding"] = "utf-8"
        item["value"] = draw(_text)
    for name in ("deadline", "delay_ms"):
        v = draw(_absent | st.none() | _times)
        if v is not dataclasses.MISSING:
            item[name] = v
    for name in ("key", "group"):
        v = draw(_absent | st.none() | _text)
        if v is not dataclasses.MISSING:
            item[name] = v
    v = draw(_absent | st.sampled_from(["keep", "replace"]))
    if v is not dataclasses.MISSING:
        item["on_duplicate"] = v
    keys = draw(st.permutations(list(item)))
    return {k: item[k] for k in keys}


_releases = st.fixed_dictionaries(
    {"id": st.integers(0, MAX_ID), "receipt": st.text(min_size=1, max_size=20)}
)


@st.composite
def dequeues(draw: st.DrawFn) -> dict[str, Any]:
    d: dict[str, Any] = {}
    fields = {
        "count": st.integers(-(1 << 63) + 1, (1 << 63) - 1),
        "lease_ms": st.none() | st.integers(1, MAX_LEASE_MS),
        "wait_ms": _times,
        "encoding": st.none() | st.sampled_from(["utf-8", "base64"]),
        "release": st.none() | st.lists(_releases, max_size=LIMIT),
    }
    for name, values in fields.items():
        if draw(st.booleans()):
            d[name] = draw(values)
    return d


_bodies = st.one_of(
    st.lists(new_items(), min_size=1, max_size=LIMIT).map(lambda xs: {"items": xs}),
    st.lists(_releases, min_size=1, max_size=LIMIT).map(lambda xs: {"items": xs}),
    dequeues(),
)


@st.composite
def written(draw: st.DrawFn, doc: Any) -> bytes:
    """``doc`` as a client writes it: json.dumps with any spacing, escaped or not."""
    ascii_only = draw(st.booleans())
    indent = draw(st.none() | st.integers(0, 2))
    seps = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :\t")]))
    text = json.dumps(doc, ensure_ascii=ascii_only, indent=indent, separators=seps)
    pad = draw(st.sampled_from(["", " ", "\n", "\r\n\t "]))
    return (pad + text + pad).encode()


@given(_bodies.flatmap(written))
@MANY
def test_plain_bodies_are_read_as_pydantic_reads_them(body: bytes) -> None:
    doc = json.loads(body)
    is_dequeue = "items" not in doc
    items = doc.get("items", [])
    if is_dequeue:
        ours, theirs = dequeue_body(body, LIMIT), pydantic_dequeue(body)
    elif items and "receipt" in items[0]:
        ours, theirs = release_body(body, LIMIT), pydantic_release(body)
    else:
        ours, theirs = enqueue_body(body, LIMIT), pydantic_enqueue(body)
    both_whens = any(i.get("deadline") is not None and i.get("delay_ms") is not None for i in items)
    if both_whens:  # to_new_items refuses it: declined
        assert theirs is REFUSED and ours is None
        return
    assert theirs is not REFUSED, body
    assert ours is not None, f"declined a plain valid body: {body!r}"
    assert _shape(ours) == _shape(theirs)
    check_all(body)


# ------------------------------------------------------------------ hostile bodies

#: values where a field's own is expected: the other JSON types, unusual numbers
_odd_values = st.sampled_from(
    [
        "5.0", "5e0", "1E2", "-0", "-0.0", "01", "-1", '"5"', '" 5 "', '"1_0"', "true",
        "false", "null", "[]", "{}", '""', "1e400", "NaN", "Infinity", str(1 << 64),
        str((1 << 64) - 1), str(1 << 63), str(-(1 << 63)), str(MAX_DEADLINE + 1),
        str(MAX_LEASE_MS + 1), "0", '"utf-8"', '"base64"', '"UTF-8"', '"keep"',
        '"\\u0000"', '"\\ud800"', '"\\udc00\\ud800"', '"\\ud83d\\ude00"', '"a\\u00e9"',
        '"YQ=="', '"YQ"', '"YQ="', '"YR=="', '"===="', '"=="', '"A==="', '"Y Q=="',
        '"\\/"', '"\\x"', '"x' + "\x01" + '"', "[" * 200 + "]" * 200, "{" * 100,
    ]
)  # fmt: skip
_keys = st.sampled_from(
    ["items", "value", "encoding", "deadline", "delay_ms", "key", "group", "on_duplicate",
     "id", "receipt", "count", "lease_ms", "wait_ms", "release", "extra", "\\u0063ount",
     "val\\u0075e", "items\\u0000"]
)  # fmt: skip


#: what may not stand inside a JSON string: surrogates, overlong forms, past U+10FFFF,
#: a lone continuation byte, a cut sequence, bytes UTF-8 never uses, control characters
BAD_TEXT = [
    b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf",
     b"\xf0\x80\x80\xaf", b"\xf4\x90\x80\x80", b"\x80", b"\xbf", b"\xe2\x82", b"\xf0\x9f\x98",
     b"\xf5\x80\x80\x80", b"\xff", b"\x00", b"\x1f", b"\n", b"\t"
]  # fmt: skip
_bad_text = st.sampled_from(BAD_TEXT)


@st.composite
def hostile(draw: st.DrawFn) -> bytes:
    body = bytearray(draw(_bodies.flatmap(written)))
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.integers(0, 7))
        at = draw(st.integers(0, len(body)))
        if how == 0:  # truncated
            del body[at:]
        elif how == 1:  # a byte changed
            if at < len(body):
                body[at] = draw(st.integers(0, 255))
        elif how == 2:  # bytes inserted: invalid UTF-8, NUL, odd values
            body[at:at] = draw(
                st.sampled_from(
                    [b"\x00", b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                     b"\xe2\x82", b",", b"}", b"]", b'"', b"\\", b" "]
                )
            )  # fmt: skip
        elif how == 3:  # a member added where a member may go (a repeat, an unknown)
            brace = body.rfind(b"{", 0, at + 1)
            if brace >= 0:
                member = b'"%s": %s,' % (
                    draw(_keys).encode(),
                    draw(_odd_values).encode("utf-8", "surrogatepass"),
                )
                body[brace + 1 : brace + 1] = member
        elif how == 4:  # a value replaced by an odd one
            colon = body.find(b":", at)
            if colon >= 0:
                end = colon + 1
                while end < len(body) and body[end] not in b",}]":
                    end += 1
                body[colon + 1 : end] = draw(_odd_values).encode()
        elif how == 5:  # a repeated key: the member after a brace written twice
            brace = body.find(b"{", at)
            comma = body.find(b",", brace)
            if brace >= 0 and comma > brace:
                body[brace + 1 : brace + 1] = body[brace + 1 : comma + 1]
        elif how == 6:  # invalid UTF-8 (or a control character) inside a string
            quote = body.find(b'"', at)
            if quote >= 0:
                body[quote + 1 : quote + 1] = draw(_bad_text)
        else:  # a batch over the limit
            body = bytearray(
                json.dumps({"items": [{"value": "v"}] * (LIMIT + draw(st.integers(1, 3)))}),
                "ascii",
            )
    return bytes(body)


def test_invalid_text_in_any_string_is_declined() -> None:
    """Each invalid sequence, in each string of a valid body, is declined."""
    plain = [
        b'{"items":[{"value":"aX","key":"kX","group":"gX","encoding":"utf-8"}]}',
        b'{"items":[{"id":1,"receipt":"rX"}]}',
        b'{"encoding":"base64","release":[{"id":1,"receipt":"rX"}]}',
    ]
    for body, read_plain in zip(plain, (enqueue_body, release_body, dequeue_body), strict=True):
        assert read_plain(body.replace(b"X", b""), LIMIT) is not None
        for bad in BAD_TEXT:
            for at in range(body.count(b"X")):
                parts = body.split(b"X")
                broken = b"".join(p + (bad if i == at else b"") for i, p in enumerate(parts))
                for read in (enqueue_body, release_body, dequeue_body):
                    assert read(broken, LIMIT) is None, broken
                check_all(broken)


@given(hostile())
@MANY
@example(b"")
@example(b"\x00")
@example(b'{"items":[{"value":"a"}]}\x00')
@example(b'\xef\xbb\xbf{"items":[{"value":"a"}]}')
@example(b'{"items":[{"value":"a","value":"b"}]}')
@example(b'{"items":[{"value":"a\\ud800"}]}')
@example(b'{"items":[{"value":"\\ud83d\\ude00\xf0\x9f\x98\x80"}]}')
@example(b'{"items":[{"value":"a","deadline":5,"delay_ms":6}]}')
@example(b'{"items":[{"value":"YR==","encoding":"base64"}]}')
@example(b'{"items":[{"value":"YQ","encoding":"base64"}]}')
@example(b'{"items":[{"id":1,"receipt":"' + b"r" * 513 + b'"}]}')
@example(b'{"items":[{"id":1,"receipt":"' + "\u00e9".encode() * 512 + b'"}]}')
@example(b'{"count": -9223372036854775808}')
@example(b'{"count": -}')
@example(b'{"count": 1, "count": 2}')
@example(b'{"release": [' + b"[" * 5000)
def test_hostile_bodies_are_read_as_pydantic_reads_them_or_declined(body: bytes) -> None:
    check_all(body)


@given(st.binary(max_size=200))
@MANY
def test_any_bytes_never_break_the_reader(body: bytes) -> None:
    check_all(body)


def test_a_batch_over_the_limit_is_declined() -> None:
    """The app's middleware answers it (413 batch_too_large), reading at most
    ``limit + 1`` items."""
    items = json.dumps({"items": [{"value": "v"}] * (LIMIT + 1)}).encode()
    assert enqueue_body(items, LIMIT) is None
    assert enqueue_body(items, LIMIT + 1) is not None
    rel = json.dumps({"items": [{"id": 1, "receipt": "r"}] * (LIMIT + 1)}).encode()
    assert release_body(rel, LIMIT) is None
    assert release_body(rel, LIMIT + 1) is not None
    deq = json.dumps({"release": [{"id": 1, "receipt": "r"}] * (LIMIT + 1)}).encode()
    assert dequeue_body(deq, LIMIT) is None
    assert dequeue_body(deq, LIMIT + 1) is not None


def test_values_the_schema_bounds_are_bound_from_the_rules() -> None:
    """The reader's bounds are the schema's (bound from storage/validation.py and
    storage/codec.py): the last value inside each is read, the first outside declined."""
    within = [
        b'{"items":[{"value":"","deadline":%d}]}' % MAX_DEADLINE,
        b'{"items":[{"id":%d,"receipt":"%s"}]}' % (MAX_ID, b"r" * 512),
        b'{"lease_ms":%d,"wait_ms":%d}' % (MAX_LEASE_MS, MAX_DEADLINE),
        b'{"lease_ms":1}',
    ]
    outside = [
        b'{"items":[{"value":"","deadline":%d}]}' % (MAX_DEADLINE + 1),
        b'{"items":[{"id":%d,"receipt":"r"}]}' % (MAX_ID + 1),
        b'{"items":[{"id":1,"receipt":"%s"}]}' % (b"r" * 513),
        b'{"items":[{"id":1,"receipt":""}]}',
        b'{"lease_ms":%d}' % (MAX_LEASE_MS + 1),
        b'{"lease_ms":0}',
        b'{"wait_ms":%d}' % (MAX_DEADLINE + 1),
    ]
    for body in within:
        read = enqueue_body if b"value" in body else release_body if b"id" in body else dequeue_body
        reference = (
            pydantic_enqueue
            if read is enqueue_body
            else pydantic_release
            if read is release_body
            else pydantic_dequeue
        )
        assert read(body, LIMIT) is not None, body
        check(body, read(body, LIMIT), reference(body))
    for body in outside:
        assert enqueue_body(body, LIMIT) is None and release_body(body, LIMIT) is None
        assert dequeue_body(body, LIMIT) is None, body


# ------------------------------------------------------------------ answers


def python_enqueued(done: list[Enqueued]) -> bytes:
    """What server/answers.py wrote before the answer was compiled."""
    parts = []
    for e in done:
        end = (
            ',"duplicate":false,"replaced":true}'
            if e.replaced
            else ',"duplicate":true}'
            if e.duplicate
            else ',"duplicate":false}'
        )
        parts.append(f'{{"id":{e.id:d},"deadline":{e.deadline:d}' + end)
    return ('{"items":[' + ",".join(parts) + "]}").encode()


def python_results(outcomes: list[ItemOutcome]) -> bytes:
    """What server/answers.py wrote before the answer was compiled."""
    return (
        '{"results":['
        + ",".join(
            f'{{"id":{o.id:d},"ok":true}}'
            if o.error is None
            and o.receipt is None
            and o.deadline is None
            and o.lease_expires is None
            else json.dumps(outcome_dict(o), separators=(",", ":"))
            for o in outcomes
        )
        + "]}"
    ).encode()


_any_text = st.text(st.characters(codec=None, categories=None), max_size=12)  # surrogates too
_maybe = st.none() | _times
_outcomes = st.builds(
    ItemOutcome,
    st.integers(0, MAX_ID),
    st.none() | _any_text,
    st.none() | _any_text,
    st.none() | _any_text,
    _maybe,
    _maybe,
)


@given(
    st.lists(
        st.builds(Enqueued, st.integers(0, MAX_ID), _times, st.booleans(), st.booleans()),
        max_size=4,
    )
)
@MANY
def test_enqueued_answer_is_the_python_one(done: list[Enqueued]) -> None:
    assert enqueued_json(done) == python_enqueued(done)


@given(st.lists(_outcomes, max_size=4))
@MANY
def test_results_answer_is_the_python_one(outcomes: list[ItemOutcome]) -> None:
    assert results_json(outcomes) == python_results(outcomes)


_ITEM_JSON = (
    '{"id":%d,"receipt":%s,"value":%s,"encoding":"%s","deadline":%d,'
    '"stats":{"enqueue_time":%d,"requeue_time":%d,"dequeue_count":%d},"lease_expires":%d,'
    '"group":%s}'
)


def python_dequeued(
    got: list[Delivery],
    encoding: Any,
    released: list[ItemOutcome] | None = None,
    queue_exists: bool = True,
) -> bytes:
    """What server/answers.py wrote before the answer was compiled."""
    dumps = json.dumps
    parts = []
    for d in got:
        text, enc = encode_value(d.value, encoding)
        s = d.stats
        item = _ITEM_JSON % (
            d.id, dumps(d.receipt), dumps(text), enc, d.deadline,
            s.enqueue_time, s.requeue_time, s.dequeue_count, d.lease_expires,
            "null" if d.group is None else dumps(d.group),
        )  # fmt: skip
        if d.last_error is not None:
            error, at = dumps(d.last_error), d.last_error_at or 0
            item = item[:-1] + f',"last_error":{error},"last_error_at":{at:d}}}'
        parts.append(item)
    if released is not None:
        tail = '],"released":[' + python_results(released)[12:-2].decode() + "]}"
    elif not queue_exists:
        tail = '],"queue_exists":false}'
    else:
        tail = "]}"
    return ('{"items":[' + ",".join(parts) + tail).encode()


#: values: text, invalid UTF-8 (overlong, surrogates, cut), control characters, any bytes
_values = st.one_of(
    st.binary(max_size=40),
    _any_text.map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.lists(st.sampled_from([b"a", b"\x7f", b"\x00", b'"', b"\\", *BAD_TEXT])).map(b"".join),
)
_deliveries = st.builds(
    Delivery,
    id=st.integers(0, MAX_ID),
    receipt=_any_text,
    value=_values,
    deadline=_times,
    stats=st.builds(ItemStats, _times, _times, st.integers(0, 0xFFFFFFFF)),
    lease_expires=_times,
    group=st.none() | _any_text,
    last_error=st.none() | _any_text,
    last_error_at=_maybe,
)


@given(
    st.lists(_deliveries, max_size=3),
    st.sampled_from([None, "utf-8", "base64"]),
    st.none() | st.lists(_outcomes, max_size=3),
    st.booleans(),
)
@MANY
def test_dequeued_answer_is_the_python_one(
    got: list[Delivery], encoding: Any, released: list[ItemOutcome] | None, exists: bool
) -> None:
    assert dequeued_json(got, encoding, released, exists) == python_dequeued(
        got, encoding, released, exists
    )
    if released is None and exists:
        assert dequeued_json(got, encoding) == python_dequeued(got, encoding)


@given(st.binary(max_size=50), st.binary(max_size=50), st.binary(max_size=3000))
def test_message_is_head_length_tail_body(head: bytes, tail: bytes, body: bytes) -> None:
    assert _hotwire.message(head, tail, body) == b"%s%d%s%s" % (head, len(body), tail, body)
