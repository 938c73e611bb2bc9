"""Retention: finished jobs deleted once old enough, with their history, in short batches —
by hand (`queuelog purge`) and by the maintenance leader, per type (docs/OPERATIONS.md).

Maintenance's retention keeps no state another process needs (the lead may change hands):
each batch is one short write transaction that finds the type's jobs past their window,
deletes them and their history, and commits. Two processes (or hosts) on one database take
disjoint batches (PostgreSQL: SKIP LOCKED; SQLite: one writer at a time, and a row already
deleted is simply not found), and a process that dies mid-batch leaves the batch to be found
again by the next leader's round.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from app.core.clock import MICROS, Clock
from app.core.statuses import TERMINAL_STATUSES, JobStatus
from app.jobs.domain.transitions import JobMetric
from app.jobs.tx.uow import JobsTx, JobsUnitOfWork

Cleanup = Callable[[JobsTx, list[int]], None]

# A job with an idempotency key is kept at least this long after it was created, whatever its
# type's window: producers may retry an enqueue that long and must get the same job back.
IDEMPOTENCY_FLOOR_SECONDS = 86_400
# Maintenance's retention deletes this many jobs per transaction: each holds the write lock
# (SQLite's, or the rows' on PostgreSQL) for a few milliseconds, so enqueues and claims go on
# between batches.
RETENTION_BATCH_JOBS = 200
# At most this many batches per round: maintenance's other chores wait no longer.
RETENTION_BATCHES_PER_TICK = 10
# And no more batches in a round once they took this long: retention's share of the write
# lock stays under a tenth (a round is 0.5 s), so that enqueues and claims keep their
# pace while a backlog of expired jobs goes (on SQLite every writer of the host shares one
# lock; bench/retention.py measures the rates during a removal against without one).
RETENTION_SECONDS_PER_TICK = 0.05
# Once a pass found nothing more to remove, the next one starts this much later.
RETENTION_IDLE_SECONDS = 10.0
# Failure groups forgotten per type and pass, at most (a bounded transaction).
STALE_GROUPS_PER_PASS = 1000
FINISHED_IN_ORDER = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)
# A worker key's instance (GET /workers) is forgotten this long after it was last seen, at
# most INSTANCES_PER_PASS a pass, a pass at most every INSTANCES_PASS_SECONDS.
INSTANCES_KEPT_SECONDS = 86_400
INSTANCES_PER_PASS = 1000
INSTANCES_PASS_SECONDS = 600


@dataclass(frozen=True)
class RetentionWindows:
    """How long a type's finished jobs are kept, in seconds, by status; None: for ever."""

    completed: int | None
    failed: int | None
    cancelled: int | None

    def of(self, status: JobStatus) -> int | None:
        return {JobStatus.COMPLETED: self.completed, JobStatus.FAILED: self.failed,
                JobStatus.CANCELLED: self.cancelled}[status]


NO_RETENTION = RetentionWindows(None, None, None)
WindowsSource = Callable[[], Mapping[str, RetentionWindows]]


