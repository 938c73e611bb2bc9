"""The job use cases behind one name: JobService composes the modules that hold them
(enqueue, reads, claim, reports, admin, reservations, retention) so that routes,
schedules, dispatch, the dashboard and history call `service.enqueue(...)` and the like.

Nothing here sees the HTTP request: handlers pass plain values and the authenticated caller.
"""

from __future__ import annotations

import random

from app.core.clock import Clock
from app.jobs.domain.flow import FlowPolicy, RetryPolicy
from app.jobs.domain.intake import IntakeRules
from app.jobs.domain.settings import QueueSettings
from app.jobs.tx.uow import CASCADE_LEFT, JobsUnitOfWork
from app.jobs.usecases.admin import Administration
from app.jobs.usecases.cascades import Cascades
from app.jobs.usecases.claim import ClaimService
from app.jobs.usecases.enqueue import Enqueuing
from app.jobs.usecases.maintenance import (
    CASCADE,
    RESERVATIONS,
    RETENTION,
    WAITS,
    MaintenanceHealth,
)
from app.jobs.usecases.maintenance_loop import Chore
from app.jobs.usecases.reads import JobReads
from app.jobs.usecases.reports import WorkerReports
from app.jobs.usecases.reservations import Reservations
from app.jobs.usecases.retention import Retention, WindowsSource
from app.jobs.usecases.sweeps import sweep_overdue
from app.jobs.usecases.waits import Waits
from app.jobs.wake.waiting import JobSignal, WaitingBudget


class JobService:
    """`finished` is the unit of work's FINISHED signal (app/__init__.py wires both); `signal`
    (`claimable`, else one of this process alone) is told when jobs may have become
    claimable (enqueue), and wakes the waiting claims."""

    def __init__(self, uow: JobsUnitOfWork, clock: Clock, settings: QueueSettings,
                 rng: random.Random | None = None, flow: FlowPolicy | None = None,
                 finished: JobSignal | None = None,
                 claimable: JobSignal | None = None,
                 retry_policy: RetryPolicy | None = None) -> None:
        self.uow = uow
        self.clock = clock
        self.settings = settings
        self.signal = claimable or JobSignal()
        self.rng = rng
        # Maintenance (the loop's chores, the cascades requests follow) reports here:
        # /readyz and /metrics show it.
        self.maintenance = MaintenanceHealth()
        self.cascades = Cascades(uow, clock, self.maintenance)
        # A transaction that left a cascade under way: its next steps follow its commit.
        uow.signals.setdefault(CASCADE_LEFT, self.cascades.follow)
        intake = IntakeRules(settings.job_types, settings.max_payload_bytes,
                             settings.check_url_prefixes)
        enqueuing = Enqueuing(uow, clock, intake, self.signal)
        self.finished = finished or JobSignal()
        # How many claims, and reads of a job, wait at once in this process.
        self.waiting_reads = WaitingBudget(settings.max_waiting_requests)
        reads = JobReads(uow, clock, self.finished, self.waiting_reads)
        reports = WorkerReports(uow, clock, settings, rng or random.SystemRandom(),
                                retry_policy)
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
        self.extras_of = reads.extras_of
        self.dependencies_shown = reads.dependencies_shown
        self.prepare_graph = enqueuing.prepare_graph
        self.enqueue_graph_in = enqueuing.enqueue_graph_in
        # flow None: no flow control at all (services built without the type settings).
        claims = ClaimService(uow, clock, settings, self.signal, flow)
        # Told by the database while a snapshot holds its horizon (app/database_wakes.py).
        self.claim_positions = claims.positions
        self.claim = claims.claim
        self.waiting_claims = claims.waits
        self.await_claim = claims.await_claim
        self.heartbeat = reports.heartbeat
        self.complete = reports.complete
        self.complete_many = reports.complete_many
        self.fail = reports.fail
        # Waits (docs/WAITS.md): suspend, events, waitpoint tokens, and maintenance's resumes.
        self.waits = Waits(uow, clock, reports, event_keep_seconds=settings.event_keep_seconds,
                           max_payload_bytes=settings.max_payload_bytes)
        self.cancel = admin.cancel
        self.retry = admin.retry
        self.cancel_many = admin.cancel_many
        self.retry_many = admin.retry_many
        self.count_for_bulk = admin.count_for_bulk
        reservations = Reservations(uow, clock)
        self.reservations = reservations
        self.confirm = reservations.confirm
        self.release = reservations.release
        retention = Retention(uow, clock, settings.bulk_batch_size)
        self.retention = retention
        self.purge = retention.purge
        self.on_purged = retention.on_purged

    def sweep(self) -> None:
        """The sweeps of expired leases and jobs (app/jobs/usecases/sweeps.py), each in its own
        transactions; a failure is maintenance's, reported, never raised."""
        sweep_overdue(self.uow, self.clock.now_us, self.settings.backoff, self.maintenance,
                      self.rng)

    def release_overdue_reservations(self) -> None:
        """The release of reservations past their deadline (app/jobs/usecases/reservations.py), as
        maintenance: a failure is reported, never raised."""
        self.maintenance.guarded(RESERVATIONS, self.reservations.release_overdue)

    def maintenance_chores(self, retention_windows: WindowsSource) -> list[Chore]:
        """What the maintenance loop's leader runs each round
        (app/jobs/usecases/maintenance_loop.py), in order, each reporting its own failures
        (`retention_windows`: every type's)."""
        remove_expired = self.retention.chore(retention_windows)

        def retention() -> None:
            self.maintenance.guarded(RETENTION, remove_expired)
            # The events kept long enough go at retention's pace (docs/WAITS.md).
            self.maintenance.guarded(WAITS, self.waits.forget_events)
            # And the worker instances not seen for a day (GET /workers).
            self.maintenance.guarded(RETENTION, self.retention.forget_instances)

        def cascades() -> None:
            self.maintenance.guarded(CASCADE, self.cascades.chore)

        def waits() -> None:
            self.maintenance.guarded(WAITS, self.waits.resume_due)

        return [self.sweep, cascades, self.release_overdue_reservations, waits, retention]

    @property
    def max_payload_bytes(self) -> int:
        """The largest payload, or result, a job may carry (QUEUELOG_MAX_PAYLOAD_BYTES)."""
        return self.settings.max_payload_bytes

    def end_waits(self) -> None:
        """The process is stopping: the waiting claims and reads answer now with what there
        is, and none waits from now on (app/jobs/wake/waiting.py)."""
        self.signal.end_waits()
        self.finished.end_waits()
