"""Moving every job, key, schedule and workflow from one database to another (SQLite →
PostgreSQL, say).

Rows keep their ids, so job and workflow URLs, cursors and idempotency replays stay valid
after a move, and the target's id sequences continue after the highest id the source ever
gave (not only the highest it still holds), so an id freed by a purge is not given again
after the move. The source is only read, and a SQLite source is opened read-only.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from sqlalchemy import Column, ColumnElement, Connection, Table, func, insert, select, text, tuple_
from sqlalchemy.dialects.postgresql import REGCLASS
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from app.storage.engine import Database, make_engine
from app.storage.migrations import current_revision, head_revision, upgrade
from app.storage.schema import (
    api_keys,
    failure_groups,
    job_attempts,
    job_checkpoints,
    job_dependencies,
    job_depth,
    job_events,
    job_reservations,
    job_stats,
    job_tags,
    job_traces,
    job_types,
    job_waits,
    jobs,
    key_turns,
    posted_events,
    schedules,
    workflow_jobs,
    workflows,
)

# Copied in batches, in primary-key order. A job's history and its dependencies go with it,
# the workflows with their jobs by ref, each ordered key's turn (key_turns) and each job's
# checkpoint, reservation and wait (job_waits) with its jobs; the events kept for later waits
# (posted_events) with the queue.
# key_activity and worker_instances (when each key and each of its instances was last seen,
# to a minute) are left behind: the workers write them again within a minute of their first
# claim.
TABLES: tuple[Table, ...] = (api_keys, jobs, job_attempts, job_events, job_dependencies,
                             workflows, workflow_jobs, key_turns, job_checkpoints,
                             job_reservations, job_tags, job_traces, job_stats, job_depth,
                             job_waits, posted_events)
# The tables whose ids a sequence gives: the target's continues after the source's. (The
# other two are keyed by the ids of the rows they belong to, and a position.)
SEQUENCED: tuple[Table, ...] = (api_keys, jobs, job_attempts, job_events, workflows,
                                posted_events)
# Keyed by name rather than id, and small (a row per job type ever changed, a row per
# schedule, a row per failure group): copied whole. A type's settings (pause, limits, its
# token bucket), the schedules (with their next slot and last job) and the failure groups
# (their counts are the history of failures) go with the queue.
SETTINGS_TABLES: tuple[Table, ...] = (job_types, schedules, failure_groups)


class TransferError(RuntimeError):
    """The copy cannot start; the message says why. Nothing was written."""


class TableRows:
    """Whole-row reads and writes of one table, in primary-key order: the SQL of a copy."""

    def __init__(self, conn: Connection, table: Table) -> None:
        self.conn = conn
        self.table = table
        self.key: list[Column[Any]] = list(table.primary_key.columns)

    def count(self) -> int:
        return self.conn.execute(select(func.count()).select_from(self.table)).scalar_one()

    def read_all(self) -> list[dict[str, Any]]:
        return [dict(row._mapping) for row in self.conn.execute(select(self.table))]

    def read_after(self, after: tuple[Any, ...] | None, limit: int) -> list[dict[str, Any]]:
        """Up to `limit` rows whose primary key comes after `after` (None: from the first),
        in key order: each batch walks on along the key's index."""
        stmt = select(self.table).order_by(*self.key).limit(limit)
        if after is not None:
            stmt = stmt.where(self._comes_after(after))
        return [dict(row._mapping) for row in self.conn.execute(stmt)]

    def key_of(self, row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(row[column.name] for column in self.key)

    def _comes_after(self, after: tuple[Any, ...]) -> ColumnElement[bool]:
        if len(self.key) == 1:
            beyond: ColumnElement[bool] = self.key[0] > after[0]
            return beyond
        # A row value comparison, (job_id, position) > (?, ?): both engines read it as a
        # range of the primary key's index.
        return tuple_(*self.key) > tuple_(*after)

    def write(self, rows: list[dict[str, Any]]) -> None:
        self.conn.execute(insert(self.table), rows)

    def highest_id_ever(self) -> int:
        """The highest id this table has given, its deleted rows included where the engine
        remembers them (SQLite's sqlite_sequence, PostgreSQL's sequence); 0 for none."""
        highest = self.conn.execute(select(func.max(self.table.c.id))).scalar() or 0
        if self.conn.dialect.name == "postgresql":
            sequence = func.pg_get_serial_sequence(self.table.name, "id").cast(REGCLASS)
            given = self.conn.execute(select(func.pg_sequence_last_value(sequence))).scalar()
        elif self._remembers_ids_on_sqlite():
            given = self.conn.execute(_SQLITE_SEQUENCE, {"name": self.table.name}).scalar()
        else:
            given = None
        return max(highest, given or 0)

    def continue_ids_after(self, highest: int) -> None:
        """Make the next id this table gives larger than `highest`: rows inserted with their
        ids leave PostgreSQL's sequence where it was, and SQLite's at the highest copied."""
        if self.conn.dialect.name == "postgresql":
            self.conn.execute(select(func.setval(
                func.pg_get_serial_sequence(self.table.name, "id"), highest + 1, False)))
        elif self._remembers_ids_on_sqlite() and highest > 0:
            params = {"name": self.table.name, "highest": highest}
            if not self.conn.execute(_SQLITE_SEQUENCE_RAISE, params).rowcount:
                self.conn.execute(_SQLITE_SEQUENCE_START, params)
        # Any other SQLite table gives max(id) + 1, which the copied rows already set.

    def _remembers_ids_on_sqlite(self) -> bool:
        """Declared with AUTOINCREMENT (the jobs table): SQLite keeps its highest id given."""
        return bool(self.table.dialect_options["sqlite"]["autoincrement"])


# sqlite_sequence exists once a table with AUTOINCREMENT does; it holds one row per such
# table from its first insert on.
_SQLITE_SEQUENCE = text("SELECT seq FROM sqlite_sequence WHERE name = :name")
_SQLITE_SEQUENCE_RAISE = text(
    "UPDATE sqlite_sequence SET seq = max(seq, :highest) WHERE name = :name")
_SQLITE_SEQUENCE_START = text("INSERT INTO sqlite_sequence (name, seq) VALUES (:name, :highest)")


def _check_source(url: str) -> None:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = parsed.database or ""
        if not os.path.isfile(path):
            raise TransferError(f"the source database {path} does not exist")


def copy_database(source_url: str, target_url: str, *, batch_size: int = 1000,
                  progress: Callable[[str, int], None] | None = None) -> dict[str, int]:
    """Copy every key and job from source to target, which is migrated first and must hold
    none. Returns how many rows of each table were copied. The source is checked before the
    target is touched: a source that is missing or not at this release's schema changes
    nothing anywhere."""
    try:
        _check_source(source_url)
        source = Database(make_engine(source_url, pooled=False, read_only=True))
    except (ArgumentError, ValueError) as exc:
        raise TransferError(f"the source URL is not usable: {exc}") from None
    try:
        with source.read() as conn:
            revision = current_revision(conn)
        if revision != head_revision():
            raise TransferError(
                f"the source database is at schema revision {revision or 'none'}, this "
                f"release copies from {head_revision()}; run 'queuelog db upgrade' on it first")
        return _copy(source, target_url, batch_size, progress)
    except SQLAlchemyError as exc:
        # The class and the driver's first line only: no statement, no parameters.
        reason = str(getattr(exc, "orig", exc)).splitlines()[0] if str(exc) else ""
        raise TransferError(f"the copy failed: {type(exc).__name__}: {reason}") from None
    finally:
        source.engine.dispose()


def _copy(source: Database, target_url: str, batch_size: int,
          progress: Callable[[str, int], None] | None) -> dict[str, int]:
    upgrade(target_url)
    target = Database(make_engine(target_url, pooled=False))
    try:
        with target.read() as conn:
            for table in (*TABLES, *SETTINGS_TABLES):
                if TableRows(conn, table).count():
                    raise TransferError(f"the target already holds {table.name}; "
                                        "copy into an empty database")
        copied = {}
        for table in TABLES:
            copied[table.name] = _copy_table(source, target, table, batch_size, progress)
        for table in SETTINGS_TABLES:
            with source.read() as conn:
                rows = TableRows(conn, table).read_all()
            if rows:
                with target.write() as conn:
                    TableRows(conn, table).write(rows)
            copied[table.name] = len(rows)
        with source.read() as conn:
            highest = {table.name: TableRows(conn, table).highest_id_ever()
                       for table in SEQUENCED}
        with target.write() as conn:
            for table in SEQUENCED:
                TableRows(conn, table).continue_ids_after(highest[table.name])
        return copied
    finally:
        target.engine.dispose()


def _copy_table(source: Database, target: Database, table: Table, batch_size: int,
                progress: Callable[[str, int], None] | None) -> int:
    copied, after = 0, None
    while True:
        with source.read() as conn:
            reader = TableRows(conn, table)
            rows = reader.read_after(after, batch_size)
        if not rows:
            return copied
        with target.write() as conn:
            TableRows(conn, table).write(rows)
        copied += len(rows)
        after = reader.key_of(rows[-1])
        if progress is not None:
            progress(table.name, copied)
