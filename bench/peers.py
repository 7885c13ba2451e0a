#!/usr/bin/env python3
"""dq beside its peers: the physical limits of this machine, and dq next to real queues
(beanstalkd, Redis, PostgreSQL as a PGMQ-style table) driven by the same Python loops.

Every system gets the same four calls (put, put_many, get under a lease, ack), 256-byte
items, every one durable (beanstalkd ``-f 0``, Redis ``appendfsync always``, PostgreSQL
``synchronous_commit=on``, dq ``--fsync always``); each table gives the ratio to
PostgreSQL measured in the same run. dq is driven through the project's own
``dq.client.Client``, over HTTP and over ``shm://``, each also with the one-round-trip
consumer loop (an ack rides on the next dequeue). docs/performance.md ("Beside
PostgreSQL and beanstalkd") has the current figures, bench/NOTES.md every run and how it
was taken.

It installs nothing. On Debian 12 (as root: PostgreSQL is then run as the ``postgres``
user), once:

    apt-get update
    apt-get install -y --no-install-recommends beanstalkd redis-server wrk postgresql-15
    .venv/bin/pip install -e '.[bench]'       # redis, hiredis, psycopg (pinned)

Then, from the repository root, with the project's virtual environment:

    .venv/bin/python bench/peers.py peers --quick --out /tmp/p.json --md /tmp/p.md
    .venv/bin/python bench/peers.py peers --runs 3 \
        --modes beanstalkd:binlog-f0,postgres:sync-on,dq:client-always,dq:shm-always
    .venv/bin/python bench/peers.py physical --runs 3      # disk and HTTP floors (wrk)

Every server it starts listens on 127.0.0.1 only, lives in a throw-away data directory
(under ``--data-root``, which must be enterable by the ``postgres`` user), and is stopped
by its PID when the run ends (also on error / Ctrl-C). Every load loop is bounded both
in count and in time. ``dq serve`` is started from ``$DQ_PYTHON`` (default: this python).
"""

import argparse
import array
import json
import multiprocessing as mp
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime

HOST = "127.0.0.1"  # the only address anything here listens on / talks to
PAYLOAD = (b"0123456789abcdef" * 16)[:256]  # 256-byte item body
BASE_MS = int(time.time() * 1000)  # origin for beanstalkd priorities
LEASE_S = 30  # lease / visibility timeout / TTR
ALL_MODES = [
    # (system, mode, durability description, in default set)
    ("beanstalkd", "binlog-f0", "binlog, fsync after every write (-b DIR -f 0)", True),
    (
        "beanstalkd",
        "binlog-default",
        "binlog, fsync at most every 50 ms (-b DIR, default -f 50)",
        True,
    ),
    ("beanstalkd", "memory", "no binlog (in-memory only) - reference, not durable", True),
    (
        "redis",
        "aof-always",
        "AOF appendfsync always (fsync before reply, group-committed per event-loop turn)",
        True,
    ),
    ("redis", "aof-everysec", "AOF appendfsync everysec (up to ~1 s of loss)", True),
    ("redis", "memory", "no AOF, no RDB - reference, not durable", True),
    (
        "postgres",
        "sync-on",
        "synchronous_commit=on, fsync=on (WAL flushed before commit returns)",
        True,
    ),
    (
        "postgres",
        "sync-off",
        "synchronous_commit=off (WAL flushed by walwriter, <=3x200 ms loss) - reference",
        True,
    ),
    ("dq", "http-always", "dq over HTTP, --fsync always (group commit, fsync before reply)", False),
    ("dq", "http-never", "dq over HTTP, --fsync never - reference, not durable", False),
    ("dq", "client-always", "dq through the project's own Client over HTTP, --fsync always", True),
    ("dq", "client1rt-always", "as client-always; each ack rides on the next dequeue", True),
    ("dq", "shm-always", "dq through the project's own Client over shm://, --fsync always", True),
    ("dq", "shm1rt-always", "as shm-always; each ack rides on the next dequeue", True),
]

# --------------------------------------------------------------------------
# process hygiene: every server we start is recorded and stopped by its PID
# --------------------------------------------------------------------------
_PROCS = []  # list of [name, Popen, stop_signal]


#: Where a run's results go unless --out/--md say otherwise: bench/results/, which git
#: ignores, so a run never leaves files to commit (a run worth keeping goes into
#: bench/NOTES.md, and its figures into docs/performance.md when they are the newest).
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
DEFAULT_OUT = os.path.join(RESULTS_DIR, "peers.json")
DEFAULT_MD = os.path.join(RESULTS_DIR, "peers.md")


def start_proc(name, argv, stop_signal=signal.SIGTERM, **kw):
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True, **kw)
    _PROCS.append([name, p, stop_signal])
    log(f"  started {name} pid={p.pid}: {' '.join(map(str, argv))}")
    return p


