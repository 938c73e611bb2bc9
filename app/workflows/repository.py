"""The only place the SQL of workflows lives (tables workflows and workflow_jobs)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import Connection, delete, func, insert, select, text

from app.core.statuses import REMOVED
from app.storage.dialects import writers_serialised
from app.storage.schema import jobs, workflow_jobs, workflows
from app.workflows.models import Workflow

# A workflow's Idempotency-Key, locked for the transaction (PostgreSQL) so that two requests
# with one key store one workflow: the second waits, then finds the first.
_lock_key = text("SELECT pg_advisory_xact_lock(hashtextextended(:lock_name, 0))")


def _workflow(row: Any) -> Workflow:
    return Workflow(*row)


class WorkflowRepository:
    """Workflow SQL on one connection (a job transaction's, when it writes)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def lock_idempotency_key(self, producer: str, key: str) -> None:
        if not writers_serialised(self.conn):
            self.conn.execute(_lock_key, {"lock_name": f"workflow {producer} {key}"})

    def find_by_idempotency_key(self, producer: str, key: str) -> Workflow | None:
        row = self.conn.execute(select(workflows).where(
            workflows.c.producer == producer, workflows.c.idempotency_key == key)).first()
        return None if row is None else _workflow(row)

    def insert_workflow(self, *, name: str | None, producer: str, idempotency_key: str | None,
                        request_fingerprint: str | None, created_at: int) -> int:
        workflow_id: int = self.conn.execute(
            insert(workflows).values(name=name, producer=producer,
                                     idempotency_key=idempotency_key,
                                     request_fingerprint=request_fingerprint,
                                     created_at=created_at)
            .returning(workflows.c.id)).scalar_one()
        return workflow_id

    def add_workflow(self, *, name: str | None, producer: str,
                     refs: Sequence[tuple[str, int, bool]], created_at: int,
                     idempotency_key: str | None = None,
                     request_fingerprint: str | None = None) -> int:
        """Store a workflow and its jobs ((ref, job id, whether the item met a stored job) in
        request order); its id."""
        workflow_id = self.insert_workflow(
            name=name, producer=producer, idempotency_key=idempotency_key,
            request_fingerprint=request_fingerprint, created_at=created_at)
        self.add_jobs(workflow_id, refs)
        return workflow_id

    def add_jobs(self, workflow_id: int, refs: Sequence[tuple[str, int, bool]]) -> None:
        """The workflow's jobs: (ref, job id, met) in request order."""
        self.conn.execute(insert(workflow_jobs), [
            {"workflow_id": workflow_id, "position": position, "ref": ref, "job_id": job_id,
             "met": int(met)}
            for position, (ref, job_id, met) in enumerate(refs)])

    def get_workflow(self, workflow_id: int) -> Workflow | None:
        row = self.conn.execute(select(workflows).where(workflows.c.id == workflow_id)).first()
        return None if row is None else _workflow(row)

    def list_workflows(self, *, after_id: int, limit: int,
                       producer: str | None) -> list[Workflow]:
        stmt = select(workflows).where(workflows.c.id > after_id)
        if producer is not None:
            stmt = stmt.where(workflows.c.producer == producer)
        stmt = stmt.order_by(workflows.c.id).limit(limit)
        return [_workflow(row) for row in self.conn.execute(stmt)]

    def jobs_of(self, workflow_id: int) -> list[tuple[str, int, str | None, str]]:
        """(ref, id, type, status) of each of the workflow's jobs, in request order; one
        retention removed since has no type (None) and the status REMOVED."""
        stmt = (select(workflow_jobs.c.ref, workflow_jobs.c.job_id, jobs.c.type, jobs.c.status)
                .outerjoin(jobs, jobs.c.id == workflow_jobs.c.job_id)
                .where(workflow_jobs.c.workflow_id == workflow_id)
                .order_by(workflow_jobs.c.position))
        return [(ref, int(job_id), job_type, REMOVED if status is None else status)
                for ref, job_id, job_type, status in self.conn.execute(stmt)]

    def created_jobs_in(self, workflow_id: int, statuses: Collection[str]) -> list[int]:
        """The ids of the jobs the workflow created (not those its items met) that are in
        `statuses`, lowest first."""
        stmt = (select(jobs.c.id)
                .join(workflow_jobs, workflow_jobs.c.job_id == jobs.c.id)
                .where(workflow_jobs.c.workflow_id == workflow_id,
                       workflow_jobs.c.met == 0, jobs.c.status.in_(sorted(statuses)))
                .order_by(jobs.c.id))
        return list(self.conn.execute(stmt).scalars())

    def workflows_of_jobs(self, job_ids: Collection[int]) -> dict[int, int]:
        """The workflow each of these jobs is part of, by job id (a job of none left out):
        what a schedule shows as last_workflow_id, read through ix_workflow_jobs_job_id."""
        if not job_ids:
            return {}
        stmt = (select(workflow_jobs.c.job_id, workflow_jobs.c.workflow_id)
                .where(workflow_jobs.c.job_id.in_(sorted(job_ids))))
        return {int(job_id): int(workflow_id) for job_id, workflow_id in self.conn.execute(stmt)}

    def statuses_of(self, workflow_ids: Collection[int]) -> dict[int, dict[str, int]]:
        """Each workflow's jobs counted by status, those retention removed as REMOVED."""
        if not workflow_ids:
            return {}
        stmt = (select(workflow_jobs.c.workflow_id, jobs.c.status, func.count())
                .outerjoin(jobs, jobs.c.id == workflow_jobs.c.job_id)
                .where(workflow_jobs.c.workflow_id.in_(sorted(workflow_ids)))
                .group_by(workflow_jobs.c.workflow_id, jobs.c.status))
        found: dict[int, dict[str, int]] = {}
        for workflow_id, status, count in self.conn.execute(stmt):
            found.setdefault(int(workflow_id), {})[REMOVED if status is None else status] = (
                int(count))
        return found

    def forget_jobs(self, job_ids: Collection[int]) -> None:
        """Jobs just purged (their rows deleted in this transaction) stay in their workflows,
        shown as removed, so that a workflow's jobs and counts keep every job it was made
        of; a workflow none of whose jobs is left goes, with its rows. Two statements bound
        to these ids alone, however many workflows name them."""
        if not job_ids:
            return
        ids = sorted(job_ids)
        touched = select(workflow_jobs.c.workflow_id).where(workflow_jobs.c.job_id.in_(ids))
        member = workflow_jobs.alias("member")
        job_left = (select(member.c.workflow_id)
                    .join(jobs, jobs.c.id == member.c.job_id)
                    .where(member.c.workflow_id == workflows.c.id))
        self.conn.execute(delete(workflows).where(workflows.c.id.in_(touched),
                                                  ~job_left.exists()))
        workflow_left = select(workflows.c.id).where(
            workflows.c.id == workflow_jobs.c.workflow_id)
        self.conn.execute(delete(workflow_jobs).where(
            workflow_jobs.c.workflow_id.in_(
                select(member.c.workflow_id).where(member.c.job_id.in_(ids))),
            ~workflow_left.exists()))
