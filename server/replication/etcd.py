"""A small client of etcd 3.4's JSON gateway: key ranges, puts, deletes, transactions, leases.

Why not a package: ``etcd3`` (the gRPC client) has had no release since 2020 and breaks
with protobuf 4 and later; the gateway that every etcd server serves beside gRPC needs
nothing but HTTP and JSON, so this module speaks it over the standard library's
``http.client``, as Patroni's etcd3 store does over urllib3 (``patroni/dcs/etcd3.py``).

The gateway (``POST /v3/kv/range``, ``/v3/kv/put``, ``/v3/kv/deleterange``,
``/v3/kv/txn``, ``/v3/lease/grant``, ``/v3/lease/keepalive``, ``/v3/lease/revoke``)
takes and gives protobuf messages as JSON: keys and values are base64, 64-bit numbers
are strings, and fields holding their zero value are left out (a transaction whose
comparison failed has no ``succeeded``; an expired lease's keep-alive has no ``TTL``).

Endpoints: a comma-separated list of client URLs. Every call goes to the endpoint that
answered last; when it cannot be reached, times out, or answers that it has no quorum,
the call moves on to the next one, and fails with one ``EtcdError`` naming every
endpoint tried when none answered. A transaction retried on another endpoint may have
been applied by the first one: callers compare on revisions, and read back what they
find when a comparison fails (see ``coordinator.py``).

Thread safety: a call takes an idle connection (or opens one) and gives it back
when answered, so the lease keep-alive thread and the role loop never share a socket.
"""

from __future__ import annotations

import base64
import http.client
import json
import threading
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EtcdClient",
    "EtcdError",
    "KeyValue",
    "Lease",
    "RangeResult",
    "TxnResult",
    "compare_create",
    "compare_mod",
    "compare_version",
    "delete_op",
    "parse_endpoints",
    "put_op",
    "range_op",
]

#: gRPC status codes the gateway passes on, after which another member may answer:
#: CANCELED, DEADLINE_EXCEEDED, UNAVAILABLE ("no leader", "request timed out").
_TRY_NEXT_CODES = frozenset({1, 4, 14})


class EtcdError(Exception):
    """A call etcd did not answer, or answered with an error.

    ``endpoint`` is the endpoint that answered (or, when none did, the list tried);
    ``code`` is the gRPC status code etcd gave (None when no endpoint answered).
    """

    def __init__(self, endpoint: str, message: str, code: int | None = None) -> None:
        super().__init__(f"etcd {endpoint}: {message}")
        self.endpoint = endpoint
        self.code = code


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as etcd stores it (``mvccpb.KeyValue``)."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    def json(self) -> Any:
        """The value decoded as JSON."""
        return json.loads(self.value)


@dataclass(frozen=True, slots=True)
class RangeResult:
    """The keys a range found, and the store's revision when it was read."""

    revision: int
    kvs: tuple[KeyValue, ...]

    def first(self) -> KeyValue | None:
        return self.kvs[0] if self.kvs else None


@dataclass(frozen=True, slots=True)
class TxnResult:
    """Which branch a transaction ran, the revision after it, and what its ranges read."""

    succeeded: bool
    revision: int
    #: the result of every ``range_op`` of the branch that ran, in order
    ranges: tuple[RangeResult, ...]


@dataclass(frozen=True, slots=True)
class Lease:
    id: int
    ttl: int


def _b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode("ascii")


def _range_end(prefix: str) -> str:
    """The end of the range holding every key that starts with ``prefix``."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return _b64(b"\0")
    raw[-1] += 1
    return _b64(bytes(raw))


def compare_create(key: str, revision: int, result: str = "EQUAL") -> dict[str, Any]:
    """Compare ``key``'s create_revision (0: the key does not exist)."""
    return {"key": _b64(key), "target": "CREATE", "result": result, "create_revision": revision}


def compare_mod(key: str, revision: int, result: str = "EQUAL") -> dict[str, Any]:
    """Compare ``key``'s mod_revision (0: the key does not exist)."""
    return {"key": _b64(key), "target": "MOD", "result": result, "mod_revision": revision}


