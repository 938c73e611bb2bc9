"""Retention: finished jobs deleted once old enough, with their history, in short batches."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection

from app.core.clock import MICROS, Clock
from app.core.statuses import TERMINAL_STATUSES
from app.jobs.uow import JobsTx, JobsUnitOfWork

Cleanup = Callable[[JobsTx, list[int]], None]


class Retention:
    """`bulk_batch_size`: the jobs one transaction of a purge deletes unless told
    (QUEUELOG_BULK_BATCH_SIZE)."""

    def __init__(self, uow: JobsUnitOfWork, clock: Clock, bulk_batch_size: int) -> None:
        self.uow = uow
        self.clock = clock
        self.bulk_batch_size = bulk_batch_size
        # What other resources keep of a job (a workflow's membership), deleted with it.
        self.cleanups: list[Cleanup] = []

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

    def _purge_batch(self, tx: JobsTx, *, statuses: list[str], cutoff: int, after_id: int,
                     limit: int) -> tuple[list[int], int | None]:
        # A job an unfinished job depends on is kept: its dependent still reads its result.
        # So is a failure that blocks its ordered key: the key waits for its retry or cancel.
        deleted_ids, last = tx.jobs.delete_finished_jobs(
            statuses=statuses, updated_before_us=cutoff, after_id=after_id, limit=limit,
            kept=lambda ids: (tx.dependencies.depended_on_by_unfinished(ids)
                              | tx.keys.holding_turns(ids)))
        # A job's attempts, events, dependencies, checkpoint and reservation go with it, in
        # the same transaction.
        tx.history.delete_history_of(deleted_ids)
        tx.dependencies.delete_edges_of(deleted_ids)
        tx.controls.delete_checkpoints_of(deleted_ids)
        tx.reservations.delete_reservations_of(deleted_ids)
        for cleanup in self.cleanups:
            cleanup(tx, deleted_ids)
        return deleted_ids, last
