"""What a claim sweeps before it chooses, so that a job overdue in any way is settled by the
next claim at the latest, on every claim path (a worker's, a claim-many, a long poll's, the
dispatcher's push):

- running jobs whose lease ran out: a failed attempt whose worker is presumed dead (RESCUE);
  past the attempt's deadline, a timed-out attempt (TIME_OUT); with a cancel requested, the
  end of the job (STOP_UNREPORTED);
- pending and waiting jobs past their expires_at, never claimed: cancelled (EXPIRE).

Each sweep takes a bounded batch, so one claim's transaction stays short; the next claims take
the rest (a claim never hands out an expired job meanwhile: its candidates say so)."""

from __future__ import annotations

import random

from app.jobs.attempts import end_attempt
from app.jobs.models import Backoff, Job
from app.jobs.timeline.models import SERVICE_ACTOR
from app.jobs.transitions import Transition
from app.jobs.uow import JobsTx

# Expired leases, and expired jobs, taken by one claim at most.
RESCUE_BATCH = 100
EXPIRY_BATCH = 100


def rescue_expired_leases(tx: JobsTx, now: int, backoff: Backoff,
                          rng: random.Random | None = None) -> None:
    """Every running job whose lease ran out (up to RESCUE_BATCH) ends its attempt: stopped
    when its cancel was requested, timed out past its deadline, else rescued (pending again
    at once, or failed with no retries left)."""
    for job in tx.jobs.find_expired_leases(now, RESCUE_BATCH):
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
            tx.made(made, [ended], actor=SERVICE_ACTOR, now_us=now, held_by=job.worker_id)


def _stop_unreported(tx: JobsTx, job: Job, requested_by: str, now: int) -> None:
    made = Transition.STOP_UNREPORTED
    stopped = tx.jobs.apply_transition(made, job.id, made.values(now_us=now))
    if stopped is not None:
        tx.controls.forget_cancel_requests([job.id])
        tx.made(made, [stopped], actor=SERVICE_ACTOR, now_us=now, held_by=job.worker_id,
                details={job.id: {"cancel_requested_by": requested_by}})


def cancel_expired_jobs(tx: JobsTx, now: int) -> None:
    """Pending and waiting jobs past their expires_at (up to EXPIRY_BATCH) are cancelled."""
    expired = tx.jobs.find_expired_unclaimed(now, EXPIRY_BATCH)
    if expired:
        made = Transition.EXPIRE
        cancelled = tx.jobs.apply_transition_to_many(made, expired, made.values(now_us=now))
        tx.made(made, cancelled, actor=SERVICE_ACTOR, now_us=now)
