"""The only place schedule SQL lives. Every method runs on the connection it is given."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, bindparam, delete, false, insert, select, update

from app.core.errors import ScheduleNameTaken
from app.jobs.sql.context_repository import trace_of
from app.schedules.models import Schedule
from app.storage.dialects import writers_serialised
from app.storage.integrity import refused_in_savepoint
from app.storage.schema import schedules

# The columns that are Schedule's own fields (all but the trace's two, its `trace`).
_FIELDS = [column.name for column in schedules.c
           if column.name not in ("traceparent", "tracestate")]


def _schedule(row: Any) -> Schedule:
    values = row._mapping
    return Schedule(**{name: values[name] for name in _FIELDS},
                    trace=trace_of(values["traceparent"], values["tracestate"]))


class ScheduleRepository:
    """Schedule SQL on one connection. Methods returning `Schedule | None` or a bool say with
    None / False that no such row was there (or, for conditional updates, that it had
    changed)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def insert_schedule(self, values: Mapping[str, Any]) -> Schedule | None:
        """Insert a schedule; None when its name is taken."""
        try:
            with refused_in_savepoint(self.conn):
                row = self.conn.execute(
                    insert(schedules).returning(*schedules.c), dict(values)).first()
        except ScheduleNameTaken:
            return None
        return None if row is None else _schedule(row)

    def get_schedule(self, name: str) -> Schedule | None:
        row = self.conn.execute(select(schedules).where(schedules.c.name == name)).first()
        return None if row is None else _schedule(row)

    def list_schedules(self, *, after_name: str | None, limit: int) -> list[Schedule]:
        """Up to `limit` schedules by name, after `after_name` (a page's cursor)."""
        stmt = select(schedules).order_by(schedules.c.name).limit(limit)
        if after_name is not None:
            stmt = stmt.where(schedules.c.name > after_name)
        return [_schedule(row) for row in self.conn.execute(stmt)]

    def earliest_slot(self, passing_over: Collection[str] = ()) -> int | None:
        """The earliest next slot of the active schedules (None: none is active): one index
        probe, so that a tick with nothing due opens no write transaction, and knows how long
        nothing will be."""
        stmt = (select(schedules.c.next_run_at).where(*_active(passing_over))
                .order_by(schedules.c.next_run_at, schedules.c.name).limit(1))
        return self.conn.execute(stmt).scalar()

    def take_due(self, now_us: int, limit: int, passing_over: Collection[str] = ()
                 ) -> list[Schedule]:
        """Up to `limit` active schedules whose next slot has come, the most overdue first,
        held for the rest of this write transaction.

        On PostgreSQL the rows are locked, and rows another process or host holds are
        skipped (SKIP LOCKED): each takes a batch of its own, none waits on another, and a
        row is never fired twice (a racer that reads it after the holder's commit finds its
        next_run_at moved on). SQLite runs one writer at a time: the write lock holds them."""
        stmt = (select(schedules).where(*_due(now_us, passing_over))
                .order_by(schedules.c.next_run_at, schedules.c.name).limit(limit))
        if not writers_serialised(self.conn):
            stmt = stmt.with_for_update(skip_locked=True)
        return [_schedule(row) for row in self.conn.execute(stmt)]

    def move_on(self, moves: Sequence[Mapping[str, Any]]) -> None:
        """Set next_run_at, last_run_at and last_job_id of the schedules taken (each move:
        name, next_run_at, last_run_at, last_job_id): one statement for the batch."""
        if not moves:
            return
        self.conn.execute(
            update(schedules).where(schedules.c.name == bindparam("b_name"))
            .values(next_run_at=bindparam("b_next_run_at"),
                    last_run_at=bindparam("b_last_run_at"),
                    last_job_id=bindparam("b_last_job_id")),
            [{f"b_{key}": value for key, value in move.items()} for move in moves])

    def update_schedule(self, name: str, values: Mapping[str, Any]) -> Schedule | None:
        row = self.conn.execute(update(schedules).where(schedules.c.name == name)
                                .values(**values).returning(*schedules.c)).first()
        return None if row is None else _schedule(row)

    def delete_schedule(self, name: str) -> bool:
        return self.conn.execute(
            delete(schedules).where(schedules.c.name == name)).rowcount == 1


def _active(passing_over: Collection[str]) -> list[Any]:
    # `paused` leads ix_schedules_due: the paused schedules are never read here.
    active = [schedules.c.paused == false()]
    if passing_over:  # the few schedules whose zone this process cannot read
        active.append(schedules.c.name.not_in(sorted(passing_over)))
    return active


def _due(now_us: int, passing_over: Collection[str]) -> list[Any]:
    return [*_active(passing_over), schedules.c.next_run_at <= now_us]
