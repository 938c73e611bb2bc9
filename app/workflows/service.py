"""The workflow use cases: create (one transaction for the whole graph), read, list, cancel.

A workflow's jobs are stored by the job service's graph path (JobService.enqueue_graph_in)
inside the transaction that stores the workflow's row, so the two commit together or not at
all; its cancel is the jobs' own cancel transition, whose cascade the job transaction runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, TypeVar

from app.core.callers import Caller
from app.core.clock import Clock
from app.core.errors import (
    Conflict,
    IdempotencyKeyTaken,
    NotFound,
    UniqueScopeHeld,
    ValidationFailed,
)
from app.core.statuses import JobStatus
from app.core.tracecontext import Trace
from app.jobs.domain.cursor import decode_cursor, encode_cursor
from app.jobs.domain.transitions import Transition
from app.jobs.sql.repository import WriteConflict
from app.jobs.tx.uow import JobsTx
from app.jobs.usecases.service import JobService
from app.workflows.models import (
    Workflow,
    WorkflowJob,
    WorkflowView,
    count_statuses,
    workflow_status,
)
from app.workflows.repository import WorkflowRepository

T = TypeVar("T")

# A request racing another's keys on PostgreSQL (see Enqueuing._run_batch) runs again.
_ATTEMPTS = 3
# A listing filtered by status reads at most this many workflows for one page; a page cut
# short by it still carries the cursor to go on from.
_SCAN_LIMIT = 5000


def _fingerprint(body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                           default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _may_see(caller: Caller, workflow: Workflow) -> bool:
    return caller.is_admin or workflow.producer == caller.name


class WorkflowService:
    def __init__(self, jobs: JobService, clock: Clock) -> None:
        self.jobs = jobs
        self.clock = clock
        # Purged jobs leave their workflows, in the purge's own transaction.
        jobs.on_purged(lambda tx, ids: WorkflowRepository(tx.conn).forget_jobs(ids))

    def create(self, caller: Caller, body: dict[str, Any],
               idempotency_key: str | None = None, *,
               trace: Trace | None = None) -> tuple[WorkflowView, bool]:
        """Store the workflow's jobs and the workflow, all or nothing; (the workflow, whether
        it is a replay of the one this Idempotency-Key made before). Every job keeps `trace`
        (the request's trace context). Raises ValidationFailed naming each field at fault (a
        cycle names its refs), Forbidden."""
        graph = self.jobs.prepare_graph(caller, body["jobs"], prefix="jobs",
                                        earlier_only=False, trace=trace)
        fingerprint = None if idempotency_key is None else _fingerprint(body)
        now = self.clock.now_us()

        def create_in(tx: JobsTx) -> tuple[int, bool]:
            tx.confirm(caller)
            workflows = WorkflowRepository(tx.conn)
            if idempotency_key is not None:
                workflows.lock_idempotency_key(caller.name, idempotency_key)
                stored = workflows.find_by_idempotency_key(caller.name, idempotency_key)
                if stored is not None:
                    if stored.request_fingerprint != fingerprint:
                        raise ValidationFailed(
                            "This idempotency key was used with a different workflow.",
                            errors={"Idempotency-Key": [
                                "Already used with a different request."]})
                    return stored.id, True
            outcomes = self.jobs.enqueue_graph_in(tx, caller, graph)
            workflow_id = workflows.add_workflow(
                name=body.get("name"), producer=caller.name, created_at=now,
                refs=[(item["ref"], outcome.job.id, not outcome.created)
                      for item, outcome in zip(body["jobs"], outcomes, strict=True)],
                idempotency_key=idempotency_key, request_fingerprint=fingerprint)
            return workflow_id, False

        workflow_id, replayed = self._write(create_in)
        return self.get(caller, workflow_id), replayed

    def get(self, caller: Caller, workflow_id: int) -> WorkflowView:
        """The workflow with its jobs, for its producer and admins; NotFound otherwise."""

        def read(tx: JobsTx) -> WorkflowView:
            tx.confirm(caller)  # a key revoked since the request began reads nothing
            workflows = WorkflowRepository(tx.conn)
            workflow = workflows.get_workflow(workflow_id)
            if workflow is None or not _may_see(caller, workflow):
                raise NotFound("No such workflow.")
            rows = workflows.jobs_of(workflow_id)
            edges = tx.dependencies.dependencies_of([job_id for _ref, job_id, _t, _s in rows])
            jobs = tuple(WorkflowJob(ref, job_id, job_type, status,
                                     tuple(dep for dep, _cancel, _done in edges.get(job_id, [])))
                         for ref, job_id, job_type, status in rows)
            counts = count_statuses(job.status for job in jobs)
            return WorkflowView(workflow, workflow_status(counts), counts, jobs)

        return self.jobs.uow.read(read)

    def list(self, caller: Caller, *, status: str | None, limit: int,
             cursor: str | None) -> tuple[list[WorkflowView], str | None]:
        """A page of the workflows the caller may see, by id (with `status`, those in it),
        and the cursor of the next page."""
        after_id = decode_cursor(cursor) if cursor is not None else 0
        producer = None if caller.is_admin else caller.name

        def read(tx: JobsTx) -> tuple[list[WorkflowView], str | None]:
            tx.confirm(caller)
            workflows = WorkflowRepository(tx.conn)
            page: list[WorkflowView] = []
            scanned, last_id = 0, after_id
            while scanned < _SCAN_LIMIT:
                rows = workflows.list_workflows(after_id=last_id, limit=limit + 1,
                                                producer=producer)
                counted = workflows.statuses_of([row.id for row in rows])
                for row in rows:
                    counts = count_statuses([])
                    counts.update(counted.get(row.id, {}))
                    view = WorkflowView(row, workflow_status(counts), counts)
                    if status is None or view.status == status:
                        if len(page) == limit:
                            return page, encode_cursor(page[-1].workflow.id)
                        page.append(view)
                    last_id = row.id
                scanned += len(rows)
                if len(rows) <= limit:
                    return page, None
            return page, encode_cursor(last_id)

        return self.jobs.uow.read(read)

    def workflow_of_job(self, caller: Caller, job_id: int) -> int | None:
        """The id of the workflow the job was enqueued in, if it was in one the caller may
        see (a job's page links to it); None otherwise."""

        def read(tx: JobsTx) -> int | None:
            workflows = WorkflowRepository(tx.conn)
            workflow_id = workflows.workflows_of_jobs([job_id]).get(job_id)
            workflow = None if workflow_id is None else workflows.get_workflow(workflow_id)
            return None if workflow is None or not _may_see(caller, workflow) else workflow.id

        return self.jobs.uow.read(read)

    def cancel(self, caller: Caller, workflow_id: int) -> WorkflowView:
        """Cancel every waiting and pending job the workflow created (its producer, admins);
        the running ones finish, and a job one of its items met (stored before it, by
        idempotency or unique key) is left alone. Jobs outside it that wait on the cancelled
        ones follow their on_dependency_failure, in the same transaction."""

        def cancel_in(tx: JobsTx) -> None:
            tx.confirm(caller)
            workflows = WorkflowRepository(tx.conn)
            workflow = workflows.get_workflow(workflow_id)
            if workflow is None or not _may_see(caller, workflow):
                raise NotFound("No such workflow.")
            # Jobs its items met (a replay, a unique twin) are not its own to cancel.
            open_ids = workflows.created_jobs_in(
                workflow_id, [JobStatus.WAITING.value, JobStatus.PENDING.value])
            now = self.clock.now_us()
            cancelled = tx.jobs.apply_transition_to_many(
                Transition.CANCEL, open_ids, Transition.CANCEL.values(now_us=now))
            tx.after_transition(Transition.CANCEL, cancelled, actor=caller.name, now_us=now,
                    details={job.id: {"workflow": workflow_id} for job in cancelled})

        self._write(cancel_in)
        return self.get(caller, workflow_id)

    def _write(self, work: Callable[[JobsTx], T]) -> T:
        attempts = 1
        while True:
            try:
                return self.jobs.write(work)
            except (IdempotencyKeyTaken, UniqueScopeHeld, WriteConflict):
                if attempts == _ATTEMPTS:
                    raise Conflict("Requests with these idempotency or unique keys are in "
                                   "flight; retry.") from None
                attempts += 1
