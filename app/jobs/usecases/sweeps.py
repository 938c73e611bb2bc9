"""The sweeps the maintenance loop's leader runs (usecases/maintenance_loop.py), each round:

- running jobs whose lease ran out: a failed attempt whose worker is presumed dead (RESCUE);
  past the attempt's deadline, a timed-out attempt (TIME_OUT); with a cancel requested, the
  end of the job (STOP_UNREPORTED);
- pending and waiting jobs past their expires_at, never claimed: cancelled (EXPIRE).

Claims sweep nothing: a job whose lease ran out is still running, and one past its expiry is
never a candidate (the claim's own statement says so), swept or not. Each sweep takes a
bounded batch in a transaction of its own; a batch that fails is taken again a job at a
time, each in a savepoint, so that one job the database refuses (reported to
MaintenanceHealth: logged, counted, shown in /readyz, and held back for its backoff) holds
back no other."""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable

from app.core.statuses import JobStatus
from app.jobs.domain.history import SERVICE_ACTOR
from app.jobs.domain.models import Backoff, Job
from app.jobs.domain.transitions import Transition
from app.jobs.tx.attempts import end_attempt
from app.jobs.tx.uow import CLAIMABLE, JobsTx, JobsUnitOfWork
from app.jobs.usecases.maintenance import EXPIRY, RESCUE, MaintenanceHealth

# Expired leases, and expired jobs, taken by one transaction at most.
RESCUE_BATCH = 100
EXPIRY_BATCH = 100
# How long one round's sweep of each goes on with full batches (a round is half a second).
SWEEP_SECONDS = 0.1


def _isolated(tx: JobsTx, work: Callable[[], None]) -> Exception | None:
    """`work` in a savepoint; its error (its work undone), or None."""
    try:
        with tx.isolated():
            work()
    except Exception as error:  # a sweep's failure is reported, and stops no other job's
        return error
    return None


def sweep_overdue(uow: JobsUnitOfWork, now: Callable[[], int], backoff: Backoff,
                  health: MaintenanceHealth, rng: random.Random | None = None) -> None:
    """The sweeps: batches of each, each in a transaction of its own, for up to
    SWEEP_SECONDS each; a batch that fails is taken again a job at a time, each in a
    savepoint, so that the jobs the database refuses are reported and held back, and the
    others swept."""

    def rescue(tx: JobsTx) -> tuple[bool, list[tuple[int, Exception]]]:
        at = now()
        held = health.held_back(RESCUE)
        expired = [job for job in tx.jobs.find_expired_leases(at, RESCUE_BATCH + len(held))
                   if job.id not in held]
        full = len(expired) >= RESCUE_BATCH
        if not expired or _isolated(
                tx, lambda: rescue_expired_leases(tx, expired, at, backoff, rng)) is None:
            health.succeeded(RESCUE, [job.id for job in expired])
            return full, []
        return full, _one_by_one(tx, [job.id for job in expired], lambda job_id: (
            rescue_expired_leases(tx, [job for job in expired if job.id == job_id], at,
                                  backoff, rng)), health, RESCUE)

    def expire(tx: JobsTx) -> tuple[bool, list[tuple[int, Exception]]]:
        at = now()
        held = health.held_back(EXPIRY)
        overdue = [job_id for job_id in
                   tx.jobs.find_expired_unclaimed(at, EXPIRY_BATCH + len(held))
                   if job_id not in held]
        full = len(overdue) >= EXPIRY_BATCH
        if not overdue or _isolated(tx, lambda: cancel_expired_jobs(tx, overdue, at)) is None:
            health.succeeded(EXPIRY, overdue)
            return full, []
        return full, _one_by_one(tx, overdue,
                                 lambda job_id: cancel_expired_jobs(tx, [job_id], at),
                                 health, EXPIRY)

    for chore, sweep in ((RESCUE, rescue), (EXPIRY, expire)):
        # Each batch in its own transaction; its failures reported once it has committed
        # what went through. A database that does not answer fails the whole chore,
        # reported. Full batches are followed by more (a crash of many workers leaves
        # many leases), other writers taking their turns between them.
        def run(sweep: Callable[[JobsTx], tuple[bool, list[tuple[int, Exception]]]] = sweep,
                chore: str = chore) -> None:
            deadline = time.monotonic() + SWEEP_SECONDS
            while True:
                full, failures = uow.run(sweep)
                for job_id, error in failures:
                    health.failed(chore, error, [job_id])
                if not full or failures or time.monotonic() >= deadline:
                    return
        health.guarded(chore, run)


def _one_by_one(tx: JobsTx, ids: list[int], work: Callable[[int], None],
                health: MaintenanceHealth, chore: str) -> list[tuple[int, Exception]]:
    """`work` for each id in a savepoint of its own: the ids that failed, with their error;
    those that went through are no longer held back."""
    failed: list[tuple[int, Exception]] = []
    for job_id in ids:
        error = _isolated(tx, functools.partial(work, job_id))
        if error is None:
            health.succeeded(chore, [job_id])
        else:
            failed.append((job_id, error))
    return failed


def rescue_expired_leases(tx: JobsTx, expired: list[Job], now: int, backoff: Backoff,
                          rng: random.Random | None = None) -> None:
    """Each of these running jobs, whose lease ran out, ends its attempt: stopped when its
    cancel was requested, timed out past its deadline, else rescued (pending again at once,
    or failed with no retries left)."""
    for job in expired:
        requested_by = tx.controls.cancel_requested_by(job.id)
        if requested_by is not None:
            _stop_unreported(tx, job, requested_by, now)
            continue
        if job.timed_out_at(now):
            made = Transition.TIME_OUT
            values = made.values(job, now, backoff.delay_us(job.retry_count, rng))
        else:
            made, values = Transition.RESCUE, Transition.RESCUE.values(job, now)
        ended = end_attempt(tx.jobs, made, job, values)
        if ended is not None:
            tx.after_transition(made, [ended], actor=SERVICE_ACTOR, now_us=now,
                                held_by=job.worker_id, before={job.id: job})
            if ended.status == JobStatus.PENDING:
                tx.events[CLAIMABLE] += 1  # wakes the waiting claims, as an enqueue does


def _stop_unreported(tx: JobsTx, job: Job, requested_by: str, now: int) -> None:
    made = Transition.STOP_UNREPORTED
    stopped = tx.jobs.apply_transition(made, job.id, made.values(now_us=now))
    if stopped is not None:
        tx.controls.forget_cancel_requests([job.id])
        tx.after_transition(made, [stopped], actor=SERVICE_ACTOR, now_us=now, held_by=job.worker_id,
                details={job.id: {"cancel_requested_by": requested_by}})


def cancel_expired_jobs(tx: JobsTx, expired: list[int], now: int) -> None:
    """These pending and waiting jobs, past their expires_at, are cancelled."""
    if expired:
        made = Transition.EXPIRE
        cancelled = tx.jobs.apply_transition_to_many(made, expired, made.values(now_us=now))
        tx.after_transition(made, cancelled, actor=SERVICE_ACTOR, now_us=now)
