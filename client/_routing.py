"""Which server a call goes to: the known URLs of one deployment, and its leader.

A replicated dq takes writes only on its leader: a follower refuses them before doing
anything and answers ``421 {"error": "not_leader", "leader": url}``, or ``503
{"error": "no_leader"}`` while an election runs (``docs/http.md``, "Replication"). So
such a refusal can be re-sent to another node whatever the call, as can a request
whose connection never opened. This module decides where each try goes, whether it
carries the call or first asks the node who leads, and how long to pause between tries;
the transports (``client/_http.py``) do the sending, so the same rules hold for
``Client`` and ``AsyncClient`` (sans-IO, like the response parser).

A leader can also stall without dying (a long GC pause, a frozen VM, ``SIGSTOP``): its
kernel still accepts connections and requests, nothing answers, and a new leader is
elected a few seconds in while the old one may stay frozen for any time. A call sent
there only times out, so a node is **confirmed** (it may be sent calls) only while it
has answered since its last lost answer; any other node is first asked ``GET
/v1/cluster`` (the **probe**: a read, safe to repeat, answered from memory), with a
short timeout.

The rules (``docs/client.md``, "Several servers"):
  - a call starts at the node that answered last (at first, the first URL given);
  - with several known nodes, a try goes to a node not confirmed only as a probe: a
    node that answers it as leader (or as a single server, or with no cluster view at
    all: not a replicated dq) gets the call; a follower's answer counts as a redirect
    to the leader it names; a node that knows no leader gives way to the next one;
  - a lost answer (a timeout, a connection cut mid-answer) takes the node's
    confirmation away: later calls start at another node, and it gets no call until
    it answers a probe. The call itself is tried again, at the next node, only if the
    transport says it may be (it was idempotent); else it ends, its outcome unknown;
  - a redirect is followed at once to the node it names, unless that node was tried
    already in this round; a node that cannot be reached, knows no leader or names a
    node tried already gives way at once to the next known URL not tried in this round;
  - when every node of a round has failed, the round counts as one attempt of the
    transport's ``RetryPolicy`` and the next round starts after its pause;
  - with one known URL that is all (as without replication: it is always confirmed);
    with several, rounds go on until ``failover_s`` has passed since the call began
    (an election takes a few seconds), with pauses of at most ``MAX_PAUSE_S``.
Nodes named by redirects are added to the known URLs (at most ``MAX_KNOWN``). The node
that answered last, and the nodes whose answer was lost since, are also remembered per
list of URLs for the whole process, so that a new client of the same deployment (a
Spark task, a CLI helper) starts at the leader and not at a stalled node.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from dq.client.errors import TransportError

__all__ = [
    "DEFAULT_FAILOVER_S",
    "MAX_KNOWN",
    "MAX_PAUSE_S",
    "PROBE_PATH",
    "PROBE_TIMEOUT_S",
    "Cluster",
    "Endpoint",
    "RetryPolicy",
    "Walk",
    "split_urls",
]

DEFAULT_FAILOVER_S = 10.0
MAX_PAUSE_S = 0.5
MAX_KNOWN = 16
#: what a probe asks: the node's role and the leader it knows (``docs/replication.md``)
PROBE_PATH = "/v1/cluster"
#: a probe's timeout in a call's first round (doubling each round, at most the call's
#: own): a live node answers it from memory in milliseconds, a stalled one never
PROBE_TIMEOUT_S = 2.0
_TRAIL = 8  # steps of a call kept for the error message
_REMEMBERED = 64  # URL lists whose last leader the process remembers


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how soon a retryable request is sent again:
    ``base_s * 2**attempt`` (attempt 1, 2, ...), at most ``max_s``."""

    retries: int = 3
    base_s: float = 0.05
    max_s: float = 5.0
    statuses: frozenset[int] = frozenset({503})

    def delay_s(self, attempt: int) -> float:
        return float(min(self.max_s, self.base_s * 2**attempt))


