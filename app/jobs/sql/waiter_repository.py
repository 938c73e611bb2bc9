"""job_waiters: the processes whose requests wait for jobs, each until when and for what (the
jobs' triggers notify only while one waits for the change: migration 0025)."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import Connection, delete

from app.storage.dialects import conflict_insert
from app.storage.schema import job_waiters

CLAIMS = "claims"
READS = "reads"


def hold_waiting(conn: Connection, waiter: str, waits_for: str,
                 types: Collection[str] | None, until_us: int) -> None:
    """`waiter`'s requests wait for `waits_for` (CLAIMS of `types`, None: any type; READS)
    until `until_us` at the latest: one statement."""
    listed = None if types is None else ",".join(sorted(types))
    stmt = conflict_insert(conn, job_waiters).values(
        waiter=waiter, waits_for=waits_for, types=listed, until_at=until_us)
    conn.execute(stmt.on_conflict_do_update(
        index_elements=[job_waiters.c.waiter, job_waiters.c.waits_for],
        set_={"types": stmt.excluded.types, "until_at": stmt.excluded.until_at}))


def forget_lapsed(conn: Connection, before_us: int) -> None:
    """Forget the entries that lapsed before `before_us` (processes that have stopped waiting,
    or stopped): the table the triggers read stays as small as the processes that wait."""
    conn.execute(delete(job_waiters).where(job_waiters.c.until_at < before_us))
