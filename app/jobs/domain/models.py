"""The job record and the values its rules work with, free of HTTP and SQL. The state machine
itself, its edges and what each writes and records, is app/jobs/domain/transitions.py."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core.clock import MICROS
from app.core.statuses import JobStatus
from app.core.tracecontext import Trace

LEASE_EXPIRED_ERROR = "lease expired"
TIMED_OUT_ERROR = "timed out"

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
    fair_round: int | None = None  # a fair type's pending job's round (app/jobs/tx/key_rules.py)
    timeout_seconds: int | None = None  # each attempt's limit from its claim (docs/JOBS.md)
    expires_at: int | None = None  # not claimed by then, it is not run (docs/JOBS.md, Running jobs)
    claimed_until: int | None = None  # the lease its current attempt's claim granted
    # 1: a stored dependency edge waits on it, so its end has dependents to settle; None: no
    # job depends on it (app/jobs/tx/dependencies.py).
    has_dependents: int | None = None
    # How its last wait ended (docs/WAITS.md), compact JSON {"by", "data", "at"}: set by a
    # resume, shown to every claim until the job suspends again; None: never resumed.
    resumed: str | None = None
    # The instance label its current attempt's claim sent (host and pid, or the operator's),
    # shown as reported; ownership is worker_id's and the lease token's, never this.
    worker_instance: str | None = None

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

    def shows_stop(self, worker: str, lease_token: str, *, result: str | None = None,
                   error: str | None = None) -> bool:
        """True when this job is as a report by `worker` under `lease_token` left it while
        its cancel was requested (cancelled, with the complete's `result` or the fail's
        `error` as stored): a repeat of that report, answered again."""
        return (self.status == JobStatus.CANCELLED and self.worker_id == worker
                and self.lease_token == lease_token and self.result == result
                and self.error == error)

    @property
    def has_retries_left(self) -> bool:
        return self.retry_count < self.max_retries

    @property
    def attempt_deadline(self) -> int | None:
        """When the running attempt is over (claimed_at + timeout_seconds); None: never."""
        if self.timeout_seconds is None or self.claimed_at is None:
            return None
        return self.claimed_at + self.timeout_seconds * MICROS

    def timed_out_at(self, now_us: int) -> bool:
        """True when the running attempt has passed its deadline by `now_us`."""
        deadline = self.attempt_deadline
        return deadline is not None and now_us >= deadline


@dataclass(frozen=True, slots=True)
class JobControls:
    """What a running job's holder and its readers share beside the job row (docs/JOBS.md):
    a cancel request (when and by whom), the last progress reported, and whether a
    checkpoint is saved. Times are microseconds since the epoch."""

    job_id: int
    cancel_requested_at: int | None = None
    cancel_requested_by: str | None = None
    progress_done: int | None = None
    progress_total: int | None = None
    progress_message: str | None = None
    progress_at: int | None = None

    @property
    def cancel_requested(self) -> bool:
        return self.cancel_requested_at is not None


@dataclass(frozen=True, slots=True)
class JobDependencies:
    """What a job waits for (docs/WORKFLOWS.md): its dependencies in depends_on order, how many of
    them have not finished, and whether a failed or cancelled one cancels it."""

    depends_on: tuple[int, ...]
    unfinished: int
    cancel_on_failure: bool


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter.

    d = min(base * 2**retry_count, ceiling); the delay is drawn uniformly from [d/2, d].
    """

    base_seconds: float
    max_seconds: float

    def delay_us(self, retry_count: int, rng: random.Random | None = None) -> int:
        return self.delay_at(retry_count, (rng or random).random())

    def delay_at(self, retry_count: int, draw: float) -> int:
        """The delay after `retry_count` retries for a draw in [0, 1) of the jitter: the same
        draw gives every retry count's delay at the same place in its range (a fail drawn
        before it knows the job's count). As delay_us with a generator whose next random()
        is `draw` (random.uniform draws so)."""
        # Cap the exponent: 2**64 seconds is already beyond any ceiling.
        ceiling = min(self.base_seconds * 2.0 ** min(retry_count, 64), self.max_seconds)
        return round((ceiling / 2 + (ceiling - ceiling / 2) * draw) * MICROS)


@dataclass(frozen=True, slots=True)
class JobExtras:
    """What a job's representation shows beside its row, by job id, for a page of jobs: what
    each waits for (its dependencies, and a suspended job's wait), its controls, its tags and
    its trace context (a job without one is left
    out of that mapping). Read together, in one read (app/jobs/usecases/reads.py)."""

    dependencies: Mapping[int, JobDependencies]
    controls: Mapping[int, JobControls]
    tags: Mapping[int, tuple[str, ...]]
    traces: Mapping[int, Trace]
    # What each suspended job waits for, as shown (docs/WAITS.md).
    waiting_for: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
