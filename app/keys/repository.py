"""The only place API-key SQL lives: the key statements, and the condition another
repository's statement folds in to act only for a live key (`live_key_condition`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, bindparam, exists, insert, select, update

from app.keys.models import ApiKey
from app.storage.schema import api_keys
from app.storage.statements import DriverStatement

_select_by_digest = select(api_keys).where(api_keys.c.token_digest == bindparam("digest"))


_select_live_by_digest = DriverStatement(select(api_keys.c.id).where(
    api_keys.c.token_digest == bindparam("digest"), api_keys.c.revoked_at.is_(None)))

_select_live_by_id = select(api_keys).where(api_keys.c.id == bindparam("id"),
                                            api_keys.c.revoked_at.is_(None))


# The parameter a statement folding in live_key_condition takes: the key's token digest.
LIVE_KEY = "live_key"


def live_key_condition() -> ColumnElement[bool]:
    """A condition true while the key whose token digest is the parameter LIVE_KEY is live.
    A statement of a caller's step that holds it changes nothing once the key is revoked, so
    that the key's liveness costs no statement of its own (docs/API.md, Authentication)."""
    return exists().where(api_keys.c.token_digest == bindparam(LIVE_KEY),
                          api_keys.c.revoked_at.is_(None))


@dataclass(frozen=True, slots=True)
class KeyToConfirm:
    """A caller's key whose liveness the next statement of its step confirms, by folding in
    live_key_condition. A statement that finds its row confirms the key (`found_live`); one
    that changes nothing cannot tell a revoked key from a row not there, and asks
    (`confirm`: a statement of its own, raising Unauthorized when the key is revoked)."""

    digest: str
    confirm: Callable[[], None]
    found_live: Callable[[], None]

    def answered(self, found: bool) -> None:
        """Told whether the statement that folded the key in found its row."""
        if found:
            self.found_live()
        else:
            self.confirm()


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
