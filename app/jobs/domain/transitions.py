"""The state machine of a job, as one table: every edge with what it starts from, who may take
it, the columns it writes, and what it leaves on the job's timeline and in the metrics.

    pending --claim--> running --complete--> completed
       ^                  |--fail / lease expired, retries left--> pending (retry_count + 1)
       |                  '--fail / lease expired, none left-----> failed
       '--retry (admin)-- failed | cancelled <--cancel (admin)-- pending | waiting
       (a retry of a job with an unfinished dependency leaves it waiting instead)
    waiting --last dependency finished--> pending
    waiting --a dependency failed or was cancelled (on_dependency_failure cancel)--> cancelled
    pending --hold: an earlier job of its ordered key is unfinished--> waiting
    waiting --its ordered key's turn (and no dependency unfinished)--> pending
    failed --cancel (admin), the failure blocking its ordered key--> cancelled
    running --its cancel requested: the holder reports, or its lease expires--> cancelled
    running --past claimed_at + timeout_seconds (timed out), retries left--> pending | failed
    pending | waiting --past its expires_at, never claimed (expired)--> cancelled
    reserved --confirm (its producer, or its check's answer)--> pending
    reserved --release (its producer, its check's answer, or its deadline)--> cancelled
    running --suspend (its holder: a sleep, an event, a waitpoint token)--> suspended
    suspended --its moment, its event, its token, or its timeout--> pending (resumed)
    suspended --cancel (its producer, an admin)--> cancelled

The repository applies an edge (app/jobs/sql/repository.py), the recorder writes what it records
(app/jobs/timeline/recorder.py), the job service counts its metrics, and app/ops/metrics.py
publishes the counters: all of them read this table, none of them restates it.

"retried" once named three things: an admin's transition, its event, and the counter of
failed attempts sent back to pending. The published names stay; in code each has its own:
- Transition.RETRY, an admin's retry (failed | cancelled → pending), records the event
  EventName.RETRIED ("retried" on the timeline) and counts JobMetric.REQUEUED;
- JobMetric.RETRY_SCHEDULED, published as queuelog_jobs_retried_total, counts failed
  attempts sent back to pending, which record the event EventName.RETRY_SCHEDULED.
"""

from __future__ import annotations

import enum
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.core.clock import to_rfc3339
from app.core.statuses import JobStatus
from app.jobs.domain.history import EventName, Outcome
from app.jobs.domain.models import LEASE_EXPIRED_ERROR, TIMED_OUT_ERROR, Job


class JobMetric(enum.StrEnum):
    """The counters of what happened to jobs, each published as queuelog_jobs_<value>_total.
    The values are the names the docs publish: never rename one. All but two are counted by
    the edges below; an enqueue and a refused report, which move no job, count their own."""

    ENQUEUED = "enqueued"
    CLAIMED = "claimed"
    COMPLETED = "completed"
    FAILED = "failed"
    RETRY_SCHEDULED = "retried"
    RESCUED = "rescued"
    REPORT_REFUSED = "report_refused"
    REQUEUED = "requeued"
    CANCELLED = "cancelled"
    DEPENDENCY_CANCELLED = "dependency_cancelled"
    TIMED_OUT = "timed_out"
    EXPIRED = "expired"
    CONFIRMED = "confirmed"
    RELEASED = "released"
    REMOVED = "removed"
    SUSPENDED = "suspended"
    RESUMED = "resumed"