class Retention:
    """`bulk_batch_size`: the jobs one transaction of a purge deletes unless told
    (QUEUELOG_BULK_BATCH_SIZE)."""

    def __init__(self, uow: JobsUnitOfWork, clock: Clock, bulk_batch_size: int) -> None:
        self.uow = uow
        self.clock = clock
        self.bulk_batch_size = bulk_batch_size
        # What other resources keep of a job (a workflow's membership), deleted with it.
        self.cleanups: list[Cleanup] = []
        # The pass under way in this process: where each (type, status) scan got to
        # (kept jobs are stepped over, not read again), and when the next pass may start.
        self._positions: dict[tuple[str, JobStatus], tuple[int, int] | None] = {}
        self._pass: list[tuple[str, JobStatus]] = []
        self._windows: dict[str, RetentionWindows] = {}
        self._idle_until_us = 0
        # Set by windows_changed (another thread), read by the next remove_expired.
        self._windows_changed = False
        # The pause between two passes; longer where an idle database should be asked
        # nearly nothing (docs/SCALING.md, "The database tells every host").
        self.idle_seconds = RETENTION_IDLE_SECONDS
        self._next_instances_pass_us = 0

    @property
    def pass_under_way(self) -> bool:
        """The pass has (type, status) scans left: its next call goes on with them."""
        return bool(self._pass)

    def forget_instances(self) -> int:
        """Maintenance: forget a batch of the worker instances not seen for a day, at most
        once every INSTANCES_PASS_SECONDS (an idle database is asked nearly nothing).
        Returns how many."""
        now = self.clock.now_us()
        if now < self._next_instances_pass_us:
            return 0
        self._next_instances_pass_us = now + INSTANCES_PASS_SECONDS * MICROS
        before = now - INSTANCES_KEPT_SECONDS * MICROS
        return self.uow.write_alone(
            lambda tx: tx.instances.forget_seen_before(before, INSTANCES_PER_PASS))

    def windows_changed(self) -> None:
        """A type's settings changed (told by the database): the next round starts a new
        pass with the windows as they are now (a pass under way is dropped: it read the old
        ones), rather than after the idle pause, so that a window an operator shortened is
        kept within a round or two."""
        self._windows_changed = True

    def on_purged(self, cleanup: Cleanup) -> None:
        """Have `cleanup(tx, ids)` run in each purge batch's transaction, with the ids it
        deletes."""
        self.cleanups.append(cleanup)

    def purge(self, *, older_than_seconds: float, statuses: Collection[str] | None = None,
              batch_size: int | None = None) -> int:
        """Delete finished jobs last updated before the cutoff, one short transaction per
        batch (of QUEUELOG_BULK_BATCH_SIZE jobs unless told) so that writers are never held
        up long. Returns how many were deleted."""
        batch_size = batch_size or self.bulk_batch_size
        chosen = set(statuses) if statuses else {s.value for s in TERMINAL_STATUSES}
        if not chosen <= {s.value for s in TERMINAL_STATUSES}:
            raise ValueError("only completed, failed and cancelled jobs can be purged")
        cutoff = self.clock.now_us() - round(older_than_seconds * MICROS)
        deleted, after_id = 0, 0
        while True:
            deleted_ids, last = self.uow.write_alone(functools.partial(
                self._purge_batch, statuses=sorted(chosen), cutoff=cutoff,
                after_id=after_id, limit=batch_size))
            count = len(deleted_ids)
            if last is None:
                return deleted
            deleted, after_id = deleted + count, last

    def remove_expired(self, read_windows: WindowsSource, *,
                       max_batches: int = RETENTION_BATCHES_PER_TICK,
                       batch_jobs: int = RETENTION_BATCH_JOBS,
                       max_seconds: float | None = RETENTION_SECONDS_PER_TICK) -> int:
        """Maintenance's chore: go on with this process's retention pass for up to
        `max_batches` batches, or until they took `max_seconds` (None: no time bound);
        returns the jobs deleted. A pass reads the types' windows,
        forgets the failure groups of each type not seen within its failed window, then
        visits every (type, status) with a window; the next pass starts `idle_seconds`
        after one ends."""
        now = self.clock.now_us()
        if self._windows_changed:
            self._windows_changed = False
            self._pass, self._idle_until_us = [], 0
        if not self._pass:
            if now < self._idle_until_us:
                return 0
            self._windows = windows = dict(read_windows())
            self._pass = [(job_type, status) for job_type in sorted(windows)
                          for status in FINISHED_IN_ORDER
                          if windows[job_type].of(status) is not None]
            self._positions = {}
            self._forget_stale_groups(windows, now)
        windows = self._windows
        deleted = 0
        started = time.monotonic()
        for _ in range(max_batches):
            if max_seconds is not None and time.monotonic() - started >= max_seconds:
                break
            if not self._pass:
                break
            job_type, status = self._pass[0]
            window = windows.get(job_type, NO_RETENTION).of(status)
            if window is None:
                self._pass.pop(0)
                continue
            scanned, removed = self.uow.write_alone(functools.partial(
                self._expire_batch, job_type=job_type, status=status,
                cutoff=now - window * MICROS,
                keyed_cutoff=now - IDEMPOTENCY_FLOOR_SECONDS * MICROS,
                after=self._positions.get((job_type, status)), limit=batch_jobs))
            deleted += removed
            if len(scanned) < batch_jobs:
                self._pass.pop(0)
            else:
                self._positions[(job_type, status)] = scanned[-1]
        if not self._pass:
            self._idle_until_us = now + round(self.idle_seconds * MICROS)
        return deleted

    def chore(self, read_windows: WindowsSource) -> Callable[[], int]:
        """remove_expired as a maintenance chore."""

        def retention() -> int:
            return self.remove_expired(read_windows)

        return retention

    def _forget_stale_groups(self, windows: Mapping[str, RetentionWindows], now: int) -> None:
        """A type's failure groups not seen within its failed window: their jobs are gone."""
        stale = {job_type: now - kept.failed * MICROS
                 for job_type, kept in sorted(windows.items()) if kept.failed is not None}

        def forget(tx: JobsTx) -> None:
            for job_type, before in stale.items():
                tx.failures.delete_last_seen_before(job_type, before,
                                                    limit=STALE_GROUPS_PER_PASS)

        if stale:
            self.uow.write_alone(forget)

    def _expire_batch(self, tx: JobsTx, *, job_type: str, status: JobStatus, cutoff: int,
                      keyed_cutoff: int, after: tuple[int, int] | None,
                      limit: int) -> tuple[list[tuple[int, int]], int]:
        scanned = tx.jobs.expired_finished(
            job_type=job_type, status=status, updated_before_us=cutoff,
            keyed_created_before_us=keyed_cutoff, after=after, limit=limit)
        ids = [job_id for _updated_at, job_id in scanned]
        kept = self._kept(tx, ids)
        doomed = [job_id for job_id in ids if job_id not in kept]
        tx.jobs.delete_jobs(doomed)
        self._delete_history(tx, doomed)
        return scanned, len(doomed)

    def _purge_batch(self, tx: JobsTx, *, statuses: list[str], cutoff: int, after_id: int,
                     limit: int) -> tuple[list[int], int | None]:
        deleted_ids, last = tx.jobs.delete_finished_jobs(
            statuses=statuses, updated_before_us=cutoff, after_id=after_id, limit=limit,
            kept=lambda ids: self._kept(tx, ids))
        self._delete_history(tx, deleted_ids)
        return deleted_ids, last

    @staticmethod
    def _kept(tx: JobsTx, ids: list[int]) -> set[int]:
        # A job an unfinished job depends on is kept: its dependent still reads its result.
        # So is a failure that blocks its ordered key: the key waits for its retry or cancel.
        if not ids:
            return set()
        return set(tx.dependencies.depended_on_by_unfinished(ids)) | set(
            tx.keys.holding_turns(ids))

    def _delete_history(self, tx: JobsTx, deleted_ids: list[int]) -> None:
        """A job's attempts, events, dependencies, checkpoint, reservation, tags, trace and
        wait go with it, in the same transaction, and what other resources keep of it (the
        cleanups)."""
        if not deleted_ids:
            return
        tx.history.delete_history_of(deleted_ids)
        tx.dependencies.delete_edges_of(deleted_ids)
        tx.controls.delete_checkpoints_of(deleted_ids)
        tx.reservations.delete_reservations_of(deleted_ids)
        tx.context.delete_of(deleted_ids)
        tx.waits.delete_waits_of(deleted_ids)
        for cleanup in self.cleanups:
            cleanup(tx, deleted_ids)
        tx.events[JobMetric.REMOVED.value] += len(deleted_ids)
