"""The job use cases behind one name: JobService composes the modules that hold them
(enqueue, reads, reports, admin, retention) so that routes, schedules, dispatch, the
dashboard and history call `service.enqueue(...)` and the like; and, for now, the claim.

Nothing here sees the HTTP request: handlers pass plain values and the authenticated caller.
"""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass

from app.core.callers import Caller
from app.core.clock import MICROS, Clock
from app.history.models import SERVICE_ACTOR
from app.jobs.admin import Administration
from app.jobs.attempts import end_attempt
from app.jobs.enqueue import Enqueuing
from app.jobs.flow import ClaimLimits, FlowPolicy, LimitReached
from app.jobs.intake import IntakeRules, require_configured_types
from app.jobs.models import Job, Transition
from app.jobs.reads import JobReads
from app.jobs.reports import WorkerReports
from app.jobs.retention import Retention
from app.jobs.settings import QueueSettings
from app.jobs.uow import JobsTx, JobsUnitOfWork
from app.jobs.waiting import POLL_SECONDS, JobSignal, WaitAnswer, WaitingBudget

# Expired leases rescued by one claim at most, so one claim's transaction stays short.
RESCUE_BATCH = 100


@dataclass(frozen=True)
class Claimed:
    job: Job
    lease_token: str


class JobService:
    """`finished` is the unit of work's FINISHED signal (app/__init__.py wires both); `signal`
    is told when jobs may have become claimable, and wakes the claims waiting here."""

    def __init__(self, uow: JobsUnitOfWork, clock: Clock, settings: QueueSettings,
                 rng: random.Random | None = None, flow: FlowPolicy | None = None,
                 finished: JobSignal | None = None) -> None:
        self.uow = uow
        # None: no flow control at all (services built without the type settings).
        self.flow = flow
        self.clock = clock
        self.settings = settings
        self.signal = JobSignal()
        # Claims waiting for work, and reads waiting for a job to finish, each have a budget.
        self._claim_waits = WaitingBudget(settings.max_waiting_claims)
        intake = IntakeRules(settings.job_types, settings.max_payload_bytes)
        enqueuing = Enqueuing(uow, clock, intake, self.signal)
        reads = JobReads(uow, clock, finished or JobSignal(),
                         WaitingBudget(settings.max_waiting_requests))
        reports = WorkerReports(uow, clock, settings, rng or random.SystemRandom())
        admin = Administration(uow, clock, settings.bulk_batch_size)
        # The use cases, each from the module that holds it.
        self.enqueue = enqueuing.enqueue
        self.enqueue_many = enqueuing.enqueue_many
        self.enqueue_in = enqueuing.enqueue_in
        self.enqueue_slots_in = enqueuing.enqueue_slots_in
        self.write = enqueuing.write
        self.get_job = reads.get_job
        self.await_job = reads.await_job
        self.list_jobs = reads.list_jobs
        self.running_by_worker = reads.running_by_worker
        self.heartbeat = reports.heartbeat
        self.complete = reports.complete
        self.complete_many = reports.complete_many
        self.fail = reports.fail
        self.cancel = admin.cancel
        self.retry = admin.retry
        self.cancel_many = admin.cancel_many
        self.retry_many = admin.retry_many
        self.purge = Retention(uow, clock, settings.bulk_batch_size).purge

    @property
    def max_payload_bytes(self) -> int:
        """The largest payload, or result, a job may carry (QUEUELOG_MAX_PAYLOAD_BYTES)."""
        return self.settings.max_payload_bytes

    # -- workers --------------------------------------------------------------------------

    def claim(self, caller: Caller, *, types: Iterable[str] | None = None,
              lease_seconds: int | None = None, limit: int = 1,
              push: bool = False) -> list[Claimed]:
        """Claim up to `limit` jobs for the caller, most urgent first; [] when none is due.
        A worker's claim takes pulled types alone; the dispatcher's (`push`) push types
        alone (flow control's limits decide), under the same limits.

        Expired leases are rescued in the same transaction first, so a job whose worker died
        is claimable again by this very claim.
        """
        return self.await_claim(caller, types=types, lease_seconds=lease_seconds,
                                limit=limit, push=push).value

    def await_claim(self, caller: Caller, *, types: Iterable[str] | None = None,
                    lease_seconds: int | None = None, limit: int = 1,
                    wait_seconds: float = 0, push: bool = False) -> WaitAnswer[list[Claimed]]:
        """As claim, waiting up to `wait_seconds` for a job when none is due now (no
        connection is held while waiting). Past the process's budget of waiting claims it
        answers at once, marked `not_waited`."""
        if types is not None:
            # Checked before anything else: a misspelt type would otherwise find nothing
            # forever, and a waiting claim only ever probes configured types.
            types = list(types)
            require_configured_types(self.settings.job_types, types, "types")
        wanted = self._claimable_types(caller, types)
        if wanted is not None and not wanted:
            # Nothing this key may ever take here: waiting would not change that.
            return WaitAnswer([])
        seen = self.signal.generation
        claimed = self._claim_now(caller, wanted, lease_seconds, limit, push)
        if claimed or wait_seconds <= 0:
            return WaitAnswer(claimed)
        with self._claim_waits.slot() as granted:
            deadline = time.monotonic() + wait_seconds
            while (granted and not claimed
                   and self._wait_for_work(wanted, seen, deadline, push)):
                seen = self.signal.generation
                claimed = self._claim_now(caller, wanted, lease_seconds, limit, push)
        return WaitAnswer(claimed, not_waited=not granted)

    def _claim_now(self, caller: Caller, wanted: frozenset[str] | None,
                   lease_seconds: int | None, limit: int, push: bool) -> list[Claimed]:
        lease_us = (lease_seconds or self.settings.lease_seconds) * MICROS
        nonce = secrets.token_hex(16)
        # Each attempt is a moment of its own: a key revoked since the request began (while
        # this claim waited for work, say) must take nothing, so every attempt's transaction
        # confirms the key again rather than trusting an earlier check.
        caller.live_checked = False

        flow = self.flow

        def claim_in(tx: JobsTx, *,
                     optimistic: bool) -> tuple[list[Job], ClaimLimits | None, int]:
            repo, conn = tx.jobs_for(caller), tx.conn
            now = self.clock.now_us()
            self._rescue_expired_leases(tx, now)
            # None: no limit concerns this claim, which then runs as without flow control.
            limits = None if flow is None else flow.limits(conn, wanted, now,
                                                           lock=not optimistic, push=push)
            if not optimistic:
                # The policy took its types' rows, waiting for them if another claim held
                # them (where writers run concurrently): the claim holds what it needs now.
                now = self.clock.now_us()
            if push and limits is None:
                return [], None, now  # no flow control to tell push types apart: never guess
            restricted = limits is not None and limits.restricts(limit)
            jobs = repo.claim_next_jobs(
                now_us=now, worker=caller.name, lease_expires_at=now + lease_us,
                nonce=nonce, limit=limit,
                types=self._types_of(wanted) if restricted else wanted,
                limits=limits if restricted else None,
            )
            if (flow is not None and limits is not None
                    and flow.settle(conn, limits, jobs, now, check=optimistic)):
                # Checked under its types' rows, which it may have waited for: its jobs are
                # claimed, and leased, from the moment it holds them.
                held_at = self.clock.now_us()
                if held_at != now:
                    now = held_at
                    jobs = repo.restamp_claimed(jobs, now_us=now,
                                                lease_expires_at=now + lease_us)
            # Recorded once the stamps are final, so the timeline reads as they do.
            tx.made(Transition.CLAIM, jobs, actor=caller.name, now_us=now)
            tx.timeline.seen(caller.name, now, claimed=True)
            return jobs, limits, now

        # First on limits read without locks, checked under them just before the commit
        # (where writers run concurrently; see FlowControl.settle); when a limit was reached
        # meanwhile, again on limits read under the locks, which cannot miss.
        try:
            jobs, limits, now = self.uow.run(lambda tx: claim_in(tx, optimistic=True))
        except LimitReached:
            jobs, limits, now = self.uow.run(lambda tx: claim_in(tx, optimistic=False))
        if flow is not None:
            # Outside the write lock: what only metrics and last_claim_at need.
            flow.claimed(limits, jobs, now)
        return [Claimed(job, job.lease_token or "") for job in jobs]

    def _types_of(self, wanted: frozenset[str] | None) -> frozenset[str]:
        """The types a claim of `wanted` ones (None: any) reads under flow control."""
        return self.settings.job_types if wanted is None else wanted

    def _wait_for_work(self, wanted: frozenset[str] | None, seen_generation: int,
                       deadline: float, push: bool = False) -> bool:
        """Sleep until a job may be claimable (True) or the deadline passes (False)."""
        while (remaining := deadline - time.monotonic()) > 0:
            if self.signal.wait(seen_generation, timeout=min(POLL_SECONDS, remaining)):
                return True
            if self.uow.read(lambda tx: self._may_claim_now(tx, wanted, push)):
                return True
        return False

    def _may_claim_now(self, tx: JobsTx, wanted: frozenset[str] | None,
                       push: bool = False) -> bool:
        """The waiting claim's peek: is there work this claim could take now, flow control
        included (a paused or full type's backlog must not wake it again and again)?"""
        now = self.clock.now_us()
        limits = None if self.flow is None else self.flow.limits(tx.conn, wanted, now,
                                                                 lock=False, push=push)
        if limits is None:
            return tx.jobs.has_claimable_work(now, wanted)
        return tx.jobs.has_claimable_work(now, self._types_of(wanted), limits)

    @staticmethod
    def _claimable_types(caller: Caller, requested: Iterable[str] | None) -> frozenset[str] | None:
        """The types a claim may take: requested ∩ the key's; None means any type."""
        requested_set = None if requested is None else frozenset(requested)
        if requested_set is None:
            return caller.allowed_types
        if caller.allowed_types is None:
            return requested_set
        return requested_set & caller.allowed_types

    def _rescue_expired_leases(self, tx: JobsTx, now: int) -> None:
        # A lease that ran out is a failed attempt whose worker is presumed dead.
        for job in tx.jobs.find_expired_leases(now, RESCUE_BATCH):
            rescued = end_attempt(tx.jobs, Transition.RESCUE, job,
                                        Transition.RESCUE.values(job, now))
            if rescued is not None:
                tx.made(Transition.RESCUE, [rescued], actor=SERVICE_ACTOR, now_us=now,
                        held_by=job.worker_id)

