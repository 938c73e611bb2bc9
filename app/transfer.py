"""Moving every job and key from one database to another (SQLite → PostgreSQL, say).

Rows keep their ids, so job URLs, cursors and idempotency replays stay valid after a move.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Table, func, insert, select

from app.db import Database, api_keys, jobs, make_engine
from app.migrations import upgrade

TABLES: tuple[Table, ...] = (api_keys, jobs)


class TransferError(RuntimeError):
    """The copy cannot start; the message says why. Nothing was written."""


class TableRows:
    """Whole-row reads and writes of one table, in id order: the SQL of a copy."""

    def __init__(self, conn: Connection, table: Table) -> None:
        self.conn = conn
        self.table = table

    def count(self) -> int:
        return self.conn.execute(select(func.count()).select_from(self.table)).scalar_one()

    def read_after(self, after_id: int, limit: int) -> list[dict[str, Any]]:
        stmt = (select(self.table).where(self.table.c.id > after_id)
                .order_by(self.table.c.id).limit(limit))
        return [dict(row._mapping) for row in self.conn.execute(stmt)]

    def write(self, rows: list[dict[str, Any]]) -> None:
        self.conn.execute(insert(self.table), rows)

    def continue_ids_after_copy(self) -> None:
        """PostgreSQL's id sequence knows nothing of ids inserted explicitly; move it on."""
        if self.conn.dialect.name == "postgresql":
            highest = select(func.max(self.table.c.id)).scalar_subquery()
            self.conn.execute(select(func.setval(
                func.pg_get_serial_sequence(self.table.name, "id"),
                func.coalesce(highest, 0) + 1,
                False,
            )))


def copy_database(source_url: str, target_url: str, *, batch_size: int = 1000,
                  progress: Callable[[str, int], None] | None = None) -> dict[str, int]:
    """Copy every key and job from source to target, which is migrated first and must hold
    none. Returns how many rows of each table were copied."""
    upgrade(target_url)
    source = Database(make_engine(source_url, pooled=False))
    target = Database(make_engine(target_url, pooled=False))
    try:
        with target.read() as conn:
            for table in TABLES:
                if TableRows(conn, table).count():
                    raise TransferError(f"the target already holds {table.name}; "
                                        "copy into an empty database")
        copied = {}
        for table in TABLES:
            copied[table.name] = _copy_table(source, target, table, batch_size, progress)
        with target.write() as conn:
            for table in TABLES:
                TableRows(conn, table).continue_ids_after_copy()
        return copied
    finally:
        source.engine.dispose()
        target.engine.dispose()


def _copy_table(source: Database, target: Database, table: Table, batch_size: int,
                progress: Callable[[str, int], None] | None) -> int:
    copied, after_id = 0, 0
    while True:
        with source.read() as conn:
            rows = TableRows(conn, table).read_after(after_id, batch_size)
        if not rows:
            return copied
        with target.write() as conn:
            TableRows(conn, table).write(rows)
        copied += len(rows)
        after_id = rows[-1]["id"]
        if progress is not None:
            progress(table.name, copied)
