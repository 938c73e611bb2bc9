"""The job record and the rules of its state machine, free of HTTP and SQL.

    pending --claim--> running --complete--> completed
       ^                  |--fail / lease expired, retries left--> pending (retry_count + 1)
       |                  '--fail / lease expired, none left-----> failed
       '--retry (admin)-- failed | cancelled <--cancel (admin)-- pending
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.core.clock import MICROS
from app.core.statuses import JobStatus

LEASE_EXPIRED_ERROR = "lease expired"

@dataclass(frozen=True, slots=True)
class BoundedCount:
    """A count that stops at a cap, so that its cost does not grow with the backlog: exact
    when not `capped`; when capped, `value` is a lower bound (at most the cap)."""

    value: int
    capped: bool


@dataclass(frozen=True, slots=True)
class PendingSummary:
    """One type's pending jobs: how many, how many of them are scheduled (run_at in the
    future as of counting), and the oldest due run_at (None: none due)."""

    pending: int
    scheduled: int
    oldest_due_run_at: int | None


@dataclass(frozen=True, slots=True)
class Job:
    """One row of the jobs table. Times are microseconds since the epoch."""

    id: int
    type: str
    payload: str  # compact JSON text, as stored
    priority: int
    status: str
    retry_count: int
    max_retries: int
    producer: str
    idempotency_key: str | None
    request_fingerprint: str | None
    run_at: int
    claimed_at: int | None
    worker_id: str | None
    lease_expires_at: int | None
    lease_token: str | None
    result: str | None  # compact JSON text
    error: str | None
    created_at: int
    updated_at: int
    concurrency_key: str | None = None  # flow control's per-key cap (app/types)
    unique_key: str | None = None  # as the producer gave it, or the default digest
    unique_scope: str | None = None  # digest of type, unique key and period bucket
    unique_while: int | None = None  # STATUS_BITS of the statuses in which the key is held
    schedule: str | None = None  # the schedule that enqueued it (app/schedules)
    scheduled_for: int | None = None  # the schedule's slot it was enqueued for

    def is_held_by(self, worker: str, now_us: int, lease_token: str | None) -> bool:
        """True when `worker` holds a live lease on this job (and `lease_token` names it)."""
        return (
            self.status == JobStatus.RUNNING
            and self.worker_id == worker
            and self.lease_expires_at is not None
            and self.lease_expires_at > now_us
            and (lease_token is None or lease_token == self.lease_token)
        )

    def shows_complete(self, worker: str, lease_token: str, result: str | None) -> bool:
        """True when this job is as a complete by `worker` under `lease_token` with `result`
        (compact JSON) left it: a repeat of that report, answered with the job again."""
        return (self.status == JobStatus.COMPLETED and self.worker_id == worker
                and self.lease_token == lease_token and self.result == result)

    def shows_fail(self, worker: str, lease_token: str, error: str,
                   retry_in_us: int | None) -> bool:
        """True when this job is as a fail under `lease_token` with `error` (as stored) and
        `retry_in_us` (when given) left it. A requeued job names no worker any more: the lease
        token, handed to the claimer alone, stands for it."""
        if self.lease_token != lease_token or self.error != error:
            return False
        if self.status == JobStatus.FAILED:
            return self.worker_id == worker
        return (self.status == JobStatus.PENDING and self.claimed_at is None
                and (retry_in_us is None or self.run_at - self.updated_at == retry_in_us))

    @property
    def has_retries_left(self) -> bool:
        return self.retry_count < self.max_retries


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter.

    d = min(base * 2**retry_count, ceiling); the delay is drawn uniformly from [d/2, d].
    """

    base_seconds: float
    max_seconds: float

    def delay_us(self, retry_count: int, rng: random.Random | None = None) -> int:
        # Cap the exponent: 2**64 seconds is already beyond any ceiling.
        ceiling = min(self.base_seconds * 2.0 ** min(retry_count, 64), self.max_seconds)
        draw = (rng or random).uniform(ceiling / 2, ceiling)
        return round(draw * MICROS)


# -- the transitions: where each may start and the columns it writes ------------------------
# Each function below returns the columns one transition sets; the repository applies them
# with a conditional UPDATE on the transition's from-statuses. The values may be plain
# values or SQL expressions (the claim writes its lease token in SQL).


