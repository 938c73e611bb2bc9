"""The only place the dashboard's own SQL lives: its sessions and its failed sign-ins."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, case, delete, select, update

from app.storage.dialects import conflict_insert
from app.storage.schema import ui_sessions, ui_sign_in_failures

_select_session = (select(ui_sessions)
                   .where(ui_sessions.c.id_digest == bindparam("digest"),
                          ui_sessions.c.expires_at > bindparam("now")))
_update_data = (update(ui_sessions).where(ui_sessions.c.id_digest == bindparam("digest"))
                .values(data=bindparam("data")))
_delete_session = delete(ui_sessions).where(ui_sessions.c.id_digest == bindparam("digest"))
_delete_sessions_of_key = delete(ui_sessions).where(ui_sessions.c.key_id == bindparam("key_id"))
_delete_expired = delete(ui_sessions).where(ui_sessions.c.expires_at <= bindparam("now"))

_select_failures = (select(ui_sign_in_failures.c.scope, ui_sign_in_failures.c.failures)
                    .where(ui_sign_in_failures.c.scope.in_(bindparam("scopes", expanding=True)),
                           ui_sign_in_failures.c.window_start == bindparam("window_start")))
_delete_old_windows = (delete(ui_sign_in_failures)
                       .where(ui_sign_in_failures.c.window_start < bindparam("window_start")))


@dataclass(frozen=True)
class StoredSession:
    key_id: int
    expires_at: int
    data: str


class SessionRepository:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def find_session(self, digest: str, now_us: int) -> StoredSession | None:
        """The unexpired session whose id has this digest; None when there is none."""
        row = self.conn.execute(_select_session, {"digest": digest, "now": now_us}).first()
        if row is None:
            return None
        return StoredSession(key_id=row.key_id, expires_at=row.expires_at, data=row.data)

    def add_session(self, digest: str, key_id: int, now_us: int, expires_at: int) -> None:
        # Expired rows go when a new one comes: the table holds live sessions and a few more.
        self.conn.execute(_delete_expired, {"now": now_us})
        self.conn.execute(ui_sessions.insert().values(
            id_digest=digest, key_id=key_id, created_at=now_us, expires_at=expires_at,
            data="{}"))

    def save_data(self, digest: str, data: str) -> None:
        self.conn.execute(_update_data, {"digest": digest, "data": data})

    def delete_session(self, digest: str) -> None:
        self.conn.execute(_delete_session, {"digest": digest})

    def delete_sessions_of_key(self, key_id: int) -> None:
        self.conn.execute(_delete_sessions_of_key, {"key_id": key_id})


class SignInFailureRepository:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def failures(self, scopes: list[str], window_start: int) -> dict[str, int]:
        """Failed sign-ins in the window starting at `window_start`, by scope (a scope
        with none is left out)."""
        rows = self.conn.execute(_select_failures,
                                 {"scopes": scopes, "window_start": window_start})
        return {row.scope: row.failures for row in rows}

    def count_failure(self, scopes: list[str], window_start: int) -> None:
        """One more failure in each scope's count for this window (a count from an earlier
        window starts again at one); the earlier windows' rows go."""
        self.conn.execute(_delete_old_windows, {"window_start": window_start})
        table = ui_sign_in_failures
        for scope in scopes:
            stmt = conflict_insert(self.conn, table).values(
                scope=scope, window_start=window_start, failures=1)
            self.conn.execute(stmt.on_conflict_do_update(
                index_elements=["scope"],
                set_={"failures": case((table.c.window_start == window_start,
                                        table.c.failures + 1), else_=1),
                      "window_start": window_start}))
