"""The only place the SQL of attempts, events and key activity lives."""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    String,
    bindparam,
    delete,
    func,
    insert,
    literal_column,
    select,
    update,
)

from app.jobs.domain.history import (
    CURRENT_OUTCOMES,
    Attempt,
    EventName,
    JobEvent,
    KeyActivity,
    Outcome,
)
from app.storage.dialects import conflict_insert_for
from app.storage.schema import job_attempts, job_events, key_activity
from app.storage.statements import DriverStatement

# The attempt a claim opens: numbered after the job's earlier ones. The claim holds the job
# (BEGIN IMMEDIATE on SQLite, the row lock on PostgreSQL), so no other attempt of the same
# job can be numbered at the same time; the unique index is the guard all the same.
_open_attempt_statement = insert(job_attempts).from_select(
    ["job_id", "number", "worker_id", "claimed_at", "outcome", "worker_instance"],
    select(
        bindparam("job_id"),
        func.coalesce(func.max(job_attempts.c.number), 0) + 1,
        bindparam("worker_id"),
        bindparam("claimed_at"),
        literal_column(f"'{Outcome.RUNNING.value}'"),
        bindparam("worker_instance", type_=String),
    ).where(job_attempts.c.job_id == bindparam("job_id")),
)
_open_attempt = DriverStatement(_open_attempt_statement)
# An attempt stored as it ends, its claim never written while it ran (the row told it): the
# same numbering as an opened one, its end with it.
_ended_attempt = DriverStatement(insert(job_attempts).from_select(
    ["job_id", "number", "worker_id", "claimed_at", "ended_at", "outcome", "error",
     "fingerprint", "worker_instance"],
    select(
        bindparam("job_id"),
        func.coalesce(func.max(job_attempts.c.number), 0) + 1,
        bindparam("worker_id"),
        bindparam("claimed_at"),
        bindparam("ended_at"),
        bindparam("outcome"),
        bindparam("error"),
        bindparam("fingerprint"),
        bindparam("worker_instance", type_=String),
    ).where(job_attempts.c.job_id == bindparam("job_id")),
))

# A job has at most one running attempt: the one its current claim opened.
_close_attempt_statement = (
    update(job_attempts)
    .where(job_attempts.c.job_id == bindparam("closed_job_id"),
           job_attempts.c.outcome == literal_column(f"'{Outcome.RUNNING.value}'"))
    .values(ended_at=bindparam("ended_at"), outcome=bindparam("new_outcome"),
            error=bindparam("new_error"), fingerprint=bindparam("new_fingerprint"))
)
_close_attempt = DriverStatement(_close_attempt_statement)

_IS_CURRENT = job_attempts.c.outcome.in_([literal_column(f"'{outcome.value}'")
                                          for outcome in sorted(CURRENT_OUTCOMES)])
_current_outcomes = (
    select(job_attempts.c.job_id, job_attempts.c.outcome)
    .where(job_attempts.c.job_id.in_(bindparam("ids", expanding=True)), _IS_CURRENT)
)


def current_attempt_of(job_id: Any, column: Any = job_attempts.c.outcome) -> Any:
    """A scalar subquery: `column` of the stored attempt that is the current one of the job
    `job_id` names (running or completed, app/jobs/timeline/row_story.py), NULL when only
    its row tells it. For a statement that reads it along with the job's row."""
    return (select(column).where(job_attempts.c.job_id == job_id, _IS_CURRENT)
            .limit(1).scalar_subquery())
_attempts_of_job = (select(job_attempts).where(job_attempts.c.job_id == bindparam("job_id"))
                    .order_by(job_attempts.c.number))
# The newest events, read backwards through (job_id, id).
_events_of_job = (select(job_events).where(job_events.c.job_id == bindparam("job_id"))
                  .order_by(job_events.c.id.desc()).limit(bindparam("limit")))
_count_events = select(func.count()).select_from(job_events).where(
    job_events.c.job_id == bindparam("job_id"), job_events.c.event == bindparam("event"))
_insert_event = DriverStatement(insert(job_events))


