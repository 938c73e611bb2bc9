"""The only place the SQL of the queue's stats over time lives (docs/OPERATIONS.md): the per-minute
counts the job transactions add to, the pending depth the ticker writes, and their reads.

A job transaction adds its counts to the row of (type, minute, slot) in one statement, its
last before the commit (app/jobs/uow.py JobsTx.before_commit): no second commit, and a
rollback takes the counts back with the change. On PostgreSQL each pooled connection keeps
one slot, the next of its process's (from a random start): concurrent transactions add to
different rows, so they seldom wait on each other's row lock; SQLite's writers are
serialised anyway and use slot 0. Readers sum the slots.
"""

from __future__ import annotations

import functools
import itertools
import random
from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, delete, func, select

from app.core.clock import MICROS
from app.storage.at_commit import state_for
from app.storage.dialects import conflict_insert_for
from app.storage.schema import job_depth, job_stats

MINUTE_US = 60 * MICROS
COUNTS = ("enqueued", "claimed", "completed", "failed")
SLOTS = 32
# A count of one kind for one type: ("email", "claimed").
CountKey = tuple[str, str]


def minute_of(at_us: int) -> int:
    """The first microsecond of the minute `at_us` falls in."""
    return at_us - at_us % MINUTE_US


@functools.cache
def _add_counts(dialect: str) -> Any:
    stmt = conflict_insert_for(dialect, job_stats)
    return stmt.on_conflict_do_update(
        index_elements=[job_stats.c.type, job_stats.c.minute, job_stats.c.slot],
        set_={name: job_stats.c[name] + stmt.excluded[name] for name in COUNTS})


@functools.cache
def _write_depth(dialect: str) -> Any:
    stmt = conflict_insert_for(dialect, job_depth)
    return stmt.on_conflict_do_update(
        index_elements=[job_depth.c.type, job_depth.c.minute],
        set_={"pending": stmt.excluded.pending})


# The slots this process hands its connections, in turn: a process's connections (at most
# its pool) get distinct ones, and two processes' seldom meet.
_next_slots = itertools.count(random.randrange(SLOTS))
_SLOT_KEY = "queuelog_stats_slot"


def _slot(conn: Connection) -> int:
    if conn.dialect.name != "postgresql":
        return 0
    # The pooled connection's own info: it lasts as long as the database connection.
    info = conn.connection.info
    slot = info.get(_SLOT_KEY)
    if slot is None:
        slot = info[_SLOT_KEY] = next(_next_slots) % SLOTS
    return int(slot)


def _write_pending(conn: Connection, state: dict[str, Any]) -> None:
    repo = StatsRepository(conn)
    for minute, counts in sorted(state["minutes"].items()):
        repo.add(counts, minute)


def pending_counts(conn: Connection) -> defaultdict[int, Counter[CountKey]]:
    """minute -> the counts the transaction of `conn` will add at its commit (in one
    statement a minute, whatever the callers sharing it: app/storage/at_commit.py)."""
    state = state_for(conn, "stats", _write_pending)
    pending: defaultdict[int, Counter[CountKey]] = state.setdefault(
        "minutes", defaultdict(Counter))
    return pending


class StatsRepository:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def add(self, counts: Counter[CountKey], now_us: int) -> None:
        """Add `counts` to this minute's rows, one per type, in type order (two transactions
        adding to the same types lock their rows in one order: no deadlock)."""
        by_type: dict[str, dict[str, Any]] = {}
        for (job_type, name), count in counts.items():
            if count:
                row = by_type.setdefault(job_type, dict.fromkeys(COUNTS, 0))
                row[name] += count
        if not by_type:
            return
        minute, slot = minute_of(now_us), _slot(self.conn)
        self.conn.execute(_add_counts(self.conn.dialect.name), [
            {"type": job_type, "minute": minute, "slot": slot, **by_type[job_type]}
            for job_type in sorted(by_type)])

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
