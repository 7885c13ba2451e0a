"""Type stub for the C extension ``dq.storage._leases`` (storage/_leases.c)."""

#: bytes of one key
KEY: int
#: bytes of one lease's record
RECORD: int

class Lease:
    """One live delivery as it was when read (a snapshot: ``restore`` puts it back)."""

    key: bytes
    enqueue_time: int
    requeue_time: int
    dequeue_count: int
    #: when the lease ends
    expires: int
    #: the delivery its receipt names
    delivery: int
    #: where the pending entry lives (a hint for value lookups)
    source: object | None
    #: when this delivery began (dequeue time; extends keep it)
    since: int
    #: the item's group (``docs/delivery.md``)
    group: str | None
    def __init__(
        self,
        key: bytes,
        enqueue_time: int,
        requeue_time: int,
        dequeue_count: int,
        expires: int,
        delivery: int,
        source: object | None,
        since: int = 0,
        group: str | None = None,
    ) -> None: ...

class Leases:
    """One queue's in-flight set: who holds which item, until when, under which receipt."""

    #: the random first part of this set's receipts (new for each queue opening)
    @property
    def epoch(self) -> str: ...
    @property
    def allocated(self) -> int: ...
    def __init__(self) -> None: ...
    def __len__(self) -> int: ...
    def __contains__(self, item_id: object) -> bool: ...
    def add(
        self,
        item_id: int,
        key: bytes,
        enqueue_time: int,
        requeue_time: int,
        dequeue_count: int,
        expires: int,
        source: object | None,
        since: int,
        group: str | None,
    ) -> str: ...
    def restore(self, item_id: int, lease: Lease) -> None: ...
    def check(self, item_id: int, receipt: str, next_id: int, now: int) -> Lease: ...
    def take(self, item_id: int, receipt: str, next_id: int, now: int) -> Lease: ...
    def extend(self, item_id: int, receipt: str, next_id: int, now: int, expires: int) -> str: ...
    def pop(self, item_id: int) -> Lease: ...
    def get(self, item_id: int) -> Lease | None: ...
    def values(self) -> list[tuple[int, Lease]]: ...
    def oldest_since(self) -> int | None: ...
    def next_expiry(self) -> int | None: ...
    def pop_expired(self, now: int) -> list[tuple[int, Lease]]: ...