class _Seen:
    """What the process learnt of one deployment: the node that answered last, and
    the nodes whose answer was lost since they last answered."""

    __slots__ = ("leader", "suspect")

    def __init__(self) -> None:
        self.leader: str | None = None
        self.suspect: set[str] = set()


#: the URLs given (as a tuple) → what the process learnt of them
_seen: dict[tuple[str, ...], _Seen] = {}
_seen_lock = threading.Lock()


def _learn(key: tuple[str, ...]) -> _Seen:
    """The record of ``key``, made the newest (call with ``_seen_lock`` held)."""
    seen = _seen.pop(key, None) or _Seen()
    _seen[key] = seen
    while len(_seen) > _REMEMBERED:
        del _seen[next(iter(_seen))]
    return seen


def split_urls(url: str | Sequence[str]) -> list[str]:
    """``"http://a:1,http://b:2"`` or a list of URLs (each may hold commas too): the
    URLs in order, without trailing slashes or repeats."""
    parts = url.split(",") if isinstance(url, str) else [p for u in url for p in u.split(",")]
    out: list[str] = []
    for part in parts:
        clean = part.strip().rstrip("/")
        if clean and clean not in out:
            out.append(clean)
    if not out:
        raise TransportError(f"{url!r}: no server URL given")
    return out


