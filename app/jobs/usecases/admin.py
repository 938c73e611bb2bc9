"""An admin's transitions: cancel and retry one job, or every job filters name (bulk, a
batch per transaction). A producer may cancel its own jobs too; a running job's cancel is a
request its holder is told of (docs/JOBS.md, Running jobs)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from app.core.callers import Caller
from app.core.clock import Clock
from app.core.errors import Conflict, NotFound, UniqueConflict, UniqueScopeHeld
from app.core.statuses import JobStatus
from app.jobs.domain.models import BoundedCount, Job, JobControls
from app.jobs.domain.transitions import Transition
from app.jobs.domain.waits import ResumedBy
from app.jobs.sql.repository import JobRepository
from app.jobs.tx.uow import JobsTx, JobsUnitOfWork
from app.jobs.usecases.reads import visible_to
from app.jobs.usecases.reservations import decide


@dataclass(frozen=True)
class Cancelled:
    """A cancel's answer: the job, for a running one its controls (the request), and
    whether it was a reserved job's release."""

    job: Job
    controls: JobControls | None = None
    released: bool = False


class Administration:
    """`bulk_batch_size`: the jobs one transaction of a bulk retry or cancel takes at most
    (QUEUELOG_BULK_BATCH_SIZE)."""

    def __init__(self, uow: JobsUnitOfWork, clock: Clock, bulk_batch_size: int) -> None:
        self.uow = uow
        self.clock = clock
        self.bulk_batch_size = bulk_batch_size

    def cancel(self, caller: Caller, job_id: int) -> Cancelled:
        """pending | waiting → cancelled; running: its cancel requested (its holder's next
        heartbeat is told, and its report or its lease's expiry ends it cancelled); failed
        → cancelled when its failure blocks its ordered key (admins). A producer may
        cancel its own jobs; another's is not found."""

        def cancel_in(tx: JobsTx) -> Cancelled:
            repo = tx.jobs_for(caller)
            job = repo.get_job(job_id, for_update=True)
            if job is None or not visible_to(caller, job) or (
                    not caller.is_admin and job.producer != caller.name):
                raise NotFound("No such job.")
            if job.status == JobStatus.RESERVED:
                # A reserved job's cancel is its release (docs/JOBS.md), by the canceller.
                released = decide(tx, job_id, Transition.RELEASE_RESERVATION,
                                  actor=caller.name, now_us=self.clock.now_us(),
                                  detail={"by": "cancel"})
                return Cancelled(released or job, released=released is not None)
            if job.status == JobStatus.SUSPENDED:
                # Its wait ends with it (docs/WAITS.md): its token is spent, its moment gone.
                tx.waits.resolve([job_id], ResumedBy.CANCEL, self.clock.now_us())
            if job.status != JobStatus.RUNNING:
                return Cancelled(self._transition_in(tx, caller, job_id, Transition.CANCEL))
            now = self.clock.now_us()
            if tx.controls.request_cancel(job_id, by=caller.name, now_us=now):
                tx.timeline.cancel_requested(job, actor=caller.name, now_us=now)
            return Cancelled(job, tx.controls.controls_of([job_id])[job_id])

        return self.uow.run(cancel_in)

    def retry(self, caller: Caller, job_id: int) -> Job:
        """failed | cancelled → pending, with a fresh retry budget, claimable at once; or
        waiting, when a dependency of it has not finished yet."""
        return self._admin_transition(caller, job_id, Transition.RETRY)

    def retry_many(self, caller: Caller, filters: dict[str, Any]) -> list[Job]:
        """Every failed or cancelled job the filters name (up to their limit) → pending with
        a fresh retry budget, in batches (see _bulk_transition); the others are skipped."""
        return self._bulk_transition(caller, Transition.RETRY, filters)

    def cancel_many(self, caller: Caller, filters: dict[str, Any]) -> list[Job]:
        """Every pending, waiting or suspended job the filters name (up to their limit) →
        cancelled, in batches (see _bulk_transition); the others are skipped."""
        return self._bulk_transition(caller, Transition.CANCEL, filters)

    def count_for_bulk(self, caller: Caller, transition: Transition, *,
                       job_type: str | None, status: str | None, cap: int) -> BoundedCount:
        """How many jobs a bulk `transition` with these type and status filters would find
        now (before its limit), counted up to `cap` (what a confirmation says it takes)."""
        statuses = _bulk_statuses(transition, status)
        return self.uow.counting_read(
            lambda tx: tx.jobs_for(caller).count_for_bulk(statuses, job_type, cap))

    def _bulk_transition(self, caller: Caller, transition: Transition,
                         filters: dict[str, Any]) -> list[Job]:
        """The jobs the filters name, lowest id first, up to their limit, taken a batch
        (QUEUELOG_BULK_BATCH_SIZE) at a time, each batch in a write transaction of its own:
        the database's write lock (SQLite's) is held for one batch at most, and every other
        writer goes on between batches. Only jobs that existed when the action began are
        taken. Returns the jobs changed, by id."""
        statuses = _bulk_statuses(transition, filters.get("status"))
        if not statuses:
            return []
        batch_size = self.bulk_batch_size
        # Named ids are looked at a batch of them at a time, not all of them by every batch.
        named = None if filters.get("ids") is None else sorted(set(filters["ids"]))
        up_to_id = self.uow.read(lambda tx: tx.jobs.highest_job_id())

        def transition_in(tx: JobsTx, ids: list[int] | None,
                          after_id: int, limit: int) -> tuple[list[int], list[Job]]:
            repo = tx.jobs_for(caller)
            now = self.clock.now_us()
            chosen = repo.find_ids_for_bulk(
                statuses=statuses, limit=limit, job_type=filters.get("type"),
                created_before=filters.get("created_before"),
                created_after=filters.get("created_after"), ids=ids, after_id=after_id,
                up_to_id=up_to_id, fingerprint=filters.get("fingerprint"),
                tag=filters.get("tag"))
            moved = self._apply_many_holding_keys(repo, transition, chosen,
                                                  transition.values(now_us=now))
            if transition is Transition.RETRY:
                moved = repo.wait_again(moved)
                tx.controls.forget_cancel_requests([job.id for job in moved])
            elif transition is Transition.CANCEL and JobStatus.SUSPENDED in statuses:
                # Their waits end with them (docs/WAITS.md): no moment of theirs is due.
                tx.waits.resolve([job.id for job in moved], ResumedBy.CANCEL, now)
            tx.after_transition(transition, moved, actor=caller.name, now_us=now)
            return chosen, moved

        changed: list[Job] = []
        left, after_id, position = filters["limit"], 0, 0
        while left > 0:
            ids = None
            if named is not None:
                ids, position = named[position:position + batch_size], position + batch_size
                if not ids:
                    break
            limit = min(left, batch_size)
            chosen, moved = self.uow.run(functools.partial(
                transition_in, ids=ids, after_id=after_id, limit=limit))
            changed.extend(moved)
            left -= len(chosen)
            if ids is None and len(chosen) < limit:
                break  # no job left that the filters name
            after_id = chosen[-1] if ids is None else ids[-1]
        return changed

    @staticmethod
    def _apply_many_holding_keys(repo: JobRepository, transition: Transition,
                                 job_ids: list[int], values: dict[str, Any]) -> list[Job]:
        """A bulk transition; a job it would bring back into a unique key that a twin holds
        (a retry) is skipped, as jobs in other statuses are: one statement, which leaves out
        those jobs itself. On PostgreSQL a twin enqueued while it runs (committed after its
        snapshot) can still meet the index: then job by job, each in its own savepoint, as
        the batch is bounded."""
        try:
            with repo.savepoint():
                return repo.apply_transition_to_many(transition, job_ids, values)
        except UniqueScopeHeld:
            pass
        changed: list[Job] = []
        for job_id in job_ids:
            try:
                with repo.savepoint():
                    changed.extend(repo.apply_transition_to_many(transition, [job_id], values))
            except UniqueScopeHeld:
                pass
        return changed

    def _admin_transition(self, caller: Caller, job_id: int, transition: Transition) -> Job:
        return self.uow.run(lambda tx: self._transition_in(tx, caller, job_id, transition))

    def _transition_in(self, tx: JobsTx, caller: Caller, job_id: int,
                       transition: Transition) -> Job:
        repo = tx.jobs_for(caller)
        now = self.clock.now_us()
        made = transition
        job = self._transition_holding_keys(repo, job_id, made, made.values(now_us=now))
        if job is None and made is Transition.CANCEL and caller.is_admin:
            # A failure that blocks its ordered key may be cancelled too (docs/FLOW-CONTROL.md): its
            # key's turn passes on.
            failed = repo.get_job(job_id, for_update=True)
            if failed is not None and tx.keys.blocks_its_key(failed):
                made = Transition.CANCEL_BLOCKING
                job = repo.apply_transition(made, job_id, made.values(now_us=now))
        if job is None:
            current = repo.get_job(job_id)
            if current is None:
                raise NotFound("No such job.")
            allowed = " or ".join(transition.from_statuses)
            if transition is Transition.CANCEL:
                allowed = "pending, waiting, suspended or running"
            raise Conflict(f"The job is {current.status}; this needs it {allowed}.")
        if made is Transition.RETRY:
            [job] = repo.wait_again([job])
            # A request that outlived its job (a complete raced it) does not stop the
            # retry's run.
            tx.controls.forget_cancel_requests([job.id])
        tx.after_transition(made, [job], actor=caller.name, now_us=now)
        if made is Transition.RETRY and job.concurrency_key is not None:
            # Its ordered key's turn may be another job's: then it waits (KeyRules).
            job = repo.get_job(job.id) or job
        return job

    @staticmethod
    def _transition_holding_keys(repo: JobRepository, job_id: int, transition: Transition,
                                 values: dict[str, Any]) -> Job | None:
        """An admin's transition; a retry that would bring a job back into its while set
        while a twin holds its unique key is refused (409 naming the twin)."""
        if transition is not Transition.RETRY:
            return repo.apply_transition(transition, job_id, values)
        try:
            with repo.savepoint():
                return repo.apply_transition(transition, job_id, values)
        except UniqueScopeHeld:
            pass
        job = repo.get_job(job_id)
        twin = None if job is None else repo.find_unique_holder(job.producer,
                                                                 job.unique_scope or "")
        raise UniqueConflict("Another job holds this job's unique key; retry it once that "
                             "job has left its while statuses.", None if twin is None else twin.id)


def _bulk_statuses(transition: Transition, status: str | None) -> list[JobStatus]:
    """The statuses a bulk transition takes jobs from: those it starts from, or the one
    filtered on among them (none when the filter names another)."""
    return [from_status for from_status in transition.from_statuses
            if status is None or from_status == status]