def stop_proc(p, timeout=60):
    entry = next((e for e in _PROCS if e[1] is p), None)
    sig = entry[2] if entry else signal.SIGTERM
    if p.poll() is None:
        try:
            os.kill(p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(10)
    if entry:
        _PROCS.remove(entry)
        log(f"  stopped {entry[0]} pid={p.pid} rc={p.returncode}")


def stop_all():
    for e in list(_PROCS):
        try:
            stop_proc(e[1])
        except Exception as ex:  # keep going: stop the others
            log(f"  could not stop {e[0]} pid={e[1].pid}: {ex}")


def _on_signal(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _read(path):
    with open(path) as f:
        return f.read()


def _lines(path):
    return _read(path).splitlines()


def _write(path, text):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_port(port, proc, timeout=60, logfile=None):
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        if proc.poll() is not None:
            tail = _read(logfile)[-2000:] if logfile and os.path.exists(logfile) else ""
            raise RuntimeError(f"server exited rc={proc.returncode}\n{tail}")
        try:
            socket.create_connection((HOST, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} not open after {timeout}s")


def tree_cpu_s(root_pid):
    """CPU seconds (user+sys, incl. reaped children) of a process and its descendants."""
    tck = os.sysconf("SC_CLK_TCK")
    procs, kids = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                data = f.read()
        except OSError:
            continue
        f = data[data.rfind(")") + 2 :].split()
        pid, ppid = int(d), int(f[1])
        procs[pid] = sum(int(x) for x in f[11:15])
        kids.setdefault(ppid, []).append(pid)
    total, stack, seen = 0, [root_pid], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += procs.get(pid, 0)
        stack.extend(kids.get(pid, []))
    return total / tck


def pctl(sorted_vals, q):
    if not sorted_vals:
        return float("nan")
    k = (len(sorted_vals) - 1) * q
    f = int(k)
    c = min(f + 1, len(sorted_vals) - 1)
    return sorted_vals[f] + (sorted_vals[c] - sorted_vals[f]) * (k - f)


def lat_summary(lat_ns):
    s = sorted(lat_ns)
    if not s:
        return {
            "n": 0,
            "p50_ms": float("nan"),
            "p99_ms": float("nan"),
            "mean_ms": float("nan"),
            "max_ms": float("nan"),
        }
    return {
        "n": len(s),
        "p50_ms": pctl(s, 0.5) / 1e6,
        "p99_ms": pctl(s, 0.99) / 1e6,
        "mean_ms": sum(s) / len(s) / 1e6,
        "max_ms": s[-1] / 1e6,
    }


def now_ms():
    return int(time.time() * 1000)


def run_cmd(argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as ex:
        return f"({ex})"


# --------------------------------------------------------------------------
# peer systems: each gives the same client interface
#   put(body, deadline_ms) -> id          enqueue one item
#   put_many(bodies, deadline_ms) -> ids  enqueue a batch (pipeline / multi-row)
#   get(block_s) -> (id, body) | None     dequeue the earliest-deadline due item under a lease
#   ack(id)                               done: delete it
# Every item's deadline is its enqueue time, so all items are due at once and
# dequeue order is earliest deadline first.
# --------------------------------------------------------------------------
class BeanstalkClient:
    """Minimal beanstalkd protocol client (text protocol; supports pipelining)."""

    def __init__(self, port, tube="q"):
        self.sock = socket.create_connection((HOST, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rf = self.sock.makefile("rb")
        for cmd, want in (
            (b"use %s\r\n" % tube.encode(), b"USING"),
            (b"watch %s\r\n" % tube.encode(), b"WATCHING"),
            (b"ignore default\r\n", b"WATCHING"),
        ):
            self.sock.sendall(cmd)
            line = self._line()
            if not line.startswith(want):
                raise RuntimeError(f"beanstalkd: {cmd!r} -> {line!r}")

    def _line(self):
        line = self.rf.readline()
        if not line:
            raise ConnectionError("beanstalkd closed the connection")
        return line

    @staticmethod
    def _pri(deadline_ms):
        return max(0, min(2**32 - 1, deadline_ms - BASE_MS))

    def _inserted(self):
        line = self._line()
        if not line.startswith(b"INSERTED"):
            raise RuntimeError(f"beanstalkd put -> {line!r}")
        return int(line.split()[1])

    def put(self, body, deadline_ms):
        self.sock.sendall(
            b"put %d 0 %d %d\r\n%s\r\n" % (self._pri(deadline_ms), LEASE_S, len(body), body)
        )
        return self._inserted()

    def put_many(self, bodies, deadline_ms):
        pri = self._pri(deadline_ms)
        self.sock.sendall(
            b"".join(b"put %d 0 %d %d\r\n%s\r\n" % (pri, LEASE_S, len(b), b) for b in bodies)
        )
        return [self._inserted() for _ in bodies]

    def get(self, block_s=0):
        self.sock.sendall(b"reserve-with-timeout %d\r\n" % block_s)
        line = self._line()
        if line.startswith(b"RESERVED"):
            _, jid, n = line.split()
            body = self.rf.read(int(n) + 2)[:-2]
            return int(jid), body
        if line.startswith(b"TIMED_OUT") or line.startswith(b"DEADLINE_SOON"):
            return None
        raise RuntimeError(f"beanstalkd reserve -> {line!r}")

    def ack(self, jid):
        self.sock.sendall(b"delete %d\r\n" % jid)
        line = self._line()
        if not line.startswith(b"DELETED"):
            raise RuntimeError(f"beanstalkd delete -> {line!r}")

    def close(self):
        try:
            self.sock.sendall(b"quit\r\n")
        except OSError:
            pass
        self.rf.close()
        self.sock.close()


# Redis delayed-queue pattern: ZSET q:due (score = deadline ms), HASH q:data
# (id -> payload), ZSET q:lease (score = lease expiry ms) for in-flight items.
LUA_ENQ = """
local id = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[2], id, ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[2], id)
return id
"""
LUA_DEQ = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 1)
if #ids == 0 then return false end
local id = ids[1]
redis.call('ZREM', KEYS[1], id)
redis.call('ZADD', KEYS[2], tonumber(ARGV[1]) + tonumber(ARGV[2]), id)
return {id, redis.call('HGET', KEYS[3], id)}
"""
LUA_ACK = """
redis.call('ZREM', KEYS[1], ARGV[1])
return redis.call('HDEL', KEYS[2], ARGV[1])
"""
RK_DUE, RK_DATA, RK_SEQ, RK_LEASE = "q:due", "q:data", "q:seq", "q:lease"


class RedisClient:
    def __init__(self, port):
        import redis

        self.r = redis.Redis(host=HOST, port=port)
        self.enq = self.r.script_load(LUA_ENQ)
        self.deq = self.r.script_load(LUA_DEQ)
        self.ackq = self.r.script_load(LUA_ACK)

    def put(self, body, deadline_ms):
        return self.r.evalsha(self.enq, 3, RK_DUE, RK_DATA, RK_SEQ, body, deadline_ms)

    def put_many(self, bodies, deadline_ms):
        p = self.r.pipeline(transaction=True)  # MULTI ... EXEC, one round trip
        for b in bodies:
            p.evalsha(self.enq, 3, RK_DUE, RK_DATA, RK_SEQ, b, deadline_ms)
        return p.execute()

    def get(self, block_s=0):
        r = self.r.evalsha(self.deq, 3, RK_DUE, RK_LEASE, RK_DATA, now_ms(), LEASE_S * 1000)
        return (r[0], r[1]) if r else None

    def ack(self, jid):
        if self.r.evalsha(self.ackq, 2, RK_LEASE, RK_DATA, jid) != 1:
            raise RuntimeError("redis ack: item not found")

    def close(self):
        self.r.close()


# PGMQ-style table queue (pgmq.create / send / read / delete, without the
# extension): visibility timestamp vt, read with FOR UPDATE SKIP LOCKED.
# Deviation from PGMQ: read orders by vt (deadline) instead of msg_id.
PG_SCHEMA = """
CREATE TABLE q (
  msg_id      bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
  read_ct     int NOT NULL DEFAULT 0,
  enqueued_at timestamptz NOT NULL DEFAULT now(),
  vt          timestamptz NOT NULL,
  message     bytea NOT NULL
);
CREATE INDEX q_vt_idx ON q (vt ASC);
"""
PG_SEND = "INSERT INTO q (vt, message) VALUES (to_timestamp(%s), %s) RETURNING msg_id"
PG_SEND_BATCH = (
    "INSERT INTO q (vt, message) SELECT to_timestamp(t.d), t.m "
    "FROM unnest(%s::float8[], %s::bytea[]) AS t(d, m) RETURNING msg_id"
)
PG_READ = (
    f"WITH cte AS (SELECT msg_id FROM q WHERE vt <= clock_timestamp() ORDER BY vt LIMIT 1 "
    f"FOR UPDATE SKIP LOCKED) "
    f"UPDATE q m SET vt = clock_timestamp() + interval '{LEASE_S} seconds', read_ct = m.read_ct + 1 "
    f"FROM cte WHERE m.msg_id = cte.msg_id RETURNING m.msg_id, m.message"
)
PG_DELETE = "DELETE FROM q WHERE msg_id = %s"


class PgClient:
    def __init__(self, dsn):
        import psycopg

        self.conn = psycopg.connect(dsn, autocommit=True)  # every statement is its own commit
        self.cur = self.conn.cursor()

    def put(self, body, deadline_ms):
        self.cur.execute(PG_SEND, (deadline_ms / 1000.0, body))
        return self.cur.fetchone()[0]

    def put_many(self, bodies, deadline_ms):
        self.cur.execute(PG_SEND_BATCH, ([deadline_ms / 1000.0] * len(bodies), list(bodies)))
        return [r[0] for r in self.cur.fetchall()]

    def get(self, block_s=0):
        self.cur.execute(PG_READ)
        return self.cur.fetchone()

    def ack(self, jid):
        self.cur.execute(PG_DELETE, (jid,))
        if self.cur.rowcount != 1:
            raise RuntimeError("pg ack: row not found")

    def close(self):
        self.conn.close()


class Server:
    """One peer server in one durability mode, in a throw-away directory."""

    blocking_get = False  # does get(block_s>0) wait server-side?

    def __init__(self, mode, root):
        self.mode, self.root = mode, root
        self.proc = None
        self.port = None

    def pid(self):
        return self.proc.pid

    def stop(self):
        if self.proc:
            stop_proc(self.proc)
            self.proc = None


class Beanstalkd(Server):
    name = "beanstalkd"
    blocking_get = True

    def start(self):
        self.dir = tempfile.mkdtemp(prefix="bs-", dir=self.root)
        self.port = free_port()
        extra = {
            "binlog-f0": ["-b", self.dir, "-f", "0"],
            "binlog-default": ["-b", self.dir],
            "memory": [],
        }[self.mode]
        self.log = os.path.join(self.dir, "server.log")
        with open(self.log, "w") as lf:
            self.proc = start_proc(
                "beanstalkd",
                ["beanstalkd", "-l", HOST, "-p", str(self.port), *extra],
                stdout=lf,
                stderr=subprocess.STDOUT,
            )
        wait_port(self.port, self.proc, logfile=self.log)

    def client(self):
        return BeanstalkClient(self.port)

    def version(self):
        return run_cmd(["beanstalkd", "-v"])


class Redis(Server):
    name = "redis"

    def start(self):
        self.dir = tempfile.mkdtemp(prefix="redis-", dir=self.root)
        self.port = free_port()
        extra = {
            "aof-always": ["--appendonly", "yes", "--appendfsync", "always"],
            "aof-everysec": ["--appendonly", "yes", "--appendfsync", "everysec"],
            "memory": ["--appendonly", "no"],
        }[self.mode]
        self.log = os.path.join(self.dir, "server.log")
        argv = [
            "redis-server",
            "--bind",
            HOST,
            "--port",
            str(self.port),
            "--protected-mode",
            "yes",
            "--daemonize",
            "no",
            "--dir",
            self.dir,
            "--save",
            "",
            "--logfile",
            self.log,
            *extra,
        ]
        self.proc = start_proc(
            "redis-server", argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_port(self.port, self.proc, logfile=self.log)

    def client(self):
        return RedisClient(self.port)

    def version(self):
        return run_cmd(["redis-server", "--version"])


def pg_bindir():
    for cand in [
        os.environ.get("PG_BINDIR"),
        *sorted(
            (f"/usr/lib/postgresql/{v}/bin" for v in os.listdir("/usr/lib/postgresql"))
            if os.path.isdir("/usr/lib/postgresql")
            else [],
            reverse=True,
        ),
    ]:
        if cand and os.path.exists(os.path.join(cand, "postgres")):
            return cand
    p = shutil.which("postgres")
    if p:
        return os.path.dirname(os.path.realpath(p))
    raise RuntimeError("postgres binaries not found (set PG_BINDIR)")


def _pg_user_kw():
    # postgres refuses to run as root: run it as the 'postgres' OS user then
    if os.geteuid() == 0:
        return {"user": "postgres", "group": "postgres", "extra_groups": []}
    return {}


class Postgres(Server):
    name = "postgres"
    _template = None

    @classmethod
    def template(cls, root):
        if cls._template is None:
            t = os.path.join(root, "pg-template")
            kw = _pg_user_kw()
            if kw:
                os.makedirs(t, mode=0o700)
                shutil.chown(t, "postgres", "postgres")
            subprocess.run(
                [
                    os.path.join(pg_bindir(), "initdb"),
                    "-D",
                    t,
                    "-U",
                    "bench",
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "-N",
                ],
                check=True,
                capture_output=True,
                **kw,
            )
            cls._template = t
        return cls._template

    def start(self):
        tmpl = self.template(self.root)
        self.dir = tempfile.mkdtemp(prefix="pg-", dir=self.root)
        os.rmdir(self.dir)
        subprocess.run(["cp", "-a", tmpl, self.dir], check=True)
        self.port = free_port()
        sc = {"sync-on": "on", "sync-off": "off"}[self.mode]
        self.log = os.path.join(self.root, os.path.basename(self.dir) + ".log")
        argv = [
            os.path.join(pg_bindir(), "postgres"),
            "-D",
            self.dir,
            "-c",
            f"listen_addresses={HOST}",
            "-c",
            f"port={self.port}",
            "-c",
            f"unix_socket_directories={self.dir}",
            "-c",
            "fsync=on",
            "-c",
            f"synchronous_commit={sc}",
            "-c",
            "full_page_writes=on",
            "-c",
            "max_connections=40",
        ]
        with open(self.log, "w") as lf:
            # SIGINT = PostgreSQL "fast" shutdown of the postmaster and its backends
            self.proc = start_proc(
                "postgres",
                argv,
                stop_signal=signal.SIGINT,
                stdout=lf,
                stderr=subprocess.STDOUT,
                **_pg_user_kw(),
            )
        wait_port(self.port, self.proc, logfile=self.log)
        self.dsn = f"host={HOST} port={self.port} user=bench dbname=postgres"
        import psycopg

        for _ in range(100):  # port open != ready to accept; retry briefly
            try:
                with psycopg.connect(self.dsn, autocommit=True) as c:
                    c.execute(PG_SCHEMA)
                    self.settings = {
                        k: c.execute(f"SHOW {k}").fetchone()[0]
                        for k in (
                            "synchronous_commit",
                            "fsync",
                            "wal_sync_method",
                            "shared_buffers",
                            "max_wal_size",
                            "full_page_writes",
                            "server_version",
                        )
                    }
                break
            except psycopg.OperationalError:
                time.sleep(0.1)

    def client(self):
        return PgClient(self.dsn)

    def version(self):
        return run_cmd([os.path.join(pg_bindir(), "postgres"), "--version"])


class DqHttpClient:
    """dq over its /v1 HTTP API (docs/http.md), with a plain httpx client."""

    def __init__(self, url, queue="q"):
        import base64

        import httpx

        self._b64 = base64.b64encode
        self.c = httpx.Client(base_url=url, timeout=60)
        self.q = queue

    def _items(self, bodies, deadline_ms):
        return {
            "items": [
                {"value": self._b64(b).decode(), "encoding": "base64", "deadline": deadline_ms}
                for b in bodies
            ]
        }

    def put(self, body, deadline_ms):
        r = self.c.post(f"/v1/queues/{self.q}/items", json=self._items([body], deadline_ms))
        r.raise_for_status()
        return r.json()["items"][0]["id"]

    def put_many(self, bodies, deadline_ms):
        r = self.c.post(f"/v1/queues/{self.q}/items", json=self._items(bodies, deadline_ms))
        r.raise_for_status()
        return [it["id"] for it in r.json()["items"]]

    def get(self, block_s=0):
        r = self.c.post(
            f"/v1/queues/{self.q}/dequeue",
            json={"count": 1, "lease_ms": 30_000, "wait_ms": int(block_s * 1000)},
        )
        r.raise_for_status()
        items = r.json()["items"]
        if not items:
            return None
        it = items[0]
        return ((it["id"], it["receipt"]), it["value"])

    def ack(self, jid):
        item_id, receipt = jid
        r = self.c.post(
            f"/v1/queues/{self.q}/release", json={"items": [{"id": item_id, "receipt": receipt}]}
        )
        r.raise_for_status()

    def close(self):
        self.c.close()


class DqProjectClient:
    """dq through the project's own `dq.client.Client` (HTTP or shm:// transport): what a
    user runs. With `one_trip`, an ack is not a request of its own: it rides on the next
    dequeue (`dequeue(..., release=[...])`), as the project's consumer helper does."""

    def __init__(self, url, queue="q", one_trip=False):
        from dq.client import Client, NewItem, Release

        self._new, self._release = NewItem, Release
        self.c = Client(url)
        self.q = queue
        self.one_trip = one_trip
        self.done = []

    def put(self, body, deadline_ms):
        return self.c.enqueue(self.q, body, deadline=deadline_ms)

    def put_many(self, bodies, deadline_ms):
        return [
            e.id
            for e in self.c.enqueue_many(
                self.q, [self._new(b, deadline=deadline_ms) for b in bodies]
            )
        ]

    def get(self, block_s=0):
        done, self.done = self.done, []
        items = self.c.dequeue(
            self.q, count=1, lease_ms=30_000, wait_ms=int(block_s * 1000), release=done
        )
        if not all(o.ok for o in items.released):
            raise RuntimeError(f"dq release: {[o for o in items.released if not o.ok]}")
        if not items:
            return None
        return ((items[0].id, items[0].receipt), items[0].value)

    def ack(self, jid):
        if self.one_trip:
            self.done.append(self._release(*jid))
        else:
            self.c.release(self.q, jid[0], jid[1])

    def close(self):
        if self.done:
            self.c.release_many(self.q, self.done)
        self.c.close()


class Dq(Server):
    """dq itself: `dq serve` from the python in $DQ_PYTHON (a venv with the checkout)."""

    name = "dq"
    blocking_get = True

    def start(self):
        self.dir = tempfile.mkdtemp(prefix="dq-", dir=self.root)
        self.port = free_port()
        fsync = self.mode.rsplit("-", 1)[1]  # http-always, client-always, shm-always, ...-never
        py = os.environ.get("DQ_PYTHON", sys.executable)
        dq = os.path.join(os.path.dirname(py), "dq")
        self.log = os.path.join(self.dir, "server.log")
        with open(self.log, "w") as lf:
            self.proc = start_proc(
                "dq",
                [
                    dq,
                    "serve",
                    "--data-dir",
                    os.path.join(self.dir, "data"),
                    "--host",
                    HOST,
                    "--port",
                    str(self.port),
                    "--fsync",
                    fsync,
                ],
                stdout=lf,
                stderr=subprocess.STDOUT,
                env=os.environ,  # the server as shipped: shared memory is on by default
            )
        wait_port(self.port, self.proc, logfile=self.log)
        self.url = f"http://{HOST}:{self.port}"
        from dq.client import Client

        with Client(self.url) as c:  # the queue exists before the first producer or consumer
            c.put_queue("q")
        sock = os.path.join(self.dir, "data", "dq.sock")
        t_end = time.monotonic() + 30
        while self.mode.startswith("shm") and not os.path.exists(sock):
            if time.monotonic() > t_end:
                raise RuntimeError("dq: the shared-memory socket did not appear")
            time.sleep(0.05)

    def client(self):
        one_trip = self.mode.split("-")[0].endswith("1rt")
        if self.mode.startswith("shm"):
            return DqProjectClient("shm://" + os.path.join(self.dir, "data"), one_trip=one_trip)
        if self.mode.startswith("client"):
            return DqProjectClient(self.url, one_trip=one_trip)
        return DqHttpClient(self.url)

    def version(self):
        return "checkout"


SYSTEMS = {"beanstalkd": Beanstalkd, "redis": Redis, "postgres": Postgres, "dq": Dq}


# --------------------------------------------------------------------------
# workloads
# --------------------------------------------------------------------------
def wl_enqueue(srv, n, tmax, batch):
    """(a) batch=1: one item per request;  (b) batch=100: pipelined / multi-row."""
    cli = srv.client()
    lat = array.array("q")
    done, capped = 0, False
    cpu_s0, c0 = tree_cpu_s(srv.pid()), time.process_time()
    t0 = time.perf_counter()
    t_end = t0 + tmax
    bodies = [PAYLOAD] * batch
    while done < n:
        s = time.perf_counter_ns()
        if batch == 1:
            cli.put(PAYLOAD, now_ms())
        else:
            cli.put_many(bodies, now_ms())
        lat.append(time.perf_counter_ns() - s)
        done += batch
        if time.perf_counter() > t_end:
            capped = done < n
            break
    el = time.perf_counter() - t0
    res = {
        "items": done,
        "secs": el,
        "items_per_s": done / el,
        "capped": capped,
        "server_cpu_s": tree_cpu_s(srv.pid()) - cpu_s0,
        "client_cpu_s": time.process_time() - c0,
        "op": lat_summary(lat),
        "ops": len(lat),
    }
    cli.close()
    return res


def wl_drain(srv, n, tmax):
    """(c) dequeue (lease) + ack of n items, single consumer."""
    cli = srv.client()
    dlat, alat = array.array("q"), array.array("q")
    done, capped, empty = 0, False, False
    cpu_s0, c0 = tree_cpu_s(srv.pid()), time.process_time()
    t0 = time.perf_counter()
    t_end = t0 + tmax
    while done < n:
        s = time.perf_counter_ns()
        item = cli.get(0)
        m = time.perf_counter_ns()
        if item is None:
            empty = True
            break
        cli.ack(item[0])
        e = time.perf_counter_ns()
        dlat.append(m - s)
        alat.append(e - m)
        done += 1
        if time.perf_counter() > t_end:
            capped = done < n
            break
    el = time.perf_counter() - t0
    res = {
        "items": done,
        "secs": el,
        "items_per_s": done / el,
        "capped": capped,
        "ran_empty": empty,
        "server_cpu_s": tree_cpu_s(srv.pid()) - cpu_s0,
        "client_cpu_s": time.process_time() - c0,
        "deq": lat_summary(dlat),
        "ack": lat_summary(alat),
    }
    cli.close()
    return res


def _worker(role, srv, barrier, duration, cap, outq):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        cli = srv.client()
        lat1, lat2 = array.array("q"), array.array("q")
        empties = 0
        barrier.wait(120)
        c0 = time.process_time()
        t0 = time.perf_counter()
        t_end = t0 + duration
        n = 0
        while n < cap and time.perf_counter() < t_end:
            s = time.perf_counter_ns()
            if role == "producer":
                cli.put(PAYLOAD, now_ms())
                lat1.append(time.perf_counter_ns() - s)
                n += 1
                continue
            item = cli.get(1 if srv.blocking_get else 0)
            m = time.perf_counter_ns()
            if item is None:
                empties += 1
                if not srv.blocking_get:
                    time.sleep(0.001)  # poll back-off for redis / postgres
                continue
            cli.ack(item[0])
            lat1.append(m - s)
            lat2.append(time.perf_counter_ns() - m)
            n += 1
        outq.put(
            {
                "role": role,
                "n": n,
                "secs": time.perf_counter() - t0,
                "empties": empties,
                "cpu_s": time.process_time() - c0,
                "lat1": lat1.tobytes(),
                "lat2": lat2.tobytes(),
            }
        )
        cli.close()
    except Exception as ex:
        outq.put({"role": role, "error": repr(ex)})


def wl_mixed(srv, producers, consumers, duration, cap):
    """(d) P producers + C consumers (separate processes) for `duration` seconds."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(producers + consumers + 1)
    outq = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(r, srv, barrier, duration, cap, outq), daemon=True)
        for r in ["producer"] * producers + ["consumer"] * consumers
    ]
    for p in procs:
        p.start()
    barrier.wait(120)
    cpu_s0 = tree_cpu_s(srv.pid())
    t0 = time.perf_counter()
    outs = [outq.get(timeout=duration + 120) for _ in procs]
    wall = time.perf_counter() - t0
    server_cpu = tree_cpu_s(srv.pid()) - cpu_s0
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.terminate()  # by its PID
            p.join(10)
    errs = [o["error"] for o in outs if "error" in o]
    if errs:
        raise RuntimeError(f"mixed workload worker failed: {errs}")

    def merged(role, key):
        a = array.array("q")
        for o in outs:
            if o["role"] == role:
                a.frombytes(o[key])
        return a

    enq = sum(o["n"] for o in outs if o["role"] == "producer")
    deq = sum(o["n"] for o in outs if o["role"] == "consumer")
    return {
        "producers": producers,
        "consumers": consumers,
        "duration_s": duration,
        "wall_s": wall,
        "enq_items": enq,
        "deq_items": deq,
        "enq_per_s": enq / duration,
        "deq_per_s": deq / duration,
        "backlog_end": enq - deq,
        "consumer_empty_polls": sum(o["empties"] for o in outs),
        "server_cpu_s": server_cpu,
        "client_cpu_s": sum(o["cpu_s"] for o in outs),
        "enq": lat_summary(merged("producer", "lat1")),
        "deq": lat_summary(merged("consumer", "lat1")),
        "ack": lat_summary(merged("consumer", "lat2")),
    }


def run_peer_mode(system, mode, root, a):
    out = {
        "system": system,
        "mode": mode,
        "durability": next(d for s, m, d, _ in ALL_MODES if s == system and m == mode),
    }
    srv = SYSTEMS[system](mode, root)
    try:
        srv.start()
        out["version"] = srv.version()
        if system == "postgres":
            out["settings"] = srv.settings
        log(f"  [{system}/{mode}] (a) enqueue x{a.n} single")
        out["a"] = wl_enqueue(srv, a.n, a.max_seconds, 1)
        log(f"      {out['a']['items_per_s']:.0f} items/s")
        log(f"  [{system}/{mode}] (b) enqueue x{a.n} in batches of {a.batch}")
        out["b"] = wl_enqueue(srv, a.n, a.max_seconds, a.batch)
        log(f"      {out['b']['items_per_s']:.0f} items/s")
        log(f"  [{system}/{mode}] (c) dequeue+ack x{a.n}")
        out["c"] = wl_drain(srv, a.n, a.max_seconds)
        log(f"      {out['c']['items_per_s']:.0f} items/s")
    finally:
        srv.stop()
    srv = SYSTEMS[system](mode, root)  # fresh, empty server for (d)
    try:
        srv.start()
        log(f"  [{system}/{mode}] (d) {a.producers}P+{a.consumers}C for {a.duration}s")
        out["d"] = wl_mixed(srv, a.producers, a.consumers, a.duration, a.mixed_cap)
        log(f"      enq {out['d']['enq_per_s']:.0f}/s deq {out['d']['deq_per_s']:.0f}/s")
    finally:
        srv.stop()
    return out


# --------------------------------------------------------------------------
# physical limits
# --------------------------------------------------------------------------
def fsync_bench(d, variant, n, tmax):
    path = os.path.join(d, f"fsync-{variant}.dat")
    buf = os.urandom(4096)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        sync = os.fdatasync if "fdatasync" in variant else os.fsync
        if variant.startswith("overwrite"):
            os.write(fd, b"\0" * (4096 * n))  # preallocate: size never changes afterwards
            os.fsync(fd)
        lat = array.array("q")
        t0 = time.perf_counter()
        t_end = t0 + tmax
        for i in range(n):
            s = time.perf_counter_ns()
            if variant.startswith("overwrite"):
                os.pwrite(fd, buf, 4096 * i)
            else:
                os.write(fd, buf)
            sync(fd)
            lat.append(time.perf_counter_ns() - s)
            if time.perf_counter() > t_end:
                break
        el = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    return {"variant": variant, "ops": len(lat), "ops_per_s": len(lat) / el, **lat_summary(lat)}


def seqwrite_bench(d, total, chunk=1 << 20):
    path = os.path.join(d, "seqwrite.dat")
    buf = os.urandom(chunk)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t0 = time.perf_counter()
        for _ in range(total // chunk):
            os.write(fd, buf)
        t1 = time.perf_counter()
        os.fsync(fd)
        t2 = time.perf_counter()
    finally:
        os.close(fd)
        os.unlink(path)
    return {
        "bytes": total,
        "write_s": t1 - t0,
        "fsync_s": t2 - t1,
        "total_s": t2 - t0,
        "MiB_per_s": total / (t2 - t0) / 2**20,
    }


HTTP_APPS = """
import json
async def bare(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif m["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:                       # drain the request body, if any
        m = await receive()
        more = m.get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"8")]})
    await send({"type": "http.response.body", "body": b'{"id":1}'})

from fastapi import FastAPI
from pydantic import BaseModel
class EnqueueRequest(BaseModel):
    payload: str
    deadline: float
    queue: str = "default"
class EnqueueResponse(BaseModel):
    id: int
fast = FastAPI()
@fast.post("/enqueue", response_model=EnqueueResponse)
async def enqueue(req: EnqueueRequest) -> EnqueueResponse:
    return EnqueueResponse(id=1)
"""
WRK_POST_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"payload": "%s", "deadline": 1795000000.25, "queue": "default"}'
""" % ("x" * 256)


def parse_wrk(text):
    def dur(tok):
        for unit, f in (("us", 1e-3), ("ms", 1.0), ("s", 1e3)):
            if tok.endswith(unit):
                return float(tok[: -len(unit)]) * f
        return float("nan")

    out = {"raw_tail": text[-600:]}
    for line in text.splitlines():
        p = line.split()
        if line.startswith("Requests/sec:"):
            out["rps"] = float(p[1])
        elif len(p) == 2 and p[0] in ("50%", "99%"):
            out["p50_ms" if p[0] == "50%" else "p99_ms"] = dur(p[1])
        elif "Non-2xx" in line or "Socket errors" in line:
            out.setdefault("errors", []).append(line.strip())
    return out


def http_floor(root, runs, secs, conns):
    d = tempfile.mkdtemp(prefix="http-", dir=root)
    with open(os.path.join(d, "floorapps.py"), "w") as f:
        f.write(HTTP_APPS)
    lua = os.path.join(d, "post.lua")
    with open(lua, "w") as f:
        f.write(WRK_POST_LUA)
    variants = [  # (label, app, uvicorn extra args, wrk script, path)
        ("bare ASGI GET (uvicorn, uvloop+httptools)", "floorapps:bare", [], None, "/"),
        ("bare ASGI POST 256B (uvicorn, uvloop+httptools)", "floorapps:bare", [], lua, "/enqueue"),
        (
            "FastAPI+pydantic POST (uvicorn, uvloop+httptools)",
            "floorapps:fast",
            [],
            lua,
            "/enqueue",
        ),
        (
            "FastAPI+pydantic POST (uvicorn, asyncio+h11)",
            "floorapps:fast",
            ["--loop", "asyncio", "--http", "h11"],
            lua,
            "/enqueue",
        ),
    ]
    results = []
    for run in range(runs):
        for label, app, extra, script, path in variants:
            port = free_port()
            p = start_proc(
                "uvicorn",
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    app,
                    "--host",
                    HOST,
                    "--port",
                    str(port),
                    "--workers",
                    "1",
                    "--log-level",
                    "warning",
                    "--no-access-log",
                    *extra,
                ],
                cwd=d,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                wait_port(port, p)
                for c in conns:
                    argv = ["wrk", "-t1", f"-c{c}", f"-d{secs}s", "--latency", "--timeout", "5s"]
                    if script:
                        argv += ["-s", script]
                    argv.append(f"http://{HOST}:{port}{path}")
                    r = subprocess.run(argv, capture_output=True, text=True, timeout=secs + 60)
                    w = parse_wrk(r.stdout)
                    results.append(
                        {"run": run, "label": label, "conns": c, "cmd": " ".join(argv), **w}
                    )
                    log(f"  http run{run} {label} c={c}: {w.get('rps', float('nan')):.0f} req/s")
            finally:
                stop_proc(p)
    shutil.rmtree(d, ignore_errors=True)
    return results


def run_physical(root, a):
    res = {"fsync": [], "seqwrite": [], "http": []}
    variants = ["append+fsync", "append+fdatasync", "overwrite+fdatasync"]
    for run in range(a.runs):
        for v in variants:
            r = fsync_bench(root, v, a.fsync_n, a.max_seconds)
            r["run"] = run
            res["fsync"].append(r)
            log(
                f"  fsync run{run} {v}: p50 {r['p50_ms']:.3f} ms p99 {r['p99_ms']:.3f} ms {r['ops_per_s']:.0f}/s"
            )
        r = seqwrite_bench(root, a.seq_bytes)
        r["run"] = run
        res["seqwrite"].append(r)
        log(
            f"  seqwrite run{run}: {r['MiB_per_s']:.0f} MiB/s (write {r['write_s']:.2f}s + fsync {r['fsync_s']:.2f}s)"
        )
    if a.skip_http:
        return res
    if not shutil.which("wrk"):
        log("  wrk not found: skipping the HTTP floor")
        return res
    res["http"] = http_floor(root, a.runs, a.http_seconds, [1, 32])
    return res


# --------------------------------------------------------------------------
# reporting
# --------------------------------------------------------------------------
def med(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def rng(xs):
    xs = [x for x in xs if x == x]
    return f"{min(xs):,.0f}–{max(xs):,.0f}" if xs else "-"  # noqa: RUF001


def _modver(name):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return "not installed"


def machine_facts(root):
    df = shutil.disk_usage(root)
    dev = run_cmd(["findmnt", "-n", "-o", "SOURCE,FSTYPE,OPTIONS", "--target", root])
    blk = dev.split()[0].split("/")[-1] if dev else ""

    def rd(p):
        try:
            return open(p).read().strip()
        except OSError:
            return "?"

    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in _lines("/proc/cpuinfo")
            if ln.startswith("model name")
        ),
        "?",
    )
    mem = next((ln.split()[1] for ln in _lines("/proc/meminfo") if ln.startswith("MemTotal")), "0")
    return {
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "mem_gib": round(int(mem) / 2**20, 1),
        "kernel": platform.release(),
        "os": run_cmd(["sh", "-c", ". /etc/os-release; echo $PRETTY_NAME"]),
        "python": platform.python_version(),
        "data_root": root,
        "mount": dev,
        "disk_total_gib": round(df.total / 2**30),
        "disk_free_gib": round(df.free / 2**30),
        "blockdev": {
            "name": blk,
            "rotational": rd(f"/sys/block/{blk}/queue/rotational"),
            "scheduler": rd(f"/sys/block/{blk}/queue/scheduler"),
            "write_cache": rd(f"/sys/block/{blk}/queue/write_cache"),
        },
        "hypervisor": run_cmd(
            ["sh", "-c", "lscpu | grep -i 'hypervisor vendor' | sed 's/  */ /g'"]
        ),
        "versions": {
            **{
                m: _modver(m)
                for m in (
                    "redis",
                    "hiredis",
                    "psycopg",
                    "fastapi",
                    "pydantic",
                    "uvicorn",
                    "uvloop",
                    "httptools",
                )
            },
            "wrk": run_cmd(["sh", "-c", "wrk -v 2>&1 | head -1"]),
            "beanstalkd": run_cmd(["beanstalkd", "-v"]),
            "redis-server": run_cmd(["redis-server", "--version"]),
        },
        "loadavg_start": rd("/proc/loadavg"),
    }


def render_md(R):
    L = []
    P = R.get("physical")
    if P:
        L.append("### Physical limits (median of runs; [min–max] across runs)\n")  # noqa: RUF001
        L.append("| fsync variant (4 KiB write + sync) | ops/s | p50 ms | p99 ms | runs |")
        L.append("|---|---:|---:|---:|---:|")
        for v in dict.fromkeys(r["variant"] for r in P["fsync"]):
            rs = [r for r in P["fsync"] if r["variant"] == v]
            L.append(
                f"| {v} | {med([r['ops_per_s'] for r in rs]):,.0f} [{rng([r['ops_per_s'] for r in rs])}] "
                f"| {med([r['p50_ms'] for r in rs]):.3f} | {med([r['p99_ms'] for r in rs]):.3f} | {len(rs)} |"
            )
        if P["seqwrite"]:
            rs = P["seqwrite"]
            L.append("")
            L.append(
                f"Sequential write {rs[0]['bytes'] / 2**30:.1f} GiB in 1 MiB writes + one fsync: "
                f"**{med([r['MiB_per_s'] for r in rs]):,.0f} MiB/s** median [{rng([r['MiB_per_s'] for r in rs])}] "
                f"(buffered write {med([r['write_s'] for r in rs]):.2f} s + fsync {med([r['fsync_s'] for r in rs]):.2f} s; "
                f"the fsync phase alone drains {med([r['bytes'] / r['fsync_s'] / 2**20 for r in rs]):,.0f} MiB/s)."
            )
        if P["http"]:
            L.append("")
            L.append(
                "| HTTP floor (1 uvicorn worker, wrk -t1) | conns | req/s | p50 ms | p99 ms | ratio to bare GET (same run) |"
            )
            L.append("|---|---:|---:|---:|---:|---:|")
            H = P["http"]
            for lab in dict.fromkeys(h["label"] for h in H):
                for c in sorted(set(h["conns"] for h in H)):
                    rs = [h for h in H if h["label"] == lab and h["conns"] == c]
                    ratios = []
                    for h in rs:
                        base = [
                            b
                            for b in H
                            if b["run"] == h["run"]
                            and b["conns"] == c
                            and b["label"].startswith("bare ASGI GET")
                        ]
                        if base and base[0].get("rps"):
                            ratios.append(h.get("rps", float("nan")) / base[0]["rps"])
                    err = " ⚠" if any(h.get("errors") for h in rs) else ""
                    L.append(
                        f"| {lab}{err} | {c} | {med([h.get('rps', float('nan')) for h in rs]):,.0f} "
                        f"[{rng([h.get('rps', float('nan')) for h in rs])}] | {med([h.get('p50_ms', float('nan')) for h in rs]):.3f} "
                        f"| {med([h.get('p99_ms', float('nan')) for h in rs]):.3f} | {med(ratios):.2f} |"
                    )
    Q = R.get("peers")
    if Q:
        keys = list(dict.fromkeys((r["system"], r["mode"]) for r in Q))
        ref = ("postgres", "sync-on")

        def rows(k):
            return [r for r in Q if (r["system"], r["mode"]) == k and "error" not in r]

        def ratio(k, wl, field):
            out = []
            for r in rows(k):
                b = [
                    x
                    for x in Q
                    if (x["system"], x["mode"]) == ref and x["run"] == r["run"] and "error" not in x
                ]
                if b and b[0][wl][field]:
                    out.append(r[wl][field] / b[0][wl][field])
            return med(out)

        def g(k, wl, *path):
            vals = []
            for r in rows(k):
                v = r[wl]
                for p in path:
                    v = v[p]
                vals.append(v)
            return vals

        L.append("\n### Durability modes\n")
        for k in keys:
            rs = rows(k)
            if rs:
                L.append(f"- **{k[0]} / {k[1]}**: {rs[0]['durability']}")
        for wl, title in (
            ("a", "(a) enqueue one at a time, single client"),
            (
                "b",
                f"(b) enqueue in batches of {R['args']['batch']} (beanstalkd: pipelined puts; "
                "redis: MULTI/EXEC pipeline; postgres: one multi-row INSERT)",
            ),
        ):
            L.append(f"\n### {title} — N={R['args']['n']:,}, median of runs\n")
            unit = "per item" if wl == "a" else "per batch"
            L.append(
                f"| system / mode | items/s [min–max] | ×pg sync-on (same run) | p50 ms {unit} | p99 ms {unit} | server CPU µs/item | client CPU µs/item |"  # noqa: RUF001
            )
            L.append("|---|---:|---:|---:|---:|---:|---:|")
            for k in keys:
                if not rows(k):
                    continue
                ips = g(k, wl, "items_per_s")
                cap = " (time-capped)" if any(g(k, wl, "capped")) else ""
                sc = med([r[wl]["server_cpu_s"] / max(1, r[wl]["items"]) * 1e6 for r in rows(k)])
                cc = med([r[wl]["client_cpu_s"] / max(1, r[wl]["items"]) * 1e6 for r in rows(k)])
                L.append(
                    f"| {k[0]} / {k[1]}{cap} | {med(ips):,.0f} [{rng(ips)}] | {ratio(k, wl, 'items_per_s'):.2f} "
                    f"| {med(g(k, wl, 'op', 'p50_ms')):.3f} | {med(g(k, wl, 'op', 'p99_ms')):.3f} | {sc:.0f} | {cc:.0f} |"
                )
        L.append(
            f"\n### (c) dequeue under lease + ack (delete), single consumer — N={R['args']['n']:,}, median of runs\n"
        )
        L.append(
            "| system / mode | items/s [min–max] | ×pg sync-on (same run) | dequeue p50 ms | dequeue p99 ms | ack p50 ms | ack p99 ms | server CPU µs/item |"  # noqa: RUF001
        )
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        for k in keys:
            if not rows(k):
                continue
            ips = g(k, "c", "items_per_s")
            cap = " (time-capped)" if any(g(k, "c", "capped")) else ""
            sc = med([r["c"]["server_cpu_s"] / max(1, r["c"]["items"]) * 1e6 for r in rows(k)])
            L.append(
                f"| {k[0]} / {k[1]}{cap} | {med(ips):,.0f} [{rng(ips)}] | {ratio(k, 'c', 'items_per_s'):.2f} "
                f"| {med(g(k, 'c', 'deq', 'p50_ms')):.3f} | {med(g(k, 'c', 'deq', 'p99_ms')):.3f} "
                f"| {med(g(k, 'c', 'ack', 'p50_ms')):.3f} | {med(g(k, 'c', 'ack', 'p99_ms')):.3f} | {sc:.0f} |"
            )
        A = R["args"]
        L.append(
            f"\n### (d) {A['producers']} producers + {A['consumers']} consumers (separate processes), "
            f"{A['duration']} s, fresh server — median of runs\n"
        )
        L.append(
            "| system / mode | enqueued/s [min–max] | dequeued+acked/s [min–max] | ×pg sync-on (deq, same run) | enq p50/p99 ms | deq p50/p99 ms | ack p50/p99 ms | backlog at end | server CPU % of 1 core |"  # noqa: RUF001
        )
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for k in keys:
            if not rows(k):
                continue
            e, dq = g(k, "d", "enq_per_s"), g(k, "d", "deq_per_s")
            cpu = med([r["d"]["server_cpu_s"] / r["d"]["wall_s"] * 100 for r in rows(k)])
            L.append(
                f"| {k[0]} / {k[1]} | {med(e):,.0f} [{rng(e)}] | {med(dq):,.0f} [{rng(dq)}] | {ratio(k, 'd', 'deq_per_s'):.2f} "
                f"| {med(g(k, 'd', 'enq', 'p50_ms')):.2f} / {med(g(k, 'd', 'enq', 'p99_ms')):.2f} "
                f"| {med(g(k, 'd', 'deq', 'p50_ms')):.2f} / {med(g(k, 'd', 'deq', 'p99_ms')):.2f} "
                f"| {med(g(k, 'd', 'ack', 'p50_ms')):.2f} / {med(g(k, 'd', 'ack', 'p99_ms')):.2f} "
                f"| {med(g(k, 'd', 'backlog_end')):,.0f} | {cpu:.0f} |"
            )
        errs = [r for r in Q if "error" in r]
        for r in errs:
            L.append(f"\n⚠ {r['system']}/{r['mode']} run {r['run']}: {r['error']}")
    return "\n".join(L) + "\n"


# --------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("what", choices=["all", "physical", "peers", "render"], help="what to measure")
    ap.add_argument(
        "--runs", type=int, default=3, help="repetitions; tables report medians (default 3)"
    )
    ap.add_argument(
        "--n", type=int, default=50_000, help="items for workloads a/b/c (default 50000)"
    )
    ap.add_argument(
        "--batch", type=int, default=100, help="batch size for workload b (default 100)"
    )
    ap.add_argument(
        "--duration", type=float, default=20, help="seconds for workload d (default 20)"
    )
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument(
        "--mixed-cap", type=int, default=2_000_000, help="per-process op cap in workload d"
    )
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=120,
        help="time cap of every a/b/c and fsync loop (default 120)",
    )
    ap.add_argument(
        "--modes",
        default="",
        help="comma list system:mode (default: all of "
        + ", ".join(f"{s}:{m}" for s, m, _, d in ALL_MODES if d)
        + ")",
    )
    ap.add_argument(
        "--fsync-n", type=int, default=5000, help="fsync ops per variant (default 5000)"
    )
    ap.add_argument(
        "--seq-bytes", type=int, default=1 << 30, help="sequential write size (default 1 GiB)"
    )
    ap.add_argument(
        "--http-seconds", type=int, default=10, help="wrk duration per point (default 10)"
    )
    ap.add_argument("--skip-http", action="store_true")
    ap.add_argument(
        "--data-root",
        default=os.getcwd(),
        help="where throw-away data dirs go (the disk under test; default: the current directory)",
    )
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"JSON results file ({DEFAULT_OUT})")
    ap.add_argument("--md", default=DEFAULT_MD, help=f"markdown tables file ({DEFAULT_MD})")
    ap.add_argument(
        "--quick", action="store_true", help="smoke test: n=2000, runs=1, d=3s, http 2s, 256 MiB"
    )
    a = ap.parse_args()
    if a.quick:
        a.n, a.runs, a.duration, a.http_seconds, a.seq_bytes, a.fsync_n = (
            2000,
            1,
            3,
            2,
            256 << 20,
            500,
        )

    if a.what == "render":
        R = json.loads(_read(a.out))
        _write(a.md, render_md(R))
        print(render_md(R))
        return

    signal.signal(signal.SIGTERM, _on_signal)
    modes = [tuple(x.split(":")) for x in a.modes.split(",") if x] or [
        (s, m) for s, m, _, d in ALL_MODES if d
    ]
    for s, m in modes:
        if not any(s == s2 and m == m2 for s2, m2, _, _ in ALL_MODES):
            ap.error(f"unknown mode {s}:{m}")
    os.makedirs(a.data_root, exist_ok=True)
    root = tempfile.mkdtemp(prefix="peers-bench-", dir=a.data_root)
    os.chmod(root, 0o755)  # the postgres OS user must be able to enter it
    R = {
        "cmd": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "args": vars(a),
        "machine": machine_facts(root),
        "started": datetime.now(UTC).isoformat(),
    }
    try:
        if a.what in ("all", "physical"):
            log("== physical limits")
            R["physical"] = run_physical(root, a)
        if a.what in ("all", "peers"):
            R["peers"] = []
            for run in range(a.runs):  # interleave: every mode once per run
                for s, m in modes:
                    log(f"== run {run} {s}/{m}")
                    try:
                        r = run_peer_mode(s, m, root, a)
                    except Exception as ex:
                        log(f"  FAILED: {ex!r}")
                        r = {"system": s, "mode": m, "error": repr(ex)}
                    r["run"] = run
                    R["peers"].append(r)
                    _write(a.out, json.dumps(R, indent=1, default=str))  # keep partial results
    finally:
        stop_all()
        shutil.rmtree(root, ignore_errors=True)
    R["finished"] = datetime.now(UTC).isoformat()
    R["machine"]["loadavg_end"] = _read("/proc/loadavg").strip()
    _write(a.out, json.dumps(R, indent=1, default=str))
    md = render_md(R)
    _write(a.md, md)
    print(md)


if __name__ == "__main__":
    main()