def compare_version(key: str, version: int, result: str = "EQUAL") -> dict[str, Any]:
    """Compare ``key``'s version (0: the key does not exist)."""
    return {"key": _b64(key), "target": "VERSION", "result": result, "version": version}


def put_op(key: str, value: str | bytes, lease: int = 0) -> dict[str, Any]:
    request: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease:
        request["lease"] = lease
    return {"request_put": request}


def delete_op(key: str) -> dict[str, Any]:
    return {"request_delete_range": {"key": _b64(key)}}


def range_op(key: str, prefix: bool = False) -> dict[str, Any]:
    request = {"key": _b64(key)}
    if prefix:
        request["range_end"] = _range_end(key)
    return {"request_range": request}


def parse_endpoints(raw: str | Sequence[str]) -> tuple[str, ...]:
    """``"http://a:2379, http://b:2379"`` → a tuple of base URLs (no trailing slash)."""
    items = raw.split(",") if isinstance(raw, str) else list(raw)
    endpoints = tuple(e.strip().rstrip("/") for e in items if e.strip())
    for endpoint in endpoints:
        parts = urllib.parse.urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an etcd client URL (http[s]://host:port): {endpoint!r}")
    if not endpoints:
        raise ValueError("no etcd endpoint given")
    return endpoints


def _kv(raw: Mapping[str, Any]) -> KeyValue:
    return KeyValue(
        key=base64.b64decode(raw.get("key", "")).decode(errors="replace"),
        value=base64.b64decode(raw.get("value", "")),
        create_revision=int(raw.get("create_revision", 0)),
        mod_revision=int(raw.get("mod_revision", 0)),
        version=int(raw.get("version", 0)),
        lease=int(raw.get("lease", 0)),
    )


def _range(raw: Mapping[str, Any], revision: int) -> RangeResult:
    header = raw.get("header") or {}
    return RangeResult(
        revision=int(header.get("revision", revision)),
        kvs=tuple(_kv(kv) for kv in raw.get("kvs", ())),
    )


def _error_of(answer: Mapping[str, Any]) -> tuple[int | None, str | None]:
    """The gRPC code and message of an error answer: unary calls answer
    ``{"error": msg, "code": n}``, streaming ones (keep-alive)
    ``{"error": {"grpc_code": n, "message": msg}}``; (None, None) for a good answer."""
    error = answer.get("error")
    if isinstance(error, dict):
        return error.get("grpc_code"), str(error.get("message", error))
    if "code" in answer:
        return int(answer["code"]), str(error or answer.get("message", ""))
    return None, None


def _revision(body: Mapping[str, Any]) -> int:
    return int((body.get("header") or {}).get("revision", 0))


class EtcdClient:
    """Calls to an etcd cluster through its JSON gateway; see the module docstring."""

    def __init__(self, endpoints: str | Sequence[str], timeout_s: float = 1.0) -> None:
        self.endpoints = parse_endpoints(endpoints)
        self.timeout_s = timeout_s
        self._current = 0
        self._lock = threading.Lock()
        #: connections that answered and stay open, per endpoint; a call takes one
        #: (or opens one) and gives it back, so threads never share a socket
        self._idle: dict[str, list[http.client.HTTPConnection]] = {}

    # -- key-value --------------------------------------------------------------------

    def range(self, key: str, prefix: bool = False) -> RangeResult:
        body = self.call("/v3/kv/range", range_op(key, prefix)["request_range"])
        return _range(body, _revision(body))

    def get(self, key: str) -> KeyValue | None:
        return self.range(key).first()

    def put(self, key: str, value: str | bytes, lease: int = 0) -> int:
        """Store ``value`` at ``key``; returns the revision of the write."""
        return _revision(self.call("/v3/kv/put", put_op(key, value, lease)["request_put"]))

    def delete(self, key: str, prefix: bool = False) -> int:
        """Delete ``key`` (or every key under the prefix); returns how many were deleted."""
        request = {"key": _b64(key)}
        if prefix:
            request["range_end"] = _range_end(key)
        return int(self.call("/v3/kv/deleterange", request).get("deleted", 0))

    def txn(
        self,
        compare: Sequence[Mapping[str, Any]],
        success: Sequence[Mapping[str, Any]] = (),
        failure: Sequence[Mapping[str, Any]] = (),
    ) -> TxnResult:
        """If every comparison holds, run ``success``, else ``failure``, atomically."""
        body = self.call(
            "/v3/kv/txn",
            {"compare": list(compare), "success": list(success), "failure": list(failure)},
        )
        revision = _revision(body)
        ranges = tuple(
            _range(r["response_range"], revision)
            for r in body.get("responses", ())
            if "response_range" in r
        )
        return TxnResult(bool(body.get("succeeded", False)), revision, ranges)

    # -- leases -----------------------------------------------------------------------

    def lease_grant(self, ttl_s: int) -> Lease:
        body = self.call("/v3/lease/grant", {"TTL": ttl_s})
        return Lease(int(body["ID"]), int(body.get("TTL", ttl_s)))

    def lease_keepalive(self, lease_id: int) -> int:
        """Renew the lease; returns its TTL now, 0 when it has expired or was revoked."""
        body = self.call("/v3/lease/keepalive", {"ID": lease_id})
        return int((body.get("result") or {}).get("TTL", 0))

    def lease_revoke(self, lease_id: int) -> bool:
        """Revoke the lease (its keys are deleted); False when it did not exist."""
        try:
            self.call("/v3/lease/revoke", {"ID": lease_id})
        except EtcdError as exc:
            if exc.code == 5:  # NOT_FOUND: expired already
                return False
            raise
        return True

    # -- transport --------------------------------------------------------------------

    def call(self, path: str, request: Mapping[str, Any]) -> dict[str, Any]:
        """POST ``request`` to ``path`` at the current endpoint, moving on to the next
        ones when it does not answer; returns the decoded JSON answer."""
        payload = json.dumps(request).encode()
        failures: list[str] = []
        count = len(self.endpoints)
        start = self._current
        for step in range(count):
            index = (start + step) % count
            endpoint = self.endpoints[index]
            try:
                status, body = self._post(endpoint, path, payload)
            except (OSError, http.client.HTTPException) as exc:
                failures.append(f"{endpoint}: {exc or type(exc).__name__}")
                continue
            try:
                answer = json.loads(body) if body else {}
            except ValueError:
                raise EtcdError(
                    endpoint, f"{path}: HTTP {status}, not JSON: {body[:200]!r}"
                ) from None
            if not isinstance(answer, dict):
                raise EtcdError(endpoint, f"{path}: HTTP {status}, not an object: {body[:200]!r}")
            code, error = _error_of(answer)
            if status == 200 and error is None:
                self._current = index
                return answer
            if code in _TRY_NEXT_CODES or status >= 502:
                failures.append(f"{endpoint}: HTTP {status} {error}")
                continue
            self._current = index
            raise EtcdError(endpoint, f"{path}: {error or f'HTTP {status}'}", code)
        raise EtcdError(",".join(self.endpoints), f"{path}: no endpoint answered: {failures}")

    def _post(self, endpoint: str, path: str, payload: bytes) -> tuple[int, bytes]:
        conn = self._checkout(endpoint)
        try:
            conn.request("POST", path, body=payload, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            body = response.read()
        except BaseException:
            conn.close()
            raise
        if response.will_close:
            conn.close()
        else:
            with self._lock:
                self._idle.setdefault(endpoint, []).append(conn)
        # a keep-alive answer is a stream of one JSON object per line: the first is ours
        return response.status, body.split(b"\n", 1)[0] if path.endswith("/keepalive") else body

    def _checkout(self, endpoint: str) -> http.client.HTTPConnection:
        with self._lock:
            idle = self._idle.get(endpoint)
            if idle:
                return idle.pop()
        parts = urllib.parse.urlsplit(endpoint)
        if parts.scheme == "https":
            return http.client.HTTPSConnection(
                parts.hostname or "", parts.port, timeout=self.timeout_s
            )
        return http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=self.timeout_s)

    def __enter__(self) -> EtcdClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the idle connections (one in use is closed when its call returns)."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()