@functools.cache
def _upsert_activity(dialect: str, claimed: bool) -> Any:
    stmt = conflict_insert_for(dialect, key_activity)
    seen = {"last_seen_at": stmt.excluded.last_seen_at}
    if claimed:
        seen["last_claim_at"] = stmt.excluded.last_claim_at
    return stmt.on_conflict_do_update(index_elements=[key_activity.c.name], set_=seen)


class HistoryRepository:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    # -- attempts -------------------------------------------------------------------------

    def open_attempts(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Open an attempt per row (`job_id`, `worker_id`, `claimed_at`,
        `worker_instance`)."""
        # One row (a single claim, the hot path) skips executemany's extra work.
        if len(rows) == 1:
            _open_attempt.rows(self.conn, rows[0])
        else:
            _open_attempt.execute_many(self.conn, rows)

    def add_ended_attempts(self, rows: Sequence[Mapping[str, Any]], outcome: Outcome,
                           ended_at: int) -> None:
        """Store, already ended, an attempt per row (`job_id`, `worker_id`,
        `worker_instance`, `claimed_at`, `error`, `fingerprint`) whose claim was not stored
        while it ran: one statement where opening it and then ending it would take two."""
        params = [{**row, "ended_at": ended_at, "outcome": outcome.value} for row in rows]
        if len(params) == 1:
            _ended_attempt.rows(self.conn, params[0])
        else:
            _ended_attempt.execute_many(self.conn, params)

    def close_attempts(self, rows: Sequence[Mapping[str, Any]], outcome: Outcome,
                       ended_at: int) -> None:
        """End the running attempt of each row's job (`closed_job_id`, `new_error`,
        `new_fingerprint`)."""
        params = [{**row, "ended_at": ended_at, "new_outcome": outcome.value} for row in rows]
        if len(params) == 1:
            _close_attempt.rows(self.conn, params[0])
        else:
            _close_attempt.execute_many(self.conn, params)

    def current_outcomes(self, job_ids: Collection[int]) -> dict[int, str]:
        """By job id, the outcome of its stored attempt that is the row's current one (running
        or completed; app/jobs/timeline/row_story.py), for the jobs that have one."""
        if not job_ids:
            return {}
        return dict(self.conn.execute(_current_outcomes, {"ids": list(job_ids)}).all())

    def attempts_of(self, job_id: int) -> list[Attempt]:
        return [Attempt(*row) for row in self.conn.execute(_attempts_of_job, {"job_id": job_id})]

    # -- events ---------------------------------------------------------------------------

    def add_events(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Store events (`job_id`, `at`, `event`, `actor`, `detail`), several in one
        executemany (on SQLite the driver's: see app/storage/statements.py)."""
        if len(rows) == 1:
            _insert_event.rows(self.conn, rows[0])
        else:
            _insert_event.execute_many(self.conn, rows)

    def events_of(self, job_id: int, limit: int) -> list[JobEvent]:
        """The job's newest `limit` events, oldest first."""
        newest_first = [JobEvent(*row) for row in self.conn.execute(
            _events_of_job, {"job_id": job_id, "limit": limit})]
        return newest_first[::-1]

    def count_events(self, job_id: int, event: EventName) -> int:
        count: int = self.conn.execute(
            _count_events, {"job_id": job_id, "event": event.value}).scalar_one()
        return count

    # -- retention ------------------------------------------------------------------------

    def delete_history_of(self, job_ids: Collection[int]) -> None:
        ids = list(job_ids)
        if ids:
            self.conn.execute(delete(job_attempts).where(job_attempts.c.job_id.in_(ids)))
            self.conn.execute(delete(job_events).where(job_events.c.job_id.in_(ids)))

    # -- key activity ---------------------------------------------------------------------

    def record_activity(self, name: str, now_us: int, *, claimed: bool) -> None:
        stmt = _upsert_activity(self.conn.dialect.name, claimed)
        self.conn.execute(stmt, {"name": name, "last_seen_at": now_us,
                                 "last_claim_at": now_us if claimed else None})

    def activity(self) -> dict[str, KeyActivity]:
        return {row.name: KeyActivity(*row) for row in self.conn.execute(select(key_activity))}
