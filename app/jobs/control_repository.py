"""The SQL of running jobs under control (contract §17): each job's row of job_controls, its
cancel request, its last progress and its checkpoint. Every method runs on the transaction it
is given; the rules that call them are the reports', the admin's and the claim's."""

from __future__ import annotations

import functools
from collections.abc import Collection
from typing import Any

from sqlalchemy import Connection, bindparam, delete, select, update

from app.jobs.models import JobControls
from app.storage.dialects import conflict_insert_for
from app.storage.schema import job_controls, jobs

_SHOWN = (job_controls.c.job_id, job_controls.c.cancel_requested_at,
          job_controls.c.cancel_requested_by, job_controls.c.progress_done,
          job_controls.c.progress_total, job_controls.c.progress_message,
          job_controls.c.progress_at)

# Read inside the statements that change a job row, so that they pay one look-up by key
# rather than a statement (a round trip, on PostgreSQL) of their own: whether the job's
# cancel was requested (a heartbeat answers it, a complete is refused the plain edge under
# it), and the checkpoint a claim hands to the next attempt.
CANCEL_REQUESTED = (select(job_controls.c.job_id)
                    .where(job_controls.c.job_id == jobs.c.id,
                           job_controls.c.cancel_requested_at.is_not(None))
                    .exists())
CHECKPOINT = (select(job_controls.c.checkpoint)
              .where(job_controls.c.job_id == jobs.c.id)
              .scalar_subquery())
# A job row's controls as JobControls shows them, after its job_id: what a heartbeat answers.
CONTROLS_OF_ROW = tuple(select(column).where(job_controls.c.job_id == jobs.c.id)
                        .scalar_subquery() for column in _SHOWN[1:])


def controls_from(job_id: int, values: Any) -> JobControls:
    """JobControls of CONTROLS_OF_ROW's values (or _SHOWN's, after the id)."""
    return JobControls(job_id, *values)


@functools.cache
def _upsert(dialect: str, columns: frozenset[str]) -> Any:
    """INSERT of a job's controls, or UPDATE of `columns` where the job has them already."""
    stmt = conflict_insert_for(dialect, job_controls)
    return stmt.on_conflict_do_update(
        index_elements=[job_controls.c.job_id],
        set_={name: stmt.excluded[name] for name in sorted(columns)})


class ControlRepository:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def controls_of(self, job_ids: Collection[int]) -> dict[int, JobControls]:
        """The controls of these jobs (those that have any), by job id."""
        if not job_ids:
            return {}
        stmt = select(*_SHOWN).where(job_controls.c.job_id.in_(sorted(job_ids)))
        return {row[0]: controls_from(row[0], row[1:]) for row in self.conn.execute(stmt)}

    def cancel_requested_by(self, job_id: int) -> str | None:
        """Who asked for the job's cancel (None: nobody has)."""
        return self.conn.execute(
            select(job_controls.c.cancel_requested_by)
            .where(job_controls.c.job_id == job_id,
                   job_controls.c.cancel_requested_at.is_not(None))).scalar()

    def request_cancel(self, job_id: int, *, by: str, now_us: int) -> None:
        self._write(job_id, cancel_requested_at=now_us, cancel_requested_by=by)

    def forget_cancel_requests(self, job_ids: Collection[int]) -> None:
        """The cancel requests of these jobs are settled (they ended cancelled) or void (an
        admin's retry runs the job again)."""
        if job_ids:
            self.conn.execute(
                update(job_controls)
                .where(job_controls.c.job_id.in_(sorted(job_ids)),
                       job_controls.c.cancel_requested_at.is_not(None))
                .values(cancel_requested_at=None, cancel_requested_by=None))

    def report(self, job_id: int, *, now_us: int, progress: tuple[int, int] | None,
               message: str | None, checkpoint: str | None) -> JobControls | None:
        """A holder's heartbeat or fail: its progress (with its message) and its checkpoint
        (compact JSON), each when given. Returns the job's controls as they now are (None:
        nothing was given)."""
        values: dict[str, Any] = {}
        if progress is not None or message is not None:
            values["progress_at"] = now_us
        if message is not None:  # a message stands until another replaces it
            values["progress_message"] = message
        if progress is not None:
            values["progress_done"], values["progress_total"] = progress
        if checkpoint is not None:
            values["checkpoint"] = checkpoint
        if not values:
            return None
        row = self.conn.execute(
            _upsert(self.conn.dialect.name, frozenset(values)).returning(*_SHOWN),
            {"job_id": job_id, **values}).one()
        return controls_from(job_id, row[1:])

    def delete_controls_of(self, job_ids: Collection[int]) -> None:
        if job_ids:
            self.conn.execute(delete(job_controls).where(
                job_controls.c.job_id.in_(bindparam("ids", expanding=True))),
                {"ids": sorted(job_ids)})

    def _write(self, job_id: int, **values: Any) -> None:
        self.conn.execute(_upsert(self.conn.dialect.name, frozenset(values)),
                          {"job_id": job_id, **values})
