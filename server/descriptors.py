"""The descriptor budget: client connections get at most half of the open-file limit.

One process holds every descriptor: client connections, one log per queue, one per
segment file, the compaction workers' pipes, the shared-memory sockets. Running out
(EMFILE) makes a log rotation or a freeze fail — refusals for every client of every
queue — so connections are capped well below the limit and the rest is left to storage
(``docs/reliability.md``, "Hostile input"). The soft limit is first raised to the hard
one, as servers do. Invariant: the cap the protocol enforces is
``min(DQ_MAX_CONNECTIONS, open-file limit // 2)``; a lowered cap is logged at start.
"""

from __future__ import annotations

import logging
import resource

__all__ = ["connection_budget", "raise_open_file_limit"]

log = logging.getLogger(__name__)


def raise_open_file_limit() -> int:
    """Raise the soft open-file limit to the hard one; return the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and soft != resource.RLIM_INFINITY:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            log.info("could not raise the open-file limit above %d", soft)
    return soft


def connection_budget(configured: int) -> int:
    """The connection cap to enforce: ``configured``, or half the open-file limit."""
    limit = raise_open_file_limit()
    if limit == resource.RLIM_INFINITY:
        return configured
    budget = max(1, min(configured, limit // 2))
    if budget < configured:
        log.warning(
            "the open-file limit is %d: at most %d connections (DQ_MAX_CONNECTIONS=%d), "
            "the rest stays for logs and segment files; raise `ulimit -n` for more",
            limit,
            budget,
            configured,
        )
    return budget