# The help text of each counter (/metrics).
JOB_METRICS: Mapping[JobMetric, str] = {
    JobMetric.ENQUEUED: "Jobs stored by POST /jobs (idempotent replays not counted).",
    JobMetric.CLAIMED: "Jobs handed to a worker by a claim.",
    JobMetric.COMPLETED: "Jobs a worker reported complete.",
    JobMetric.FAILED: "Attempts that left a job failed for good (no retries left).",
    JobMetric.RETRY_SCHEDULED: "Failed attempts that sent a job back to pending (lease "
                               "expiries included).",
    JobMetric.RESCUED: "Running jobs whose lease expired and that maintenance took back.",
    JobMetric.REPORT_REFUSED: "Heartbeats, completes and fails refused with 409 (the worker "
                              "did not hold the job).",
    JobMetric.REQUEUED: "Failed or cancelled jobs an admin sent back to pending (retry, "
                        "single or bulk).",
    JobMetric.CANCELLED: "Jobs an admin or a producer cancelled (single, bulk, or a "
                         "workflow's cancel; a running job once its cancel took effect).",
    JobMetric.DEPENDENCY_CANCELLED: "Waiting jobs cancelled because a dependency failed or "
                                    "was cancelled (on_dependency_failure cancel).",
    JobMetric.TIMED_OUT: "Attempts that ran past their job's timeout_seconds (each also "
                         "counted as retried or failed).",
    JobMetric.EXPIRED: "Jobs cancelled because their expires_at passed before a claim took "
                       "them.",
    JobMetric.CONFIRMED: "Reserved jobs confirmed (by their producer or their check's "
                         "answer): pending.",
    JobMetric.RELEASED: "Reserved jobs released (by their producer, their check's answer or "
                        "their deadline): cancelled.",
    JobMetric.REMOVED: "Finished jobs deleted with their history, by retention (each type's "
                       "window, docs/OPERATIONS.md) or `queuelog purge`.",
    JobMetric.SUSPENDED: "Running jobs their worker suspended to wait for a moment, an event "
                         "or a waitpoint token (docs/WAITS.md).",
    JobMetric.RESUMED: "Suspended jobs made pending again: by their moment, an event, a "
                       "token or their timeout.",
}


class Guard(enum.Enum):
    """Who may take an edge, besides its from-statuses."""

    ANYONE = "anyone"
    # Only the worker holding a live lease on the job (and, when it names one, under the
    # lease token of the current attempt): the worker's own reports.
    # The repository's conditional UPDATE checks it (Job.is_held_by says the same in Python);
    # `refusal` says why it refused.
    LEASE_HOLDER = "lease_holder"


def refusal(job: Job, worker: str, now_us: int, lease_token: str | None) -> str:
    """Why the lease-holder guard refuses `worker` a report on `job` (the 409's detail and
    the report_refused event's reason); the first rule the job breaks is named."""
    if job.status != JobStatus.RUNNING:
        return f"The job is {job.status}, not running."
    if job.worker_id != worker:
        return "The job is held by another worker."
    if job.lease_expires_at is None or job.lease_expires_at <= now_us:
        if job.timed_out_at(now_us):
            return "The attempt ran past the job's timeout_seconds."
        return "The lease on this job has expired."
    if lease_token is not None and lease_token != job.lease_token:
        return "The lease token names an earlier attempt."
    return "The job changed while this request ran."


# -- the writes: the columns each edge sets ------------------------------------------------
# The repository applies them with a conditional UPDATE on the edge's from-statuses. The
# values may be plain values or SQL expressions (the claim writes its lease token in SQL).


