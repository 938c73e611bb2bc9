"""The only place API-key SQL lives."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, bindparam, insert, select, update

from app.keys.models import ApiKey
from app.storage.schema import api_keys
from app.storage.statements import DriverStatement

_select_by_digest = select(api_keys).where(api_keys.c.token_digest == bindparam("digest"))


_select_live_by_digest = DriverStatement(select(api_keys.c.id).where(
    api_keys.c.token_digest == bindparam("digest"), api_keys.c.revoked_at.is_(None)))

_select_live_by_id = select(api_keys).where(api_keys.c.id == bindparam("id"),
                                            api_keys.c.revoked_at.is_(None))


class KeyRepository:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def find_by_digest(self, digest: str) -> ApiKey | None:
        row = self.conn.execute(_select_by_digest, {"digest": digest}).first()
        return None if row is None else ApiKey(*row)

    def is_live(self, digest: str) -> bool:
        return _select_live_by_digest.first(self.conn, {"digest": digest}) is not None

    def find_live_by_id(self, key_id: int) -> ApiKey | None:
        row = self.conn.execute(_select_live_by_id, {"id": key_id}).first()
        return None if row is None else ApiKey(*row)

    def find_by_name(self, name: str) -> ApiKey | None:
        row = self.conn.execute(select(api_keys).where(api_keys.c.name == name)).first()
        return None if row is None else ApiKey(*row)

    def insert_key(self, values: Mapping[str, Any]) -> None:
        self.conn.execute(insert(api_keys).values(**values))

    def list_keys(self) -> list[ApiKey]:
        return [ApiKey(*row) for row in self.conn.execute(select(api_keys).order_by(api_keys.c.id))]

    def set_check_url(self, name: str, check_url: str | None) -> None:
        self.conn.execute(update(api_keys).where(api_keys.c.name == name)
                          .values(check_url=check_url))

    def set_check_secret(self, name: str, check_secret: str) -> None:
        self.conn.execute(update(api_keys).where(api_keys.c.name == name)
                          .values(check_secret=check_secret))

    def revoke_key(self, name: str, now_us: int) -> bool:
        """False when there is no live key of that name."""
        result = self.conn.execute(
            update(api_keys)
            .where(api_keys.c.name == name, api_keys.c.revoked_at.is_(None))
            .values(revoked_at=now_us)
        )
        return result.rowcount == 1
