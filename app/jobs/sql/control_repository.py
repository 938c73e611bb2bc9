"""The SQL of running jobs under control (docs/JOBS.md): a job's cancel request and last
progress (columns of its row the claim never reads, nor the Job record holds), and its
checkpoint (job_checkpoints, beside the row). Every method runs on the transaction it is
given; the rules that call them are the reports', the admin's and the claim's."""

from __future__ import annotations

import functools
from collections.abc import Collection
from typing import Any

from sqlalchemy import Connection, bindparam, delete, select, update

from app.core.statuses import JobStatus
from app.jobs.domain.models import JobControls
from app.jobs.sql.statuses import status_is_by_id
from app.storage.dialects import conflict_insert_for
from app.storage.schema import job_checkpoints, jobs
from app.storage.statements import DriverStatement

# A job row's controls, in JobControls' order after its id.
CONTROL_COLUMNS = (jobs.c.cancel_requested_at, jobs.c.cancel_requested_by,
                   jobs.c.progress_done, jobs.c.progress_total, jobs.c.progress_message,
                   jobs.c.progress_at)
# The checkpoint a claim hands to the next attempt, read inside the claim's own UPDATE: one
# look-up by key rather than a statement (a round trip, on PostgreSQL) of its own.
CHECKPOINT = (select(job_checkpoints.c.checkpoint)
              .where(job_checkpoints.c.job_id == jobs.c.id)
              .scalar_subquery())


def controls_from(job_id: int, values: Any) -> JobControls:
    """JobControls of CONTROL_COLUMNS' values."""
    return JobControls(job_id, *values)


def progress_columns(now_us: int, progress: tuple[int, int] | None,
                     message: str | None) -> dict[str, Any]:
    """What a heartbeat's progress writes on its job's row (nothing without any). A message
    stands until another replaces it."""
    columns: dict[str, Any] = {}
    if progress is not None or message is not None:
        columns["progress_at"] = now_us
    if message is not None:
        columns["progress_message"] = message
    if progress is not None:
        columns["progress_done"], columns["progress_total"] = progress
    return columns


_request_cancel = DriverStatement(
    update(jobs)
    .where(jobs.c.id == bindparam("job_id"), status_is_by_id(jobs, [JobStatus.RUNNING]),
           jobs.c.cancel_requested_at.is_(None))
    .values(cancel_requested_at=bindparam("requested_at"),
            cancel_requested_by=bindparam("requested_by"))
    .returning(jobs.c.id)
)


@functools.cache
def _save_checkpoint(dialect: str) -> DriverStatement:
    stmt = conflict_insert_for(dialect, job_checkpoints)
    return DriverStatement(stmt.on_conflict_do_update(
        index_elements=[job_checkpoints.c.job_id],
        set_={"checkpoint": stmt.excluded.checkpoint, "saved_at": stmt.excluded.saved_at}))


@functools.cache
def _save_paced_checkpoint(dialect: str) -> DriverStatement:
    # A heartbeat's checkpoint replaces the saved one only when that is old enough
    # (app/jobs/domain/report_pace.py): decided by the upsert itself, which returns no row when not.
    stmt = conflict_insert_for(dialect, job_checkpoints)
    return DriverStatement(stmt.on_conflict_do_update(
        index_elements=[job_checkpoints.c.job_id],
        set_={"checkpoint": stmt.excluded.checkpoint, "saved_at": stmt.excluded.saved_at},
        where=job_checkpoints.c.saved_at <= bindparam("spaced_before"))
        .returning(job_checkpoints.c.job_id))


class ControlRepository:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def controls_of(self, job_ids: Collection[int]) -> dict[int, JobControls]:
        """The controls of these jobs (those that have a cancel request or progress), by id."""
        if not job_ids:
            return {}
        stmt = select(jobs.c.id, *CONTROL_COLUMNS).where(
            jobs.c.id.in_(sorted(job_ids)),
            (jobs.c.cancel_requested_at.is_not(None) | jobs.c.progress_at.is_not(None)))
        return {row[0]: controls_from(row[0], row[1:]) for row in self.conn.execute(stmt)}

    def cancel_requested_by(self, job_id: int) -> str | None:
        """Who asked for the job's cancel (None: nobody has)."""
        return self.conn.execute(
            select(jobs.c.cancel_requested_by)
            .where(jobs.c.id == job_id, jobs.c.cancel_requested_at.is_not(None))).scalar()

    def request_cancel(self, job_id: int, *, by: str, now_us: int) -> bool:
        """Ask for the running job's cancel; False when it is not running or was asked
        already. A write of the job's row: on PostgreSQL a report racing it waits for it and
        then sees it (its conditions are checked again on the row as this left it)."""
        return bool(_request_cancel.rows(self.conn, {"job_id": job_id, "requested_at": now_us,
                                                     "requested_by": by}))

    def forget_cancel_requests(self, job_ids: Collection[int]) -> None:
        """These jobs' cancel requests are settled (they ended cancelled) or void (an admin's
        retry runs the job afresh)."""
        if job_ids:
            self.conn.execute(
                update(jobs)
                .where(jobs.c.id.in_(sorted(job_ids)), jobs.c.cancel_requested_at.is_not(None))
                .values(cancel_requested_at=None, cancel_requested_by=None))

    def save_checkpoint(self, job_id: int, checkpoint: str, now_us: int) -> None:
        """The job's checkpoint (compact JSON), replacing the one saved before."""
        _save_checkpoint(self.conn.dialect.name).rows(
            self.conn, {"job_id": job_id, "checkpoint": checkpoint, "saved_at": now_us})

    def save_checkpoint_if_due(self, job_id: int, checkpoint: str, now_us: int,
                               spacing_us: int) -> bool:
        """Save the job's checkpoint as save_checkpoint does, unless the one saved before is
        younger than `spacing_us`; False (nothing written) then."""
        return bool(_save_paced_checkpoint(self.conn.dialect.name).rows(
            self.conn, {"job_id": job_id, "checkpoint": checkpoint, "saved_at": now_us,
                        "spaced_before": now_us - spacing_us}))

    def delete_checkpoints_of(self, job_ids: Collection[int]) -> None:
        if job_ids:
            self.conn.execute(delete(job_checkpoints).where(
                job_checkpoints.c.job_id.in_(bindparam("ids", expanding=True))),
                {"ids": sorted(job_ids)})
