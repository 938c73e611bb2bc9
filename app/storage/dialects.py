"""What repositories must know of the two engines, named for what it means to them.

Every `dialect.name` test of the code is here; repositories and services ask these questions
instead (SQLite's behaviour is set up in app/storage/engine.py, which is the other place).
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Connection, Engine, Table
from sqlalchemy.dialects import postgresql, sqlite


def is_sqlite(bind: Connection | Engine) -> bool:
    return bind.dialect.name == "sqlite"


def writers_serialised(conn: Connection) -> bool:
    """True on SQLite, where every write transaction opens with BEGIN IMMEDIATE: writers run
    one at a time, so what a write reads no rival changes before it commits. False on
    PostgreSQL, whose writers run concurrently and must lock the rows they rely on."""
    return conn.dialect.name != "postgresql"


@functools.cache
def _insert_of(dialect: str, table: Table) -> Any:
    return postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)


def conflict_insert(conn: Connection, table: Table) -> Any:
    """The engine's own INSERT into `table`, the one with on_conflict_do_nothing and
    on_conflict_do_update (each engine's construct, with the same methods)."""
    return _insert_of(conn.dialect.name, table)


def conflict_insert_for(dialect: str, table: Table) -> Any:
    """As conflict_insert, by the dialect's name: for statements built once per dialect."""
    return _insert_of(dialect, table)