def claimed(*, now_us: Any, worker: Any, lease_expires_at: Any, lease_token: Any,
            instance: Any = None) -> dict[str, Any]:
    # `instance`: the label the worker sent (None: none), shown as reported, never checked.
    return {"status": JobStatus.RUNNING.value, "claimed_at": now_us, "worker_id": worker,
            "worker_instance": instance, "lease_expires_at": lease_expires_at,
            "claimed_until": lease_expires_at, "lease_token": lease_token,
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
            "worker_instance": None,
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


def timed_out(job: Job, now_us: int, retry_delay_us: int) -> dict[str, Any]:
    # A failed attempt like a worker's fail, with the usual backoff; the worker may still be
    # running it, so no lease token is kept for a late report to be taken as a repeat.
    return after_failure(job, now_us, TIMED_OUT_ERROR, retry_delay_us) | {"lease_token": None}


def cancelled(*, now_us: int) -> dict[str, Any]:
    return {"status": JobStatus.CANCELLED.value, "lease_token": None, "updated_at": now_us}


def abandoned(*, now_us: int) -> dict[str, Any]:
    """A running job whose cancel was requested and whose holder never reported: cancelled
    at its lease's expiry. No report made it, so no lease token is kept."""
    return {"status": JobStatus.CANCELLED.value, "lease_expires_at": None, "lease_token": None,
            "updated_at": now_us}


def stopped(*, now_us: int, result: str | None = None,
            error: str | None = None) -> dict[str, Any]:
    """A running job whose cancel was requested, ended by its holder's report: cancelled,
    whatever it reported (its result or error kept, for the record). The lease token stays,
    so that a repeat of the report is recognised."""
    return {"status": JobStatus.CANCELLED.value, "lease_expires_at": None, "result": result,
            "error": error, "updated_at": now_us}


def released(*, now_us: Any, run_at: Any) -> dict[str, Any]:
    """The last dependency finished: pending, claimable from its own run_at or, when that has
    passed, from now (`run_at`, the later of the two). Never from before the release: a claim
    that read its clock before the release committed must not take the job and stamp its
    attempt earlier than the dependency's completion."""
    return {"status": JobStatus.PENDING.value, "run_at": run_at, "updated_at": now_us}


def held(*, now_us: int) -> dict[str, Any]:
    """Behind an earlier job of its ordered key: waiting for its turn (docs/FLOW-CONTROL.md)."""
    return {"status": JobStatus.WAITING.value, "updated_at": now_us}


def confirmed(*, now_us: int) -> dict[str, Any]:
    """A reserved job confirmed: pending, due from its run_at (as its enqueue scheduled it)."""
    return {"status": JobStatus.PENDING.value, "updated_at": now_us}


def requeued(*, now_us: int) -> dict[str, Any]:
    """An admin's retry: pending with a fresh retry budget, claimable at once."""
    return {"status": JobStatus.PENDING.value, "retry_count": 0, "run_at": now_us,
            "claimed_at": None, "worker_id": None, "worker_instance": None,
            "lease_expires_at": None, "lease_token": None, "updated_at": now_us}


def replaced(changes: dict[str, Any]) -> dict[str, Any]:
    return changes


def suspended(*, now_us: int) -> dict[str, Any]:
    """Its holder suspends it (docs/WAITS.md): the attempt ends (outcome suspended, not a
    failure: retry_count stays), the lease and the worker go. Its run_at stays as it was:
    the moment it waits for is its wait's (job_waits.until_at), for a future run_at on a
    million suspended rows would skew PostgreSQL's estimate of the claim's `run_at <= now`
    and with it the claim's plan. The lease token stays, so that a repeat of the suspend is
    recognised; the last resume is forgotten."""
    return {"status": JobStatus.SUSPENDED.value, "claimed_at": None, "worker_id": None,
            "worker_instance": None, "lease_expires_at": None, "resumed": None,
            "updated_at": now_us}


def resumed(*, now_us: Any, resumed: Any) -> dict[str, Any]:
    """Its wait is over: pending and claimable at once; `resumed` (compact JSON: by what,
    with what data, when) rides on the row to every claim until it suspends again."""
    return {"status": JobStatus.PENDING.value, "run_at": now_us, "resumed": resumed,
            "lease_token": None, "updated_at": now_us}


# -- what an edge records: the event's detail ----------------------------------------------
# Each takes the job as the edge left it and the worker whose lease a rescue took back; the
# values that are None are left out of the stored detail.

Detail = Callable[[Job, str | None], Mapping[str, Any]]


def _no_detail(_job: Job, _held_by: str | None) -> Mapping[str, Any]:
    return {}


def _lease_detail(job: Job, _held_by: str | None) -> Mapping[str, Any]:
    # The lease its claim granted, kept on the row as heartbeats move lease_expires_at on.
    return {"lease_expires_at": to_rfc3339(job.claimed_until)}


def _error_detail(job: Job, _held_by: str | None) -> Mapping[str, Any]:
    return {"error": job.error}


def _retry_detail(job: Job, _held_by: str | None) -> Mapping[str, Any]:
    return {"error": job.error, "run_at": to_rfc3339(job.run_at)}


def _expired_detail(job: Job, _held_by: str | None) -> Mapping[str, Any]:
    return {"reason": "expired", "expires_at": to_rfc3339(job.expires_at)}


def _resumed_detail(job: Job, _held_by: str | None) -> Mapping[str, Any]:
    return {"by": json.loads(job.resumed)["by"] if job.resumed else None}


def _rescue_detail(job: Job, held_by: str | None) -> Mapping[str, Any]:
    return {"worker": held_by, "status": job.status,
            "run_at": to_rfc3339(job.run_at) if job.status == JobStatus.PENDING else None}


@dataclass(frozen=True, slots=True)
class Marks:
    """What one job's move along an edge records: the event on its timeline (None: none), that
    event's detail, and the metrics it counts (one each)."""

    event: EventName | None
    metrics: tuple[JobMetric, ...] = ()
    detail: Detail = _no_detail


@dataclass(frozen=True, slots=True)
class Edge:
    """One edge of the state machine.

    `marks` is what a job the edge left records; `marks_if_pending`, when given, replaces it
    for a job the edge sent back to pending (a failed attempt with retries left). An edge that
    `opens_attempt` starts a row of job_attempts; one with `closes_attempt` ends the job's
    running attempt with that outcome.
    """

    from_statuses: tuple[JobStatus, ...]
    guard: Guard
    writes: Callable[..., dict[str, Any]]
    marks: Marks
    marks_if_pending: Marks | None = None
    opens_attempt: bool = False
    closes_attempt: Outcome | None = None

    def marks_of(self, job: Job) -> Marks:
        if self.marks_if_pending is not None and job.status == JobStatus.PENDING:
            return self.marks_if_pending
        return self.marks


class Transition(enum.Enum):
    """Every change of a job's status (or lease), each with its own Edge.

    The repository applies a transition only from its statuses (and, for a worker's report,
    under the worker's live lease); the service takes every transition through it. Work that
    must happen with a transition, in its transaction, belongs beside that call.
    """

    CLAIM = Edge((JobStatus.PENDING,), Guard.ANYONE, claimed,
                 Marks(EventName.CLAIMED, (JobMetric.CLAIMED,), _lease_detail),
                 opens_attempt=True)
    HEARTBEAT = Edge((JobStatus.RUNNING,), Guard.LEASE_HOLDER, lease_extended, Marks(None))
    COMPLETE = Edge((JobStatus.RUNNING,), Guard.LEASE_HOLDER, completed,
                    Marks(EventName.COMPLETED, (JobMetric.COMPLETED,)),
                    closes_attempt=Outcome.COMPLETED)
    FAIL = Edge((JobStatus.RUNNING,), Guard.LEASE_HOLDER, after_failure,
                Marks(EventName.FAILED, (JobMetric.FAILED,), _error_detail),
                marks_if_pending=Marks(EventName.RETRY_SCHEDULED,
                                       (JobMetric.RETRY_SCHEDULED,), _retry_detail),
                closes_attempt=Outcome.FAILED)
    RESCUE = Edge((JobStatus.RUNNING,), Guard.ANYONE, lease_expired,
                  Marks(EventName.LEASE_EXPIRED, (JobMetric.RESCUED, JobMetric.FAILED),
                        _rescue_detail),
                  marks_if_pending=Marks(EventName.LEASE_EXPIRED,
                                         (JobMetric.RESCUED, JobMetric.RETRY_SCHEDULED),
                                         _rescue_detail),
                  closes_attempt=Outcome.LEASE_EXPIRED)
    CANCEL = Edge((JobStatus.PENDING, JobStatus.WAITING, JobStatus.SUSPENDED), Guard.ANYONE,
                  cancelled, Marks(EventName.CANCELLED, (JobMetric.CANCELLED,)))
    # Dependencies (app/jobs/tx/dependencies.py): the last one finished, or one failed or was
    # cancelled under on_dependency_failure cancel (the detail names it).
    RELEASE = Edge((JobStatus.WAITING,), Guard.ANYONE, released, Marks(EventName.READY))
    DEPENDENCY_CANCEL = Edge((JobStatus.WAITING,), Guard.ANYONE, cancelled,
                             Marks(EventName.CANCELLED, (JobMetric.DEPENDENCY_CANCELLED,)))
    # Ordered keys (app/jobs/tx/key_rules.py): a job whose key's turn another job holds waits,
    # without an event of its own (the enqueue or retry that made it says so); its turn
    # releases it (RELEASE). A failure that blocks its key may be cancelled by an admin.
    HOLD = Edge((JobStatus.PENDING,), Guard.ANYONE, held, Marks(None))
    CANCEL_BLOCKING = Edge((JobStatus.FAILED,), Guard.ANYONE, cancelled,
                           Marks(EventName.CANCELLED, (JobMetric.CANCELLED,)))
    # Running jobs under control (docs/JOBS.md). A running job's cancel is a request (its
    # record is app/jobs/sql/control_repository.py's): its holder's report, or its lease's
    # expiry, ends it cancelled (the event names who asked). An attempt past its
    # timeout_seconds is over, a failed attempt retried per the budget; a job still
    # unclaimed past its expires_at is cancelled.
    STOP = Edge((JobStatus.RUNNING,), Guard.LEASE_HOLDER, stopped,
                Marks(EventName.CANCELLED, (JobMetric.CANCELLED,)),
                closes_attempt=Outcome.CANCELLED)
    STOP_UNREPORTED = Edge((JobStatus.RUNNING,), Guard.ANYONE, abandoned,
                           Marks(EventName.CANCELLED, (JobMetric.CANCELLED,), _rescue_detail),
                           closes_attempt=Outcome.CANCELLED)
    TIME_OUT = Edge((JobStatus.RUNNING,), Guard.ANYONE, timed_out,
                    Marks(EventName.FAILED, (JobMetric.TIMED_OUT, JobMetric.FAILED),
                          _error_detail),
                    marks_if_pending=Marks(EventName.RETRY_SCHEDULED,
                                           (JobMetric.TIMED_OUT, JobMetric.RETRY_SCHEDULED),
                                           _retry_detail),
                    closes_attempt=Outcome.TIMED_OUT)
    EXPIRE = Edge((JobStatus.PENDING, JobStatus.WAITING), Guard.ANYONE, cancelled,
                  Marks(EventName.CANCELLED, (JobMetric.EXPIRED,), _expired_detail))
    # Reserved jobs (docs/JOBS.md; app/jobs/usecases/reservations.py): the first of a producer's
    # confirm or release, its check's answer and its deadline decides; the event says which.
    CONFIRM = Edge((JobStatus.RESERVED,), Guard.ANYONE, confirmed,
                   Marks(EventName.CONFIRMED, (JobMetric.CONFIRMED,)))
    RELEASE_RESERVATION = Edge((JobStatus.RESERVED,), Guard.ANYONE, cancelled,
                               Marks(EventName.RELEASED, (JobMetric.RELEASED,)))
    RETRY = Edge((JobStatus.FAILED, JobStatus.CANCELLED), Guard.ANYONE, requeued,
                 Marks(EventName.RETRIED, (JobMetric.REQUEUED,)))
    # A unique job's debounce: a pending twin takes a new request's payload, priority,
    # max_retries and schedule (app/jobs/domain/uniqueness.py works out the columns).
    REPLACE = Edge((JobStatus.PENDING,), Guard.ANYONE, replaced, Marks(EventName.REPLACED))
    # Waits (docs/WAITS.md; app/jobs/usecases/waits.py): the holder suspends its job, which
    # then holds no lease and no slot; whichever of its moment, event, token or timeout comes
    # first resumes it, once. The suspended event's detail (what it waits for) is the
    # suspend's own.
    SUSPEND = Edge((JobStatus.RUNNING,), Guard.LEASE_HOLDER, suspended,
                   Marks(EventName.SUSPENDED, (JobMetric.SUSPENDED,)),
                   closes_attempt=Outcome.SUSPENDED)
    RESUME = Edge((JobStatus.SUSPENDED,), Guard.ANYONE, resumed,
                  Marks(EventName.RESUMED, (JobMetric.RESUMED,), _resumed_detail))

    @property
    def from_statuses(self) -> tuple[JobStatus, ...]:
        return self.value.from_statuses

    @property
    def by_lease_holder(self) -> bool:
        return self.value.guard is Guard.LEASE_HOLDER

    def values(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The columns this transition writes (the arguments of its Edge's function)."""
        return self.value.writes(*args, **kwargs)

    def marks_of(self, job: Job) -> Marks:
        """What this transition, which left `job` as it is, records for it."""
        return self.value.marks_of(job)

    def count_metrics(self, jobs: Iterable[Job], into: Counter[str]) -> None:
        """Add to `into` (a transaction's events), by name, the metrics this transition
        counts for `jobs`, which it left as they are."""
        for job in jobs:
            for metric in self.value.marks_of(job).metrics:
                into[metric.value] += 1
