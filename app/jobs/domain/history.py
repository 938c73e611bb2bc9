"""Attempts and events as records, and the names of their outcomes and events. Which of them
each transition of a job writes is app/jobs/domain/transitions.py's table."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Outcome(enum.StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    LEASE_EXPIRED = "lease_expired"
    CANCELLED = "cancelled"  # its cancel was requested while it ran (docs/JOBS.md, Running jobs)
    TIMED_OUT = "timed_out"  # it ran past its job's timeout_seconds
    SUSPENDED = "suspended"  # its holder suspended the job to wait (docs/WAITS.md): no failure


# The outcomes of a stored attempt that is its job's current one: its claim written before
# the row could lose it (running), or its completion too (completed: a completed job is never
# claimed again). Any other outcome ended an attempt the row no longer holds.
CURRENT_OUTCOMES = frozenset({Outcome.RUNNING, Outcome.COMPLETED})


class EventName(enum.StrEnum):
    ENQUEUED = "enqueued"
    CLAIMED = "claimed"
    COMPLETED = "completed"
    FAILED = "failed"  # terminal: no retries left
    RETRY_SCHEDULED = "retry_scheduled"  # a failed attempt that will run again
    LEASE_EXPIRED = "lease_expired"
    CANCELLED = "cancelled"
    RETRIED = "retried"  # an admin's retry
    REPORT_REFUSED = "report_refused"
    DEDUPLICATED = "deduplicated"  # a unique enqueue met this job and got it back
    REPLACED = "replaced"  # a unique enqueue's debounce gave this pending job its request
    DELIVERED = "delivered"  # the dispatcher's POST got an answer (its status in detail)
    READY = "ready"  # a waiting job's last dependency finished: pending
    CANCEL_REQUESTED = "cancel_requested"  # of a running job; its holder is told (docs/JOBS.md)
    CONFIRMED = "confirmed"  # a reserved job made pending (docs/JOBS.md); the detail says by what
    RELEASED = "released"  # a reserved job cancelled (docs/JOBS.md); the detail says by what
    SUSPENDED = "suspended"  # its holder made it wait (docs/WAITS.md); the detail says for what
    RESUMED = "resumed"  # its wait ended (docs/WAITS.md): pending; the detail says by what


# The actor of the service's own acts (a lease rescue).
SERVICE_ACTOR = "queuelog"

@dataclass(frozen=True, slots=True)
class Attempt:
    """One row of job_attempts. Times are microseconds since the epoch."""

    id: int
    job_id: int
    number: int
    worker_id: str
    claimed_at: int
    ended_at: int | None
    outcome: str
    error: str | None
    fingerprint: str | None = None  # its failure group's, when it ended with an error
    worker_instance: str | None = None  # the instance label its claim sent, if any

    @property
    def duration_ms(self) -> int | None:
        """Whole milliseconds from claim to end; None while it runs."""
        return None if self.ended_at is None else (self.ended_at - self.claimed_at) // 1000


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One row of job_events; `detail` is compact JSON text or None."""

    id: int
    job_id: int
    at: int
    event: str
    actor: str
    detail: str | None


@dataclass(frozen=True, slots=True)
class KeyActivity:
    """When a key was last seen (a claim or a report), to about a minute."""

    name: str
    last_seen_at: int
    last_claim_at: int | None
