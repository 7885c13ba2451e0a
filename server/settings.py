"""The one typed settings object of the server, read from ``DQ_*`` variables and CLI flags.

Invariant: settings are loaded once (``Settings.from_env`` then ``replace`` with flags)
and never mutated afterwards; tests build their own ``Settings`` and hand it to
``create_app``. Every field has a ``DQ_*`` variable, documented in ``docs/settings.md``
(``tests/test_settings_doc.py`` keeps the page and this class in step).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from dq.server.replication.etcd import parse_endpoints
from dq.shm.command_ring import DEFAULT_SPIN_US
from dq.storage.types import FsyncMode

__all__ = ["FSYNC_MODES", "MAX_DEFAULT_BODY", "Settings", "SettingsError", "parse_tokens"]

FSYNC_MODES: tuple[FsyncMode, ...] = ("always", "interval", "never")

#: Room for a value's base64 expansion plus its JSON framing, per item of a batch.
_BASE64_RATIO = 4 / 3
_PER_ITEM_OVERHEAD = 256
#: The default body limit never exceeds this (a bigger batch: raise DQ_MAX_BODY_BYTES).
MAX_DEFAULT_BODY = 64 << 20


class SettingsError(ValueError):
    """A ``DQ_*`` variable or flag holds a value the server cannot use."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the server needs to start, with dq's defaults."""

    data_dir: str = "./dq-data"
    host: str = "127.0.0.1"
    port: int = 8080
    fsync: FsyncMode = "always"
    fsync_interval_ms: int = 50
    tokens: tuple[str, ...] = ()
    #: Tokens that may only read: GET and HEAD of /v1 and /metrics (DQ_READ_TOKENS).
    read_tokens: tuple[str, ...] = ()
    max_batch: int = 1000
    max_value_bytes: int = 1 << 20
    #: The largest request body; 0 means "derive from max_value_bytes x max_batch",
    #: capped at ``MAX_DEFAULT_BODY``.
    max_body_bytes: int = 0
    max_wait_ms: int = 20_000
    #: A queue's log is frozen into a segment file when it reaches this size; small values
    #: make freezes and merges frequent (tests that must see merges under faults).
    memseg_bytes: int = 16 << 20
    #: Open connections at most; more are answered 503 and closed.
    max_connections: int = 1024
    #: Time a client has to send a request's headers, then its body (408 and close).
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    #: Per-queue metric series for at most this many queues (first by name).
    metrics_max_queues: int = 200
    #: PEM files: serve HTTPS (both or neither).
    tls_cert: str = ""
    tls_key: str = ""
    #: Serve valid enqueue/dequeue/release requests without the framework
    #: (``server/protocol.py``); off only to rule it out when diagnosing.
    fast_path: bool = True
    #: With ``fsync=always``, the event loop writes and syncs the writes it served
    #: itself, once per turn, instead of handing each to the syncer thread
    #: (``storage/syncer.py``); a slow disk hands them back. Off: always the syncer thread.
    inline_commit: bool = True
    expire_interval_ms: int = 250
    #: The shortest ``every_ms`` a schedule may have (docs/schedules.md).
    schedule_min_every_ms: int = 1000
    shutdown_timeout_s: float = 30.0
    #: Serve the shared-memory fast path beside HTTP (docs/shm.md); ``DQ_SHM=0`` or
    #: ``dq serve --no-shm`` turns it off.
    shm: bool = True
    #: Shared-memory clients attached at once, at most.
    shm_max_clients: int = 256
    #: How long a shared-memory session spins before it parks on its futex (µs).
    shm_spin_us: float = DEFAULT_SPIN_US
    log_level: str = "info"
    #: where ``POST /v1/backup`` may write backups ("" : backups over HTTP are off)
    backup_dir: str = ""
    #: SQS endpoint (docs/sqs.md): lift SQS's limits to dq's, and the account and
    #: region that queue URLs and ARNs carry.
    sqs_relaxed: bool = False
    sqs_account: str = "000000000000"
    sqs_region: str = "us-east-1"
    #: The dashboard's history of queue figures (server/history.py): a sample every
    #: interval, kept for the retention, per-queue rings for at most max_queues queues.
    history_interval_ms: int = 5000
    history_retention_s: int = 3600
    history_max_queues: int = 100
    #: Consumer groups (docs/spark.md): bytes the delivery logs of every consumer may
    #: hold (values plus a per-entry overhead), and what the keyed-batch memory keeps:
    #: at most this many keys and this many bytes of remembered results.
    consumer_max_log_bytes: int = 256 << 20
    keyed_batch_max_keys: int = 100_000
    keyed_batch_max_bytes: int = 64 << 20
    #: Replication (docs/replication.md): etcd's client URLs, comma-separated ("" : one
    #: node on its own, no replication), this member's name ("" : the host name), the
    #: URL the other members and redirected clients reach it at ("" : ``public_url``,
    #: from the bind address and port), the group's key prefix in etcd (``/dq/<cluster>/``), the
    #: members that must hold a write before it is acknowledged (the leader counts), the
    #: leader key's lease, how long a silent sync member stays in the sync set, how long
    #: a write waits for its commit before it is answered replication_timeout, and the
    #: bytes of shipped records the leader keeps for followers that are behind.
    etcd: str = ""
    node: str = ""
    advertise_url: str = ""
    cluster: str = "dq"
    min_insync: int = 2
    leader_ttl_s: int = 2
    replica_timeout_ms: int = 2000
    commit_timeout_ms: int = 10_000
    replica_window_bytes: int = 256 << 20
    #: PEM file of the CA (or the certificate) a follower checks its leader's HTTPS
    #: certificate against ("" : the system's CAs), for members serving DQ_TLS_CERT.
    replica_ca: str = ""
    #: Every other ``DQ_*`` variable, lower-cased without the prefix, for plug-ins.
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def body_limit(self) -> int:
        """The largest request body accepted, in bytes."""
        if self.max_body_bytes > 0:
            return self.max_body_bytes
        per_item = int(self.max_value_bytes * _BASE64_RATIO) + _PER_ITEM_OVERHEAD
        return min(per_item * self.max_batch + 64 * 1024, MAX_DEFAULT_BODY)

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied (``None`` values are ignored), validated."""
        clean = {k: v for k, v in changes.items() if v is not None}
        return dataclasses.replace(self, **clean).validated()

    def validated(self) -> Settings:
        if self.fsync not in FSYNC_MODES:
            raise SettingsError(f"fsync must be one of {', '.join(FSYNC_MODES)}: {self.fsync!r}")
        for name in (
            "port",
            "max_batch",
            "max_value_bytes",
            "memseg_bytes",
            "expire_interval_ms",
            "schedule_min_every_ms",
            "history_interval_ms",
            "history_retention_s",
            "consumer_max_log_bytes",
            "keyed_batch_max_keys",
            "keyed_batch_max_bytes",
        ):
            if getattr(self, name) < (0 if name == "port" else 1):
                raise SettingsError(f"{name} must be positive: {getattr(self, name)!r}")
        if self.port > 65535:  # the socket layer would bind it modulo 65536, silently
            raise SettingsError(f"port must be at most 65535: {self.port!r}")
        if self.shm_max_clients < 1 or self.shm_spin_us < 0:
            raise SettingsError("shm_max_clients must be positive, shm_spin_us not negative")
        if (
            self.history_retention_s * 1000 < self.history_interval_ms
            or self.history_max_queues < 0
        ):
            raise SettingsError("history_retention_s must cover one interval; max_queues >= 0")
        if self.max_wait_ms < 0 or self.fsync_interval_ms < 1 or self.max_body_bytes < 0:
            raise SettingsError(
                "max_wait_ms, fsync_interval_ms and max_body_bytes are out of range"
            )
        if not self.sqs_account or any(c in self.sqs_account for c in "/:"):
            raise SettingsError(
                f"sqs_account must be non-empty without '/' or ':': {self.sqs_account!r}"
            )
        if self.max_connections < 1 or self.header_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise SettingsError("max_connections and the read timeouts must be positive")
        if any(not t or t != t.strip() or "," in t for t in (*self.tokens, *self.read_tokens)):
            raise SettingsError("tokens must be non-empty, without spaces at either end or commas")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise SettingsError("give both tls_cert and tls_key, or neither")
        self._validate_replication()
        return self

    def _validate_replication(self) -> None:
        if not self.etcd:
            return
        try:
            parse_endpoints(self.etcd)
        except ValueError as exc:
            raise SettingsError(f"etcd: {exc}") from None
        if self.fsync != "always":
            raise SettingsError(
                "replication needs fsync=always: a member acknowledges only what it fsynced"
            )
        if "/" in self.node or "/" in self.cluster or not self.cluster:
            raise SettingsError("node and cluster are names without '/' (cluster non-empty)")
        if self.min_insync < 1 or self.leader_ttl_s < 1:
            raise SettingsError("min_insync and leader_ttl_s must be at least 1")
        if (
            self.replica_timeout_ms < 1
            or self.commit_timeout_ms < 1
            or self.replica_window_bytes < 1 << 20
        ):
            raise SettingsError(
                "replica_timeout_ms and commit_timeout_ms must be positive, "
                "replica_window_bytes at least 1 MiB"
            )

    @property
    def replicated(self) -> bool:
        """True when this server is a member of a replica group (``DQ_ETCD`` set)."""
        return bool(self.etcd)

    @property
    def node_name(self) -> str:
        """This member's name: ``DQ_NODE``, else the host name."""
        return self.node or socket.gethostname()

    @property
    def public_url(self) -> str:
        """How the other members and redirected clients reach this server: the
        advertised URL, else the bind address and port (the host name in place of an
        address that binds every interface, which no one can connect to)."""
        if self.advertise_url:
            return self.advertise_url.rstrip("/")
        host = self.host
        if host in ("0.0.0.0", "", "::"):
            host = socket.gethostname()
        elif ":" in host and not host.startswith("["):
            host = f"[{host}]"
        scheme = "https" if self.tls_cert else "http"
        return f"{scheme}://{host}:{self.port}"

    @property
    def loopback(self) -> bool:
        """True when the bind address only accepts connections from this machine."""
        host = self.host.strip("[]")
        return host == "localhost" or host.startswith("127.") or host == "::1"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Defaults overridden by every ``DQ_<FIELD>`` variable that is set."""
        env = os.environ if environ is None else environ
        changes: dict[str, Any] = {}
        known = {"DQ_" + f.name.upper(): f for f in dataclasses.fields(cls) if f.name != "extra"}
        extra: dict[str, str] = {}
        for key, raw in env.items():
            if not key.startswith("DQ_") or raw == "":
                continue
            f = known.get(key)
            if f is None:
                extra[key[3:].lower()] = raw
            else:
                changes[f.name] = _parse(f.name, cast(str, f.type), raw)
        return cls().replace(extra=extra, **changes)


def _parse(name: str, kind: str, raw: str) -> object:
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "bool":
            return _parse_bool(raw)
        if kind.startswith("tuple"):
            return parse_tokens(raw)
    except ValueError as exc:
        raise SettingsError(f"DQ_{name.upper()}={raw!r}: {exc}") from exc
    return raw


def _parse_bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError("expected a boolean (1/0, true/false, yes/no, on/off)")


def parse_tokens(raw: str) -> tuple[str, ...]:
    """A comma-separated token list; an empty token (``","``, ``"a,,b"``) is an error,
    never a way to turn authentication off."""
    tokens = tuple(t.strip() for t in raw.split(","))
    if not all(tokens):
        raise ValueError("an empty token in the list (tokens are comma-separated)")
    return tokens
