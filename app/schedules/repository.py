"""The only place schedule SQL lives. Every method runs on the connection it is given."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from app.db import schedules
from app.schedules.models import Schedule


def _schedule(row: Any) -> Schedule:
    return Schedule(*row)


class ScheduleRepository:
    """Schedule SQL on one connection. Methods returning `Schedule | None` or a bool say with
    None / False that no such row was there (or, for conditional updates, that it had
    changed)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def insert_schedule(self, values: Mapping[str, Any]) -> Schedule | None:
        """Insert a schedule; None when its name is taken."""
        try:
            with self.conn.begin_nested():
                row = self.conn.execute(
                    insert(schedules).returning(*schedules.c), dict(values)).first()
        except IntegrityError:
            return None
        return None if row is None else _schedule(row)

    def get_schedule(self, name: str) -> Schedule | None:
        row = self.conn.execute(select(schedules).where(schedules.c.name == name)).first()
        return None if row is None else _schedule(row)

    def list_schedules(self) -> list[Schedule]:
        return [_schedule(row) for row in
                self.conn.execute(select(schedules).order_by(schedules.c.name))]

    def find_due(self, now_us: int, limit: int) -> list[Schedule]:
        """Schedules whose next slot has come, the most overdue first."""
        stmt = (select(schedules).where(schedules.c.next_run_at <= now_us)
                .order_by(schedules.c.next_run_at, schedules.c.name).limit(limit))
        return [_schedule(row) for row in self.conn.execute(stmt)]

    def update_schedule(self, name: str, values: Mapping[str, Any]) -> Schedule | None:
        row = self.conn.execute(update(schedules).where(schedules.c.name == name)
                                .values(**values).returning(*schedules.c)).first()
        return None if row is None else _schedule(row)

    def take_due_slot(self, name: str, seen_next_run_at: int, next_run_at: int) -> bool:
        """Move the schedule on from the slot this process saw due: True for the one
        transaction that does; False when another process (or an edit) moved it first.

        The conditional UPDATE is the race's referee: on PostgreSQL it takes the row's lock,
        and a racer waiting on that lock finds, once the winner commits, that next_run_at is
        no longer the value it saw; SQLite runs one writer at a time."""
        result = self.conn.execute(
            update(schedules)
            .where(schedules.c.name == name, schedules.c.next_run_at == seen_next_run_at)
            .values(next_run_at=next_run_at))
        return result.rowcount == 1

    def record_fired(self, name: str, last_run_at: int, last_job_id: int) -> None:
        self.conn.execute(update(schedules).where(schedules.c.name == name)
                          .values(last_run_at=last_run_at, last_job_id=last_job_id))

    def delete_schedule(self, name: str) -> bool:
        return self.conn.execute(
            delete(schedules).where(schedules.c.name == name)).rowcount == 1
