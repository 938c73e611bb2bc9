"""job_waiters: the processes whose requests wait for jobs, each until when (the jobs'
triggers notify only while one is current: migration 0025)."""

from __future__ import annotations

from sqlalchemy import Connection

from app.storage.dialects import conflict_insert
from app.storage.schema import job_waiters


def hold_waiting(conn: Connection, waiter: str, until_us: int) -> None:
    """`waiter`'s requests wait until `until_us` at the latest: one statement."""
    stmt = conflict_insert(conn, job_waiters).values(waiter=waiter, until_at=until_us)
    conn.execute(stmt.on_conflict_do_update(index_elements=[job_waiters.c.waiter],
                                            set_={"until_at": stmt.excluded.until_at}))
