"""The only place service_secrets SQL lives."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, bindparam, select
from sqlalchemy.dialects import postgresql, sqlite

from app.db import service_secrets

_select_value = select(service_secrets.c.value).where(service_secrets.c.name == bindparam("name"))


def _insert(dialect: str) -> Any:
    table = service_secrets
    return postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)


class SecretRepository:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def keep_first(self, name: str, candidate: str, now_us: int) -> str:
        """Store `candidate` under `name` unless a value is there already, and return the
        stored value: of processes racing to store one, every one reads the winner's."""
        stmt = _insert(self.conn.dialect.name).values(name=name, value=candidate,
                                                      created_at=now_us)
        self.conn.execute(stmt.on_conflict_do_nothing(index_elements=["name"]))
        value: str = self.conn.execute(_select_value, {"name": name}).scalar_one()
        return value
