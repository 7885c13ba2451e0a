"""``dq serve``: run the HTTP service and, unless ``--no-shm``, the shared-memory server.

Flags override ``DQ_*`` variables, which override the defaults (``server/settings.py``);
``docs/settings.md`` documents each one, and ``tests/test_settings_doc.py`` checks the flags
below against it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from dq.cli._local import data_dir_problem
from dq.server.settings import FSYNC_MODES

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="run the server",
        description="Serve the HTTP API. Every flag can also be set as a DQ_* variable; "
        "docs/settings.md lists every setting with its default.",
    )
    p.add_argument("--data-dir", help="data directory (DQ_DATA_DIR, default ./dq-data)")
    p.add_argument("--host", help="bind address (DQ_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, help="TCP port (DQ_PORT, default 8080)")
    p.add_argument(
        "--fsync", choices=FSYNC_MODES, help="durability mode (DQ_FSYNC, default always)"
    )
    p.add_argument(
        "--fsync-interval-ms", type=int, help="for --fsync interval (DQ_FSYNC_INTERVAL_MS)"
    )
    p.add_argument("--max-batch", type=int, help="items per request (DQ_MAX_BATCH, default 1000)")
    p.add_argument("--max-value-bytes", type=int, help="value size limit (DQ_MAX_VALUE_BYTES)")
    p.add_argument(
        "--max-wait-ms", type=int, help="longest long-poll (DQ_MAX_WAIT_MS, default 20000)"
    )
    p.add_argument(
        "--max-body-bytes", type=int, help="request body limit (DQ_MAX_BODY_BYTES, default 64 MiB)"
    )
    p.add_argument(
        "--max-connections", type=int, help="open connections (DQ_MAX_CONNECTIONS, default 1024)"
    )
    p.add_argument(
        "--header-timeout-s", type=float, help="to send headers (DQ_HEADER_TIMEOUT_S, default 10)"
    )
    p.add_argument(
        "--body-timeout-s", type=float, help="to send a body (DQ_BODY_TIMEOUT_S, default 60)"
    )
    p.add_argument("--tokens", help="comma-separated bearer tokens (DQ_TOKENS); none: no auth")
    p.add_argument("--tls-cert", help="PEM certificate: serve HTTPS (DQ_TLS_CERT)")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert (DQ_TLS_KEY)")
    p.add_argument(
        "--shm",
        action=argparse.BooleanOptionalAction,
        help="serve the shared-memory fast path too (DQ_SHM, default on; --no-shm: off)",
    )
    p.add_argument(
        "--log-level", choices=("debug", "info", "warning", "error"), help="(DQ_LOG_LEVEL)"
    )
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.add_argument(
        "--backup-dir",
        help="allow POST /v1/backup to write backups inside this directory (DQ_BACKUP_DIR)",
    )
    p.add_argument(
        "--etcd",
        help="etcd client URLs, comma-separated: join a replica group (DQ_ETCD; "
        "docs/replication.md)",
    )
    p.add_argument("--node", help="this member's name (DQ_NODE, default the host name)")
    p.add_argument(
        "--advertise-url", help="how other members and clients reach this server (DQ_ADVERTISE_URL)"
    )
    p.add_argument("--cluster", help="the replica group's name in etcd (DQ_CLUSTER, default dq)")
    p.add_argument(
        "--min-insync",
        type=int,
        help="members (the leader counts) holding a write before it is acknowledged "
        "(DQ_MIN_INSYNC, default 2)",
    )
    p.add_argument(
        "--leader-ttl-s",
        type=int,
        help="the leader's lease in etcd, seconds (DQ_LEADER_TTL_S, default 2)",
    )
    p.add_argument(
        "--replica-timeout-ms",
        type=int,
        help="a sync member silent this long leaves the sync set (DQ_REPLICA_TIMEOUT_MS, "
        "default 2000)",
    )
    p.add_argument(
        "--commit-timeout-ms",
        type=int,
        help="a write not replicated within this is answered 503 replication_timeout "
        "(DQ_COMMIT_TIMEOUT_MS, default 10000)",
    )
    p.add_argument(
        "--replica-window-bytes",
        type=int,
        help="log bytes the leader keeps for followers behind (DQ_REPLICA_WINDOW_BYTES, "
        "default 256 MiB)",
    )
    p.add_argument(
        "--replica-ca",
        help="PEM file a follower checks an HTTPS leader's certificate against (DQ_REPLICA_CA)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dq.server.runner import CannotListen, serve
    from dq.server.settings import Settings, SettingsError, parse_tokens

    try:
        tokens = None if args.tokens is None else parse_tokens(args.tokens)
    except ValueError as exc:
        print(f"dq serve: --tokens: {exc}", file=sys.stderr)
        return 2
    try:
        settings = Settings.from_env().replace(
            data_dir=args.data_dir,
            host=args.host,
            port=args.port,
            fsync=args.fsync,
            fsync_interval_ms=args.fsync_interval_ms,
            max_batch=args.max_batch,
            max_value_bytes=args.max_value_bytes,
            max_wait_ms=args.max_wait_ms,
            max_body_bytes=args.max_body_bytes,
            max_connections=args.max_connections,
            header_timeout_s=args.header_timeout_s,
            body_timeout_s=args.body_timeout_s,
            tokens=tokens,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            shm=args.shm,
            log_level=args.log_level,
            backup_dir=args.backup_dir,
            etcd=args.etcd,
            node=args.node,
            advertise_url=args.advertise_url,
            cluster=args.cluster,
            min_insync=args.min_insync,
            leader_ttl_s=args.leader_ttl_s,
            replica_timeout_ms=args.replica_timeout_ms,
            commit_timeout_ms=args.commit_timeout_ms,
            replica_window_bytes=args.replica_window_bytes,
            replica_ca=args.replica_ca,
        )
    except SettingsError as exc:
        print(f"dq serve: {exc}", file=sys.stderr)
        return 2
    problem = data_dir_problem(settings.data_dir, must_exist=False)
    if problem is None and settings.backup_dir:
        problem = _backup_dir_problem(settings.backup_dir)
    if problem is None and settings.etcd:
        problem = _epoch_file_problem(settings.data_dir)
    if problem is not None:
        print(f"dq serve: {problem}", file=sys.stderr)
        return 1
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return serve(settings, access_log=args.access_log)
    except CannotListen as exc:
        print(f"dq serve: {exc}", file=sys.stderr)
        return 1


def _backup_dir_problem(path: str) -> str | None:
    """``--backup-dir`` must be a directory the server can write in: found at start, not
    at the first backup (each would fail, the server having served for days)."""
    what = f"--backup-dir {path}"
    if not os.path.exists(path):
        return f"{what}: no such directory (create it, or leave --backup-dir out)"
    if not os.path.isdir(path):
        return f"{what}: not a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{what}: this user cannot write in it"
    return None


def _epoch_file_problem(data_dir: str) -> str | None:
    """A replica member's damaged ``replica.json`` stops the server (guessing an epoch
    could let a fenced leader back in): said in one line with what to do, not as a
    traceback of the server's start-up."""
    from dq.server.replication.epochs import EpochFile
    from dq.storage.errors import CorruptionError

    try:
        EpochFile(data_dir)
    except CorruptionError as exc:
        return (
            f"{exc}: restore it, or delete it on a member about to resync in full anyway "
            "(docs/replication.md, 'On the follower')"
        )
    return None
