"""The job record and the rules of its state machine, free of HTTP and SQL.

    pending --claim--> running --complete--> completed
       ^                  |--fail / lease expired, retries left--> pending (retry_count + 1)
       |                  '--fail / lease expired, none left-----> failed
       '--retry (admin)-- failed | cancelled <--cancel (admin)-- pending
"""

from __future__ import annotations

import enum
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.clock import MICROS


class JobStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATUSES = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})

# Each status's bit in a job's `unique_while` mask (the statuses in which it holds its unique
# key). Stored, and spelled into the unique index's predicate: never renumber.
STATUS_BITS: dict[JobStatus, int] = {
    JobStatus.PENDING: 1,
    JobStatus.RUNNING: 2,
    JobStatus.COMPLETED: 4,
    JobStatus.FAILED: 8,
    JobStatus.CANCELLED: 16,
}


class Transition(enum.Enum):
    """Each transition and the one status it may start from (or several, for retry)."""

    CLAIM = (JobStatus.PENDING,)
    HEARTBEAT = (JobStatus.RUNNING,)
    COMPLETE = (JobStatus.RUNNING,)
    FAIL = (JobStatus.RUNNING,)
    CANCEL = (JobStatus.PENDING,)
    RETRY = (JobStatus.FAILED, JobStatus.CANCELLED)

    @property
    def from_statuses(self) -> tuple[JobStatus, ...]:
        return self.value


class Priority(enum.IntEnum):
    """Stored as integers with gaps, so a level can be added without renumbering."""

    LOW = 0
    MEDIUM = 10
    HIGH = 20
    CRITICAL = 30

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def from_label(cls, label: str) -> Priority:
        try:
            return cls[label.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown priority {label!r}") from None


PRIORITY_LABELS = tuple(p.label for p in Priority)

LEASE_EXPIRED_ERROR = "lease expired"


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
    unique_key: str | None  # as the producer gave it, or the default digest
    unique_scope: str | None  # digest of type, unique key and period bucket
    unique_while: int | None  # STATUS_BITS of the statuses in which the key is held

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Job:
        return cls(**row)

    def is_held_by(self, worker: str, now_us: int, lease_token: str | None) -> bool:
        """True when `worker` holds a live lease on this job (and `lease_token` names it)."""
        return (
            self.status == JobStatus.RUNNING
            and self.worker_id == worker
            and self.lease_expires_at is not None
            and self.lease_expires_at > now_us
            and (lease_token is None or lease_token == self.lease_token)
        )

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


def after_failure(
    job: Job, now_us: int, error: str, retry_delay_us: int
) -> dict[str, Any]:
    """The columns a failed attempt sets: back to pending while retries are left, else failed."""
    if job.has_retries_left:
        return {
            "status": JobStatus.PENDING,
            "retry_count": job.retry_count + 1,
            "run_at": now_us + retry_delay_us,
            "claimed_at": None,
            "worker_id": None,
            "lease_expires_at": None,
            "lease_token": None,
            "error": error,
            "updated_at": now_us,
        }
    return {
        "status": JobStatus.FAILED,
        "lease_expires_at": None,
        "lease_token": None,
        "error": error,
        "updated_at": now_us,
    }
