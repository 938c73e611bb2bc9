"""A job's statuses, the bits a unique job's while set stores them as, and the claim order."""

from __future__ import annotations

import enum
from typing import Any


class JobStatus(enum.StrEnum):
    # Stored by a producer's reserve, until it confirms (pending) or releases (cancelled)
    # it (docs/JOBS.md, Reserved jobs): never claimed, never pushed.
    RESERVED = "reserved"
    # Waiting for its dependencies (docs/WORKFLOWS.md): never claimed, never pushed.
    WAITING = "waiting"
    PENDING = "pending"
    RUNNING = "running"
    # Between two attempts, waiting for a moment, an event or a waitpoint token
    # (docs/WAITS.md): holds no lease and no slot, never claimed, never pushed.
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


# Not a status a job is ever in: what a job retention removed is shown as where another still
# names it (a dependency of GET /jobs/{id}/dependencies, a job of a workflow). Retention only
# removes finished jobs, so a removed job counts as finished.
REMOVED = "removed"

TERMINAL_STATUSES = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})
UNFINISHED_STATUSES = frozenset({JobStatus.RESERVED, JobStatus.WAITING, JobStatus.PENDING,
                                 JobStatus.RUNNING, JobStatus.SUSPENDED})

# Each status's bit in a job's `unique_while` mask (the statuses in which it holds its unique
# key). Stored, and spelled into the unique index's predicate: never renumber. A waiting job
# holds its key as a pending one does (the same bit, by design, not by accident): a while
# set always holds pending, so a job waiting for its dependencies is one more queued copy of
# the work, and its release to pending changes nothing the index sees. A reserved job holds
# no unique key (a reserve may not name one): it has no bit, and the index none for it. A
# suspended job is an attempt under way that waits (docs/WAITS.md): it holds its key as a
# running one does (the same bit, again by design; migration 0026 spelled it in).
STATUS_BITS: dict[JobStatus, int] = {
    JobStatus.WAITING: 1,
    JobStatus.PENDING: 1,
    JobStatus.RUNNING: 2,
    JobStatus.SUSPENDED: 2,
    JobStatus.COMPLETED: 4,
    JobStatus.FAILED: 8,
    JobStatus.CANCELLED: 16,
}


# The claim order: the highest priority first, then the oldest, then the lowest id. The
# claim's ORDER BY, its indexes (app/storage/schema/jobs.py) and the sorts in Python are all
# made from this.
CLAIM_ORDER: tuple[tuple[str, bool], ...] = (("priority", True), ("created_at", False),
                                             ("id", False))


def claim_order_key(row: Any) -> tuple[int, ...]:
    """The sort key of a job (or row) in claim order; its columns are all integers."""
    return tuple(-getattr(row, name) if descending else getattr(row, name)
                 for name, descending in CLAIM_ORDER)
