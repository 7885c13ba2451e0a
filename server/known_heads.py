"""The heads of hot requests the parser has read before, to serve them again without it.

The parser's callbacks cost a dozen Python calls a request, and a client sends the same
head (request line and header lines, ``Content-Length`` included) again and again. So
once the parser has read a hot request that arrived whole in one read, its head's bytes
are remembered with what the callbacks made of them (``Head``); a later read that
starts, between requests, with the same bytes and holds the whole body is served as the
callbacks would have served it (``server/protocol.py``, ``_serve_known``). The parser
makes the same of the same bytes from the same state, so nothing is guessed. Enqueues
differ in their body's length, so a head is also remembered with its one
``Content-Length`` value left out (``Sized``): a head equal to it in every other byte,
whose value is plain digits within the body limit, is served the same way with its own
length — the one header value the parser would read differently.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

__all__ = ["HOT_START", "Head", "KnownHeads", "content_length"]

#: What a read must start with to be looked up among the heads seen before.
HOT_START = b"POST /v1/"
#: Heads longer than this are not remembered; past this many, the memory starts afresh.
_HEAD_MAX = 2048
_HEADS_MAX = 256
#: The ``Content-Length`` lines a remembered head may leave its value out of, as clients
#: write them (h11 and most clients lower-case, ``http.client`` capitalised).
_LENGTH_LINES = (b"\r\ncontent-length: ", b"\r\nContent-Length: ")
#: Where the value was, in a sized head's key (a head holding a NUL is not remembered
#: sized, so a key has exactly one).
_LENGTH_GAP = b"\x00"
#: Longest ``Content-Length`` value served from a sized head (the body limit is smaller).
_LENGTH_DIGITS = 9


class Head(NamedTuple):
    """What the parser and the fast path's candidate check made of a hot request's head."""

    path: str
    headers: tuple[tuple[bytes, bytes], ...]
    #: (route, queue)
    hot: tuple[str, str]
    #: the body's length (``Content-Length``)
    length: int


class Sized(NamedTuple):
    """A remembered head without its ``Content-Length`` value: what the parser made of
    it, and where that value sits among its headers."""

    head: Head
    #: index of the ``content-length`` header in ``head.headers``
    at: int


def content_length(headers: Iterable[tuple[bytes, bytes]]) -> int:
    """The request's one ``Content-Length``, or -1 (none, or not plain digits)."""
    length = -1
    for name, value in headers:
        if name == b"content-length":
            if length >= 0 or not value.isdigit():
                return -1
            length = int(value)
    return length


class KnownHeads:
    """The heads remembered for one server (shared by its connections)."""

    __slots__ = ("body_limit", "exact", "sized")

    def __init__(self, body_limit: int) -> None:
        self.body_limit = body_limit
        self.exact: dict[bytes, Head] = {}
        self.sized: dict[bytes, Sized] = {}

    def learn(self, data: bytes, seen: Head) -> None:
        """Remember the head of the one hot request ``data`` held, whole, from its first
        byte: the parser would make ``seen`` of those bytes again."""
        end = data.find(b"\r\n\r\n") + 4
        if 4 <= end <= _HEAD_MAX and end + seen.length == len(data):
            heads = self.exact
            if len(heads) >= _HEADS_MAX:
                heads.clear()
            head = data[:end]
            heads[head] = seen
            sized = _sized_template(head, seen)
            if sized is not None:
                templates = self.sized
                if len(templates) >= _HEADS_MAX:
                    templates.clear()
                templates[sized[0]] = sized[1]

    def find(self, data: bytes, end: int) -> Head | None:
        """The remembered head ``data[:end]`` is, exactly or but for its length."""
        head = self.exact.get(data[:end])
        return head if head is not None else self._sized(data, end)

    def _sized(self, data: bytes, end: int) -> Head | None:
        """The remembered head ``data[:end]`` equals but for its ``Content-Length``
        value, made with this request's value; None when there is none, or the value is
        not one the parser and the fast path read alike (plain digits, no leading zero)
        within the body limit."""
        for line in _LENGTH_LINES:
            start = data.find(line, 0, end)
            if start >= 0:
                break
        else:
            return None
        start += len(line)
        stop = data.find(b"\r\n", start, end)
        digits = data[start:stop]
        if (
            not 0 < len(digits) <= _LENGTH_DIGITS
            or not digits.isdigit()
            or (digits[0] == 48 and len(digits) > 1)  # a leading "0"
        ):
            return None
        sized = self.sized.get(data[:start] + _LENGTH_GAP + data[stop:end])
        if sized is None:
            return None
        length = int(digits)
        if length > self.body_limit:
            return None  # the parser reads it, and the app refuses it (413)
        head = sized.head
        at = sized.at
        headers = (*head.headers[:at], (b"content-length", digits), *head.headers[at + 1 :])
        return Head(head.path, headers, head.hot, length)


def _sized_template(head: bytes, seen: Head) -> tuple[bytes, Sized] | None:
    """The key and entry remembering ``head`` with its value left out, or None when
    the head does not hold its one ``Content-Length`` as a line of ``_LENGTH_LINES``
    with the value the parser read (``seen.length``, written plainly)."""
    if head.lower().count(b"\r\ncontent-length:") != 1 or _LENGTH_GAP in head:
        return None  # (no NUL but the gap's: keys differ wherever their heads do)
    digits = str(seen.length).encode()
    for line in _LENGTH_LINES:
        start = head.find(line)
        if start >= 0:
            break
    else:
        return None
    start += len(line)
    stop = start + len(digits)
    if head[start:stop] != digits or head[stop : stop + 2] != b"\r\n":
        return None
    names = [name for name, _ in seen.headers]
    if names.count(b"content-length") != 1:
        return None
    key = head[:start] + _LENGTH_GAP + head[stop:]
    return key, Sized(seen, names.index(b"content-length"))
