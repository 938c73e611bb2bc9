"""The only place the SQL of the queue's stats over time lives (docs/OPERATIONS.md): the per-minute
counts each process adds to, the pending depth the ticker writes, and their reads.

A process keeps what its job transactions counted and adds it to the rows of (type, minute,
slot) about once a second (app/jobs/timeline/stats_buffer.py), all in one statement. On
PostgreSQL each process writes to its own slot (picked at random), so that processes and
hosts seldom wait on each other's row lock; SQLite's writers are serialised anyway and use
slot 0. Readers sum the slots.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, delete, func, select

from app.core.clock import MICROS
from app.storage.dialects import conflict_insert_for
from app.storage.schema import job_depth, job_stats

MINUTE_US = 60 * MICROS
COUNTS = ("enqueued", "claimed", "completed", "failed")
SLOTS = 32
# A count of one kind for one type: ("email", "claimed").
CountKey = tuple[str, str]
# Rows per statement when many are added at once (after an outage): 7 parameters a row stay
# far below SQLite's and PostgreSQL's limits on a statement's parameters.
ROWS_PER_STATEMENT = 1000


def minute_of(at_us: int) -> int:
    """The first microsecond of the minute `at_us` falls in."""
    return at_us - at_us % MINUTE_US


@functools.cache
def _write_depth(dialect: str) -> Any:
    stmt = conflict_insert_for(dialect, job_depth)
    return stmt.on_conflict_do_update(
        index_elements=[job_depth.c.type, job_depth.c.minute],
        set_={"pending": stmt.excluded.pending})


def _rows(by_minute: Mapping[int, Counter[CountKey]], slot: int) -> list[dict[str, Any]]:
    """One row per (type, minute) with a count, in type then minute order: two statements
    adding to the same rows lock them in one order (no deadlock)."""
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for minute, counts in by_minute.items():
        for (job_type, name), count in counts.items():
            if count and name in COUNTS:
                row = rows.setdefault((job_type, minute), {
                    "type": job_type, "minute": minute, "slot": slot,
                    **dict.fromkeys(COUNTS, 0)})
                row[name] += count
    return [rows[key] for key in sorted(rows)]


class StatsRepository:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def add_counts(self, by_minute: Mapping[int, Counter[CountKey]], slot: int = 0) -> int:
        """Add the counts of each minute (minute -> counts) to the minutes' rows of `slot`:
        one multi-row statement (one per ROWS_PER_STATEMENT rows). Returns the rows."""
        rows = _rows(by_minute, slot)
        for first in range(0, len(rows), ROWS_PER_STATEMENT):
            stmt = conflict_insert_for(self.conn.dialect.name, job_stats).values(
                rows[first:first + ROWS_PER_STATEMENT])
            self.conn.execute(stmt.on_conflict_do_update(
                index_elements=[job_stats.c.type, job_stats.c.minute, job_stats.c.slot],
                set_={name: job_stats.c[name] + stmt.excluded[name] for name in COUNTS}))
        return len(rows)

    def add(self, counts: Counter[CountKey], now_us: int) -> None:
        """Add `counts` to the rows of the minute of `now_us` at once, in the caller's
        transaction."""
        self.add_counts({minute_of(now_us): counts})

    def write_depth(self, pending: Mapping[str, int], now_us: int) -> None:
        """The pending jobs of each type as counted in this minute (a later count of the
        same minute replaces it)."""
        if pending:
            minute = minute_of(now_us)
            self.conn.execute(_write_depth(self.conn.dialect.name), [
                {"type": job_type, "minute": minute, "pending": count}
                for job_type, count in sorted(pending.items())])

    def counts_by_minute(self, job_type: str | None, start_us: int, end_us: int
                         ) -> dict[int, tuple[int, int, int, int]]:
        """minute -> (enqueued, claimed, completed, failed) in [start_us, end_us), of one type
        or of all summed; minutes without a count are left out."""
        columns = [func.sum(job_stats.c[name]) for name in COUNTS]
        stmt = select(job_stats.c.minute, *columns).where(
            job_stats.c.minute >= start_us, job_stats.c.minute < end_us)
        if job_type is not None:
            stmt = stmt.where(job_stats.c.type == job_type)
        stmt = stmt.group_by(job_stats.c.minute)
        return {row[0]: (int(row[1]), int(row[2]), int(row[3]), int(row[4]))
                for row in self.conn.execute(stmt)}

    def depth_by_minute(self, job_type: str | None, start_us: int, end_us: int
                        ) -> dict[int, int]:
        """minute -> pending, as counted in [start_us, end_us), of one type or all summed."""
        stmt = select(job_depth.c.minute, func.sum(job_depth.c.pending)).where(
            job_depth.c.minute >= start_us, job_depth.c.minute < end_us)
        if job_type is not None:
            stmt = stmt.where(job_depth.c.type == job_type)
        stmt = stmt.group_by(job_depth.c.minute)
        return {row[0]: int(row[1]) for row in self.conn.execute(stmt)}

    def depth_before(self, job_type: str | None, before_us: int) -> int | None:
        """The last pending count taken before `before_us` (None: none is kept)."""
        last = select(func.max(job_depth.c.minute)).where(job_depth.c.minute < before_us)
        if job_type is not None:
            last = last.where(job_depth.c.type == job_type)
        minute = self.conn.execute(last).scalar()
        if minute is None:
            return None
        return self.depth_by_minute(job_type, minute, minute + 1).get(minute)

    def delete_before(self, before_us: int, minutes: int) -> int:
        """Delete the rows of up to `minutes` of the oldest minutes before `before_us` (a
        minute holds a row per type and slot: a small batch); returns how many rows went."""
        deleted = 0
        for table in (job_stats, job_depth):
            oldest = list(self.conn.execute(
                select(table.c.minute).where(table.c.minute < before_us).distinct()
                .order_by(table.c.minute).limit(minutes)).scalars())
            if oldest:
                deleted += self.conn.execute(delete(table).where(
                    table.c.minute.in_(oldest))).rowcount or 0
        return deleted
