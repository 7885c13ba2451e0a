"""Typed, validated options of the ``dq`` data source.

Spark hands a data source its options as a case-insensitive map of strings; this module
turns them into small frozen (hence picklable) dataclasses once, on the driver, so that
executors never parse options and a bad option fails before any item is leased. Option
names follow Spark's Kafka source where one exists (``maxOffsetsPerTrigger`` →
``maxItemsPerTrigger``, ``minPartitions``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from dq.pipeline.errors import OptionError

__all__ = ["Connection", "ReadOptions", "WriteOptions"]

_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")


def _str(options: Mapping[str, str], key: str, default: str | None = None) -> str:
    value = options.get(key, default)
    if value is None or value == "":
        raise OptionError(f"the dq data source needs the option {key!r}")
    return str(value)


def _int(options: Mapping[str, str], key: str, default: int, low: int = 1) -> int:
    raw = options.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {key!r} must be an integer, not {raw!r}") from None
    if value < low:
        raise OptionError(f"option {key!r} must be >= {low}, not {value}")
    return value


def _name(options: Mapping[str, str], key: str, default: str | None = None) -> str:
    value = _str(options, key, default)
    if _NAME.fullmatch(value) is None:
        raise OptionError(f"option {key!r} must match [A-Za-z0-9._-]{{1,128}}, not {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Connection:
    """Where the queue is: ``url``, ``queue``, ``consumer`` and an optional bearer ``token``.

    ``url`` may list the nodes of a replicated deployment, comma-separated: it travels
    whole to the executors, whose clients find and follow the leader among them."""

    url: str
    queue: str
    consumer: str
    token: str | None
    timeout_s: float

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Connection:
        urls = [u.strip() for u in _str(options, "url").split(",") if u.strip()]
        bad = [u for u in urls if not u.startswith(("http://", "https://"))]
        if not urls or bad:
            raise OptionError(
                f"option 'url' must be http(s) URLs, comma-separated, not {options['url']!r}"
            )
        return cls(
            url=",".join(urls),
            queue=_name(options, "queue"),
            consumer=_name(options, "consumer", "spark"),
            token=options.get("token") or None,
            timeout_s=_int(options, "timeoutMs", 60_000) / 1000,
        )


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """Batch: ``maxItems`` over ``numPartitions``; streaming: ``maxItemsPerTrigger`` over at
    least ``minPartitions``. Both: ``leaseMs`` (kept alive by the server while un-acked),
    ``itemsPerPartition`` (upper bound before a range is split further), ``readPageSize``
    (log entries per HTTP read) and ``consumerIdleTimeoutMs``."""

    conn: Connection
    max_items: int
    num_partitions: int
    max_items_per_trigger: int
    min_partitions: int
    items_per_partition: int
    lease_ms: int
    read_page_size: int
    idle_timeout_ms: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        return cls(
            conn=Connection.parse(options),
            max_items=_int(options, "maxItems", 10_000),
            num_partitions=_int(options, "numPartitions", 2),
            max_items_per_trigger=_int(options, "maxItemsPerTrigger", 10_000),
            min_partitions=_int(options, "minPartitions", 1),
            items_per_partition=_int(options, "itemsPerPartition", 50_000),
            lease_ms=_int(options, "leaseMs", 300_000),
            read_page_size=_int(options, "readPageSize", 5_000),
            idle_timeout_ms=_int(options, "consumerIdleTimeoutMs", 3_600_000, low=1000),
        )


ACTIONS = ("enqueue", "release", "requeue")


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """``action``: ``enqueue`` (default; rows carry ``value`` and optional ``deadline`` /
    ``delay_ms``), or ``release`` / ``requeue`` (rows carry ``seq`` of a ``dq`` read, and
    for requeue optional ``deadline`` / ``delay_ms``; ``delayMs`` is the default delay).
    ``batchSize`` rows per HTTP request; ``writeId`` names the write for de-duplication
    (default: fresh per write job)."""

    conn: Connection
    action: str
    batch_size: int
    write_id: str | None
    delay_ms: int | None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        action = options.get("action", "enqueue").lower()
        if action not in ACTIONS:
            raise OptionError(f"option 'action' must be one of {ACTIONS}, not {action!r}")
        raw_delay = options.get("delayMs")
        return cls(
            conn=Connection.parse(options),
            action=action,
            batch_size=_int(options, "batchSize", 500),
            write_id=options.get("writeId") or None,
            delay_ms=None if raw_delay is None else _int(options, "delayMs", 0, low=0),
        )
