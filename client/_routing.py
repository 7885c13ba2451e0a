"""Which server a call goes to: the known URLs of one deployment, and its leader.

A replicated dq takes writes only on its leader: a follower refuses them before doing
anything and answers ``421 {"error": "not_leader", "leader": url}``, or ``503
{"error": "no_leader"}`` while an election runs (``docs/http.md``, "Replication"). So
such a refusal can be re-sent to another node whatever the call, as can a request
whose connection never opened. This module decides where each try goes and how long
to pause between tries; the transports (``client/_http.py``) do the sending, so the
same rules hold for ``Client`` and ``AsyncClient`` (sans-IO, like the response parser).

The rules (``docs/client.md``, "Several servers"):
  - a call starts at the node that answered last (at first, the first URL given);
  - a redirect is followed at once to the node it names, unless that node was tried
    already in this round; a node that cannot be reached, knows no leader or names a
    node tried already gives way at once to the next known URL not tried in this round;
  - when every node of a round has failed, the round counts as one attempt of the
    transport's ``RetryPolicy`` and the next round starts after its pause;
  - with one known URL that is all (as without replication); with several, rounds go
    on until ``failover_s`` has passed since the call began (an election takes a few
    seconds), with pauses of at most ``MAX_PAUSE_S``.
Nodes named by redirects are added to the known URLs (at most ``MAX_KNOWN``). The node
that answered last is also remembered per list of URLs for the whole process, so that a
new client of the same deployment (a Spark task, a CLI helper) starts there too.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from dq.client.errors import TransportError

if TYPE_CHECKING:
    from dq.client._http import RetryPolicy

__all__ = [
    "DEFAULT_FAILOVER_S",
    "MAX_KNOWN",
    "MAX_PAUSE_S",
    "Cluster",
    "Endpoint",
    "Walk",
    "split_urls",
]

DEFAULT_FAILOVER_S = 10.0
MAX_PAUSE_S = 0.5
MAX_KNOWN = 16
_TRAIL = 8  # steps of a call kept for the error message
_REMEMBERED = 64  # URL lists whose last leader the process remembers

#: the URLs given (as a tuple) → the URL of the node that answered last
_last_leader: dict[tuple[str, ...], str] = {}
_last_lock = threading.Lock()


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
    """One node's address and the request head that goes with it."""

    __slots__ = ("base_path", "head", "host", "port", "tls", "url")

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
        if len(urls) > 1:
            with _last_lock:
                known = _last_leader.get(self._key)
            if known is not None:
                self.prefer(known)

    def answered_by(self, ep: Endpoint) -> None:
        """``ep`` served a call: the next calls, and new clients of these URLs, start there."""
        if ep is self.leader:
            return
        self.leader = ep
        with _last_lock:
            _last_leader.pop(self._key, None)
            _last_leader[self._key] = ep.url
            while len(_last_leader) > _REMEMBERED:
                del _last_leader[next(iter(_last_leader))]

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
        """Start the next calls at ``url`` (a leader learnt elsewhere)."""
        ep = self.named(url)
        if ep is not None:
            self.leader = ep


class Walk:
    """One call's way to a node that answers it. Each method reports what happened to
    the try at ``endpoint`` and returns the pause before the next try (which goes to
    ``endpoint`` again, possibly another one now), or ``None``: give up."""

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
        (``time.monotonic()``), when the walk is made only after that try failed."""
        self.cluster = cluster
        self.policy = policy
        self.failover_s = failover_s
        self.endpoint = endpoint if endpoint is not None else cluster.leader
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
        """A retryable answer or a lost one from the same node (the transport decides
        which may be retried): try it again after the policy's pause."""
        self.attempt += 1
        if self.attempt > self.policy.retries:
            return None
        return self.policy.delay_s(self.attempt)

    def unreachable(self, why: str) -> float | None:
        """The request never reached the node (connect or send failed)."""
        self._note(f"{self.endpoint.url}: {why}")
        return self._next()

    def no_leader(self) -> float | None:
        """The node is a follower that knows no leader now."""
        self._note(f"{self.endpoint.url} knows no leader")
        return self._next()

    def redirected(self, leader: str | None) -> float | None:
        """The node is a follower naming ``leader``."""
        if not leader:
            return self.no_leader()
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
        self.endpoint = first
        self._tried = [first]
        return pause

    def story(self) -> str:
        """The steps of this call, for an error message."""
        waited = time.monotonic() - self._started
        return f"{' → '.join(self.trail)} ({self.attempt} round(s), {waited:.1f} s)"