def claimed(*, now_us: Any, worker: Any, lease_expires_at: Any,
            lease_token: Any) -> dict[str, Any]:
    return {"status": JobStatus.RUNNING.value, "claimed_at": now_us, "worker_id": worker,
            "lease_expires_at": lease_expires_at, "lease_token": lease_token,
            "updated_at": now_us}


def lease_extended(*, now_us: int, lease_expires_at: int) -> dict[str, Any]:
    return {"lease_expires_at": lease_expires_at, "updated_at": now_us}


def completed(*, now_us: int, result: str | None) -> dict[str, Any]:
    # The worker and the lease token stay: a repeat of this report is recognised by them.
    return {"status": JobStatus.COMPLETED.value, "result": result, "lease_expires_at": None,
            "updated_at": now_us}


def after_failure(job: Job, now_us: int, error: str, retry_delay_us: int) -> dict[str, Any]:
    """The columns a failed attempt sets: back to pending while retries are left, else failed.

    The lease token stays, so that a repeat of the fail report is recognised.
    """
    if job.has_retries_left:
        return {
            "status": JobStatus.PENDING.value,
            "retry_count": job.retry_count + 1,
            "run_at": now_us + retry_delay_us,
            "claimed_at": None,
            "worker_id": None,
            "lease_expires_at": None,
            "error": error,
            "updated_at": now_us,
        }
    return {
        "status": JobStatus.FAILED.value,
        "lease_expires_at": None,
        "error": error,
        "updated_at": now_us,
    }


def lease_expired(job: Job, now_us: int) -> dict[str, Any]:
    # A failed attempt whose worker is presumed dead: pending again at once (no backoff).
    # No report made it, so no lease token is kept for one to be repeated under.
    return after_failure(job, now_us, LEASE_EXPIRED_ERROR, retry_delay_us=0) | {
        "lease_token": None}


def cancelled(*, now_us: int) -> dict[str, Any]:
    return {"status": JobStatus.CANCELLED.value, "lease_token": None, "updated_at": now_us}


def requeued(*, now_us: int) -> dict[str, Any]:
    """An admin's retry: pending with a fresh retry budget, claimable at once."""
    return {"status": JobStatus.PENDING.value, "retry_count": 0, "run_at": now_us,
            "claimed_at": None, "worker_id": None, "lease_expires_at": None,
            "lease_token": None, "updated_at": now_us}


def replaced(changes: dict[str, Any]) -> dict[str, Any]:
    return changes


@dataclass(frozen=True, slots=True)
class Edge:
    """One edge of the state machine: the statuses it may start from, whether only the
    worker holding a live lease on the job may take it, and what it writes."""

    from_statuses: tuple[JobStatus, ...]
    by_lease_holder: bool
    writes: Callable[..., dict[str, Any]]


class Transition(enum.Enum):
    """Every change of a job's status (or lease), each with its own Edge.

    The repository applies a transition only from its statuses (and, for a worker's report,
    under the worker's live lease); the service takes every transition through it. Work that
    must happen with a transition, in its transaction, belongs beside that call.
    """

    CLAIM = Edge((JobStatus.PENDING,), False, claimed)
    HEARTBEAT = Edge((JobStatus.RUNNING,), True, lease_extended)
    COMPLETE = Edge((JobStatus.RUNNING,), True, completed)
    FAIL = Edge((JobStatus.RUNNING,), True, after_failure)
    RESCUE = Edge((JobStatus.RUNNING,), False, lease_expired)
    CANCEL = Edge((JobStatus.PENDING,), False, cancelled)
    RETRY = Edge((JobStatus.FAILED, JobStatus.CANCELLED), False, requeued)
    # A unique job's debounce: a pending twin takes a new request's payload, priority,
    # max_retries and schedule (app/jobs/uniqueness.py works out the columns).
    REPLACE = Edge((JobStatus.PENDING,), False, replaced)

    @property
    def from_statuses(self) -> tuple[JobStatus, ...]:
        return self.value.from_statuses

    @property
    def by_lease_holder(self) -> bool:
        return self.value.by_lease_holder

    def values(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The columns this transition writes (the arguments of its Edge's function)."""
        return self.value.writes(*args, **kwargs)