class Endpoint:
    """One node's address and the request head that goes with it; ``confirmed``: the
    node has answered since its last lost answer (module docstring)."""

    __slots__ = ("base_path", "confirmed", "head", "host", "port", "tls", "url")

    def __init__(self, url: str, token: str | None, ssl_context: ssl.SSLContext | None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TransportError(f"{url}: expected http://host[:port] or https://host[:port]")
        self.url = url
        self.host = parts.hostname
        https = parts.scheme == "https"
        try:
            self.port = parts.port or (443 if https else 80)
        except ValueError as exc:
            raise TransportError(f"{url}: {exc}") from None
        self.tls = (ssl_context or ssl.create_default_context()) if https else None
        self.base_path = parts.path
        host = f"[{self.host}]" if ":" in self.host else self.host
        head = f"Host: {host}:{self.port}\r\nUser-Agent: dq-client\r\n"
        if token:
            head += f"Authorization: Bearer {token}\r\n"
        self.head = head.encode("latin-1")
        self.confirmed = False

    def __repr__(self) -> str:
        return f"Endpoint({self.url!r})"


class Cluster:
    """The known nodes of one deployment and the one that answered last (shared by every
    call of a transport; safe across threads)."""

    def __init__(
        self, urls: Sequence[str], token: str | None, ssl_context: ssl.SSLContext | None
    ) -> None:
        self._token = token
        self._ssl = ssl_context
        self._lock = threading.Lock()
        self.endpoints: list[Endpoint] = [Endpoint(u, token, ssl_context) for u in urls]
        self._key = tuple(urls)
        #: where the next call starts
        self.leader: Endpoint = self.endpoints[0]
        if len(urls) == 1:
            self.leader.confirmed = True  # nowhere else to go: no probe
            return
        with _seen_lock:
            seen = _seen.get(self._key)
            known = None if seen is None else seen.leader
            suspect = set() if seen is None else set(seen.suspect)
        if known is not None:
            self.prefer(known)
        if known is not None and self.leader.url == known:
            self.leader.confirmed = True  # it answered in this process, and nothing was lost since
        else:
            self.leader = next(
                (ep for ep in self.endpoints if ep.url not in suspect), self.endpoints[0]
            )

    def answered_by(self, ep: Endpoint) -> None:
        """``ep`` served a call: the next calls, and new clients of these URLs, start there."""
        if ep is self.leader and ep.confirmed:
            return
        ep.confirmed = True
        self.leader = ep
        if len(self.endpoints) > 1:
            with _seen_lock:
                seen = _learn(self._key)
                seen.leader = ep.url
                seen.suspect.discard(ep.url)

    def heard_from(self, ep: Endpoint) -> None:
        """``ep`` answered something (a probe, a refusal): it is not stalled."""
        if not ep.confirmed:
            ep.confirmed = True
            with _seen_lock:
                seen = _seen.get(self._key)
                if seen is not None:
                    seen.suspect.discard(ep.url)

    def lost(self, ep: Endpoint) -> None:
        """A request reached ``ep`` and no answer came back, or ``ep`` could not be
        reached: with other nodes known, it gets no call until it answers a probe, and
        the next calls start at another node (the next confirmed one in the list, else
        the next one)."""
        endpoints = self.endpoints
        if len(endpoints) < 2:
            return  # as without replication: the one node is tried again
        ep.confirmed = False
        with _seen_lock:
            seen = _learn(self._key)
            seen.suspect.add(ep.url)
            if seen.leader == ep.url:
                seen.leader = None
        if self.leader is ep and ep in endpoints:
            start = endpoints.index(ep)
            after = [endpoints[(start + i) % len(endpoints)] for i in range(1, len(endpoints))]
            self.leader = next((e for e in after if e.confirmed), after[0])

    def named(self, url: str) -> Endpoint | None:
        """The node a redirect names, added to the known ones if new; ``None`` if the
        URL is unusable or too many nodes are known already."""
        url = url.strip().rstrip("/")
        with self._lock:
            for ep in self.endpoints:
                if ep.url == url:
                    return ep
            if len(self.endpoints) >= MAX_KNOWN:
                return None
            try:
                ep = Endpoint(url, self._token, self._ssl)
            except TransportError:
                return None
            self.endpoints = [*self.endpoints, ep]
            return ep

    def prefer(self, url: str) -> None:
        """Start the next calls at ``url`` (a leader learnt elsewhere; probed first if
        it has not answered here yet)."""
        ep = self.named(url)
        if ep is not None:
            self.leader = ep


class Walk:
    """One call's way to a node that answers it. Each method reports what happened to
    the try at ``endpoint`` and returns the pause before the next try (which goes to
    ``endpoint`` again, possibly another one now: as a probe if ``probing``), or
    ``None``: give up."""

    __slots__ = (
        "_named",
        "_started",
        "_tried",
        "attempt",
        "cluster",
        "endpoint",
        "failover_s",
        "lost",
        "policy",
        "probing",
        "trail",
    )

    def __init__(
        self,
        cluster: Cluster,
        policy: RetryPolicy,
        failover_s: float,
        endpoint: Endpoint | None = None,
        started: float | None = None,
    ) -> None:
        """``endpoint``, ``started``: where the first try went and when the call began
        (``time.monotonic()``), when the walk is made only after that try failed.
        Without them the walk starts at the cluster's leader, with a probe if that
        node is not confirmed."""
        self.cluster = cluster
        self.policy = policy
        self.failover_s = failover_s
        #: the next try asks ``endpoint`` who leads (``PROBE_PATH``) instead of
        #: sending it the call
        self.probing = False
        if endpoint is None:
            endpoint = cluster.leader
            self.probing = not endpoint.confirmed
        self.endpoint = endpoint
        self._tried: list[Endpoint] = [self.endpoint]
        self._named: Endpoint | None = None
        self._started = started if started is not None else time.monotonic()
        self.attempt = 0
        #: what each node said, for the message of the error that ends the call
        self.trail: list[str] = []
        #: a try whose answer was lost (it may have been carried out), if any: then
        #: no refusal that ends the call may claim that nothing was done
        self.lost: str | None = None

    def answered(self) -> None:
        """The node served the call: later calls start there."""
        self.cluster.answered_by(self.endpoint)

    def again(self) -> float | None:
        """A retryable answer from the node (the transport decides which may be
        retried): try it again after the policy's pause."""
        self.cluster.heard_from(self.endpoint)
        self.attempt += 1
        if self.attempt > self.policy.retries:
            return None
        return self.policy.delay_s(self.attempt)

    def probe_timeout(self, call_timeout: float) -> float:
        """How long the probe at ``endpoint`` may wait for its answer."""
        return min(call_timeout, PROBE_TIMEOUT_S * float(1 << min(self.attempt, 8)))

    def probed(self, role: str | None, leader: str | None) -> float | None:
        """The node answered the probe: ``role`` and ``leader`` (a URL) as its ``GET
        /v1/cluster`` says, ``None`` when the answer had no such view (a dq without
        replication of an older version, a proxy): then the call goes there and its
        own answer decides."""
        self.cluster.heard_from(self.endpoint)
        if role is None or role in ("leader", "single"):
            self.probing = False
            return 0.0
        if role == "follower" and leader:
            return self.redirected(leader)
        return self.no_leader()

    def lost_answer(self, why: str, retry: bool) -> float | None:
        """The try went out and no answer came back (a timeout, a connection cut before
        the answer ended): the node may have carried it out, and it may be stalled.
        ``retry``: the call may be sent again (the transport decides: an idempotent
        call; never a probe's caller, which calls ``probe_lost``). With several nodes
        the retry goes to the next one, and the lost node gets no call until it
        answers a probe (``Cluster.lost``)."""
        self.lost = f"{self.endpoint.url} ({why})"
        self._note(f"{self.endpoint.url}: {why}")
        self.cluster.lost(self.endpoint)
        if not retry:
            return None
        if len(self.cluster.endpoints) > 1:
            return self._next()
        self.attempt += 1
        if self.attempt > self.policy.retries:
            return None
        return self.policy.delay_s(self.attempt)

    def probe_lost(self, why: str) -> float | None:
        """The probe had no answer in time: the node is taken as stalled (nothing was
        sent to it but a read)."""
        self._note(f"{self.endpoint.url} (asked who leads): {why}")
        self.cluster.lost(self.endpoint)
        return self._next()

    def unreachable(self, why: str) -> float | None:
        """The request never reached the node (connect or send failed)."""
        self._note(f"{self.endpoint.url}: {why}")
        self.cluster.lost(self.endpoint)
        return self._next()

    def no_leader(self) -> float | None:
        """The node is a follower that knows no leader now."""
        self.cluster.heard_from(self.endpoint)
        self._note(f"{self.endpoint.url} knows no leader")
        return self._next()

    def redirected(self, leader: str | None) -> float | None:
        """The node is a follower naming ``leader``."""
        if not leader:
            return self.no_leader()
        self.cluster.heard_from(self.endpoint)
        ep = self.cluster.named(leader)
        self._note(f"{self.endpoint.url} named {leader}")
        if ep is None:
            return self._next()
        self._named = ep
        if ep in self._tried:
            # a follower whose view is stale (cut off from etcd, it still names the old
            # leader, which now knows none) must not hide the nodes not asked yet: one
            # of them may be the new leader
            return self._next()
        self._go(ep)
        return 0.0

    def _note(self, step: str) -> None:
        self.trail.append(step)
        del self.trail[:-_TRAIL]

    def _go(self, ep: Endpoint) -> None:
        self.endpoint = ep
        self._tried.append(ep)
        self.probing = not ep.confirmed

    def _next(self) -> float | None:
        """The next known node not tried in this round, or a new round."""
        endpoints = self.cluster.endpoints
        start = endpoints.index(self.endpoint) if self.endpoint in endpoints else -1
        for i in range(1, len(endpoints) + 1):
            ep = endpoints[(start + i) % len(endpoints)]
            if ep not in self._tried:
                self._go(ep)
                return 0.0
        return self._new_round()

    def _new_round(self) -> float | None:
        self.attempt += 1
        pause = self.policy.delay_s(self.attempt)
        if len(self.cluster.endpoints) > 1:
            left = self._started + self.failover_s - time.monotonic()
            if self.attempt > self.policy.retries and left <= 0:
                return None
            pause = max(0.0, min(pause, MAX_PAUSE_S, left))
        elif self.attempt > self.policy.retries:
            return None
        first = self._named or self.cluster.leader
        self._named = None
        self._tried = []
        self._go(first)
        return pause

    def story(self) -> str:
        """The steps of this call, for an error message."""
        waited = time.monotonic() - self._started
        return f"{' → '.join(self.trail)} ({self.attempt} round(s), {waited:.1f} s)"
