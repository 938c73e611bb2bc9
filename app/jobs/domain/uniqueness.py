"""Unique jobs (docs/JOBS.md), the pure part: a request's `unique` options as the columns a job
stores, and the rule on which `while` sets the database can enforce. No SQL, no HTTP.

Enforcement is the partial unique index on (producer, unique_scope) over the jobs whose
status is in their own while set (app/storage/schema/jobs.py). Two consequences shape the
rules here:
- a new job is pending, so a while set without pending would never meet the index at
  enqueue and could deduplicate nothing;
- a job must never *enter* its while set by a claim or a worker's report while a twin holds
  the key, or the database would have to refuse the claim or the report. A set holding
  running must hold pending (a claim), one holding completed or failed must hold running (a
  report). The one entry left, a failed attempt sent back to pending under a set without
  running, is settled where it happens: that job lets go of its key (see JobService.fail).
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from app.core.clock import MICROS
from app.core.statuses import STATUS_BITS, JobStatus

DEFAULT_WHILE = (JobStatus.PENDING.value, JobStatus.RUNNING.value)
# The statuses a while set may name: those with a bit in STATUS_BITS (app/core/statuses.py).
# Waiting is not one of them: a waiting job holds its key whenever pending does; nor
# suspended, held whenever running is. Nor is reserved: a reserved job takes no unique key
# (intake refuses the two together).
WHILE_STATUSES = tuple(status.value for status in JobStatus
                       if status in STATUS_BITS
                       and status not in (JobStatus.WAITING, JobStatus.SUSPENDED))


class OnConflict(enum.StrEnum):
    RETURN = "return"
    REJECT = "reject"
    REPLACE = "replace"


class Deduplicated(enum.Enum):
    """What `unique` made of an enqueue; `wire` is how the API says it."""

    NO = False
    RETURNED = True
    REPLACED = "replaced"

    @property
    def wire(self) -> bool | str:
        return self.value  # type: ignore[no-any-return]


def while_set_problem(statuses: Collection[str]) -> str | None:
    """Why the database could not hold a key over these statuses; None when it can."""
    chosen = set(statuses)
    if JobStatus.PENDING not in chosen:
        return "Must include pending: a new job is pending, and only a job in its while " \
               "statuses can meet a twin."
    if chosen & {JobStatus.COMPLETED, JobStatus.FAILED} and JobStatus.RUNNING not in chosen:
        return "With completed or failed, include running: a worker's report must never " \
               "be refused because a twin holds the key."
    return None


@dataclass(frozen=True)
class UniqueRequest:
    """A request's `unique` options, resolved: the columns it stores and what a twin means."""

    key: str
    scope: str
    while_mask: int
    on_conflict: OnConflict

    @property
    def columns(self) -> dict[str, Any]:
        return {"unique_key": self.key, "unique_scope": self.scope,
                "unique_while": self.while_mask}


NOT_UNIQUE_COLUMNS: dict[str, Any] = {"unique_key": None, "unique_scope": None,
                                      "unique_while": None}


def _digest(value: Any) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def resolve_unique(options: dict[str, Any], job_type: str, payload: dict[str, Any],
                   run_at_us: int) -> UniqueRequest:
    """`options` as EnqueueSchema loaded them (their while set already checked)."""
    key = options.get("key") or _digest([job_type, payload])
    period = options.get("period_seconds")
    # Periods are aligned to the Unix epoch: bucket = floor(run_at / period).
    bucket = None if period is None else run_at_us // (period * MICROS)
    statuses = options.get("while") or DEFAULT_WHILE
    return UniqueRequest(
        key=key,
        # The type, the key and the period are one scope: the same key under another type or
        # another period length never meets this one. The producer is a column of the index.
        scope=_digest([job_type, key, period, bucket]),
        while_mask=sum(STATUS_BITS[JobStatus(status)] for status in set(statuses)),
        on_conflict=OnConflict(options.get("on_conflict") or OnConflict.RETURN),
    )


def holds_key_in(while_mask: int | None, status: str) -> bool:
    """True when a job with this mask holds its key while in `status`."""
    return bool(while_mask) and bool(while_mask & STATUS_BITS[JobStatus(status)])  # type: ignore[operator]
