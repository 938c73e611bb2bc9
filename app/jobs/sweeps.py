"""What a claim sweeps before it chooses, so that a job overdue in any way is settled by the
next claim at the latest, on every claim path (a worker's, a claim-many, a long poll's, the
dispatcher's push):

- running jobs whose lease ran out: a failed attempt whose worker is presumed dead (RESCUE);
  past the attempt's deadline, a timed-out attempt (TIME_OUT); with a cancel requested, the
  end of the job (STOP_UNREPORTED);
- pending and waiting jobs past their expires_at, never claimed: cancelled (EXPIRE).

Each sweep takes a bounded batch, so one claim's transaction stays short; the next claims take
the rest (a claim never hands out an expired job meanwhile: its candidates say so).

A sweep is maintenance, not the claim's own work: once its probe found something, the work
runs in a savepoint, and a failure (a job whose end the database refuses, say) is undone,
reported to MaintenanceHealth (logged, counted, shown in /readyz) and held back for its
backoff, while the claim goes on and hands out what it may: a job whose lease ran out is
still running and one past its expiry is never a candidate, swept or not. The ticker runs
the same sweeps in transactions of their own (`sweep_alone`), a job at a time once a batch
fails, so that one job the database refuses holds back no other."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable

from app.jobs.attempts import end_attempt
from app.jobs.maintenance import EXPIRY, RESCUE, MaintenanceHealth
from app.jobs.models import Backoff, Job
from app.jobs.timeline.models import SERVICE_ACTOR
from app.jobs.transitions import Transition
from app.jobs.uow import JobsTx, JobsUnitOfWork

# Expired leases, and expired jobs, taken by one claim at most.
RESCUE_BATCH = 100
EXPIRY_BATCH = 100


def sweep_before_claim(tx: JobsTx, now: int, backoff: Backoff, health: MaintenanceHealth,
                       rng: random.Random | None = None) -> None:
    """The claim's sweeps, each isolated from the claim (see the module's docstring): a
    batch that fails is undone and its jobs held back for their backoff (the ticker finds
    which of them fails)."""
    # Read past the jobs held back, so that they never crowd the others out of a batch.
    held = health.held_back(RESCUE)
    expired = [job for job in tx.jobs.find_expired_leases(now, RESCUE_BATCH + len(held))
               if job.id not in held]
    if expired:
        ids = [job.id for job in expired]
        _report(health, RESCUE, ids, _isolated(
            tx, lambda: rescue_expired_leases(tx, expired, now, backoff, rng)))
    held = health.held_back(EXPIRY)
    overdue = [job_id for job_id in tx.jobs.find_expired_unclaimed(now, EXPIRY_BATCH + len(held))
               if job_id not in held]
    if overdue:
        _report(health, EXPIRY, overdue,
                _isolated(tx, lambda: cancel_expired_jobs(tx, overdue, now)))


def _isolated(tx: JobsTx, work: Callable[[], None]) -> Exception | None:
    """`work` in a savepoint; its error (its work undone), or None."""
    try:
        with tx.isolated():
            work()
    except Exception as error:  # a sweep's failure is maintenance's, never the claim's
        return error
    return None


def _report(health: MaintenanceHealth, chore: str, ids: list[int],
            error: Exception | None) -> None:
    if error is None:
        health.succeeded(chore, ids)
    else:
        health.failed(chore, error, ids)


def sweep_alone(uow: JobsUnitOfWork, now: Callable[[], int], backoff: Backoff,
                health: MaintenanceHealth, rng: random.Random | None = None) -> None:
    """The ticker's sweeps: a batch of each, in a transaction of its own; a batch that fails
    is taken again a job at a time, each in a savepoint, so that the jobs the database
    refuses are reported and held back, and the others swept."""

    def rescue(tx: JobsTx) -> list[tuple[int, Exception]]:
        at = now()
        held = health.held_back(RESCUE, suspects=False)
        expired = [job for job in tx.jobs.find_expired_leases(at, RESCUE_BATCH + len(held))
                   if job.id not in held]
        if not expired or _isolated(
                tx, lambda: rescue_expired_leases(tx, expired, at, backoff, rng)) is None:
            health.succeeded(RESCUE, [job.id for job in expired])
            return []
        return _one_by_one(tx, [job.id for job in expired], lambda job_id: (
            rescue_expired_leases(tx, [job for job in expired if job.id == job_id], at,
                                  backoff, rng)), health, RESCUE)

    def expire(tx: JobsTx) -> list[tuple[int, Exception]]:
        at = now()
        held = health.held_back(EXPIRY, suspects=False)
        overdue = [job_id for job_id in
                   tx.jobs.find_expired_unclaimed(at, EXPIRY_BATCH + len(held))
                   if job_id not in held]
        if not overdue or _isolated(tx, lambda: cancel_expired_jobs(tx, overdue, at)) is None:
            health.succeeded(EXPIRY, overdue)
            return []
        return _one_by_one(tx, overdue, lambda job_id: cancel_expired_jobs(tx, [job_id], at),
                           health, EXPIRY)

    for chore, sweep in ((RESCUE, rescue), (EXPIRY, expire)):
        # Each in its own transaction; the failures reported once it has committed what
        # went through. A database that does not answer fails the whole chore, reported.
        def run(sweep: Callable[[JobsTx], list[tuple[int, Exception]]] = sweep,
                chore: str = chore) -> None:
            for job_id, error in uow.run(sweep):
                health.failed(chore, error, [job_id], alone=True)
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
            tx.made(made, [ended], actor=SERVICE_ACTOR, now_us=now, held_by=job.worker_id,
                    before={job.id: job})


def _stop_unreported(tx: JobsTx, job: Job, requested_by: str, now: int) -> None:
    made = Transition.STOP_UNREPORTED
    stopped = tx.jobs.apply_transition(made, job.id, made.values(now_us=now))
    if stopped is not None:
        tx.controls.forget_cancel_requests([job.id])
        tx.made(made, [stopped], actor=SERVICE_ACTOR, now_us=now, held_by=job.worker_id,
                details={job.id: {"cancel_requested_by": requested_by}})


def cancel_expired_jobs(tx: JobsTx, expired: list[int], now: int) -> None:
    """These pending and waiting jobs, past their expires_at, are cancelled."""
    if expired:
        made = Transition.EXPIRE
        cancelled = tx.jobs.apply_transition_to_many(made, expired, made.values(now_us=now))
        tx.made(made, cancelled, actor=SERVICE_ACTOR, now_us=now)
