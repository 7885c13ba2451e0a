"""The checks every ``*Batch`` action makes before touching a single entry.

SQS refuses a whole batch request that is empty, holds too many entries, repeats an
entry ``Id`` or uses an ``Id`` outside ``[A-Za-z0-9_-]{1,80}``; entries that pass are
then handled one by one and reported in ``Successful`` or ``Failed``.
"""

from __future__ import annotations

import re
from typing import Any

from dq.server.sqs.errors import SqsError
from dq.server.sqs.params import get_list

__all__ = ["check_entries", "failed"]

_ENTRY_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")


def check_entries(p: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    entries = get_list(p, "Entries", required=True)
    if not entries:
        raise SqsError("EmptyBatchRequest", "There should be at least one entry in the request.")
    if len(entries) > limit:
        raise SqsError(
            "TooManyEntriesInBatchRequest",
            f"Maximum number of entries per request are {limit}. You have sent {len(entries)}.",
        )
    seen: set[str] = set()
    for e in entries:
        entry_id = e.get("Id") if isinstance(e, dict) else None
        if not isinstance(entry_id, str) or _ENTRY_ID.fullmatch(entry_id) is None:
            raise SqsError(
                "InvalidBatchEntryId",
                "A batch entry id can only contain alphanumeric characters, hyphens and "
                "underscores. It can be at most 80 letters long.",
            )
        if entry_id in seen:
            raise SqsError("BatchEntryIdsNotDistinct", f"Id {entry_id} repeated.")
        seen.add(entry_id)
    return entries


def failed(entry_id: str, err: SqsError) -> dict[str, Any]:
    return {
        "Id": entry_id,
        "SenderFault": err.sender_fault,
        "Code": err.code,
        "Message": err.message,
    }
