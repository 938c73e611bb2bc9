"""What an engine sends its database, counted: every statement the driver is given
(`before_cursor_execute`), and on PostgreSQL the round trips besides them (the BEGIN psycopg
sends before a transaction's first statement, the COMMIT, a ping). A step that is one
statement runs in autocommit there: one round trip.

tests/test_statement_budget.py holds the app to docs/SCALING.md ("What a job costs") with
it, and bench/costs.py reports the same figures. Nothing in the app listens: a listener on
the engine's cursor events turns the SQLite driver path of app/storage/statements.py off,
so that every statement is seen (through Core, the same statements)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine


class Sent:
    """What the engine sent inside a `counting` block: its statements' SQL, and by kind the
    pings, BEGINs (none in autocommit: SQLAlchemy begins its own transaction then, but sends
    nothing), COMMITs and pool checkouts."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.statements: list[str] = []

    @property
    def round_trips(self) -> int:
        counts = self.counts
        return counts["ping"] + counts["begin"] + len(self.statements) + counts["commit"]

    def reads_keys(self) -> bool:
        return any(sql.lstrip().upper().startswith("SELECT") and "api_keys" in sql
                   and "jobs" not in sql for sql in self.statements)

    def shown(self) -> str:
        return "\n".join(" ".join(statement.split())[:120] for statement in self.statements)


def _begun(conn: Any) -> str:
    if conn.engine.dialect.name == "sqlite":
        return "sqlite begin"  # its BEGIN IMMEDIATE is a statement, counted as such
    autocommit = conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
    return "autocommit" if autocommit else "begin"


@contextmanager
def counting(engine: Engine) -> Iterator[Sent]:
    """What `engine` sends inside the block, from the block's own thread (a request of
    Flask's test client runs in it; the type settings' thread is not the step's)."""
    sent = Sent()
    real_ping = engine.dialect.do_ping
    here = threading.get_ident()

    def ping(dbapi_connection: Any) -> bool:
        if threading.get_ident() == here:
            sent.counts["ping"] += 1
        return bool(real_ping(dbapi_connection))

    def statement(_conn: Any, _cursor: Any, sql: str, *_args: Any) -> None:
        if threading.get_ident() == here:
            sent.statements.append(sql)

    def count(kind: Callable[..., str]) -> Callable[..., None]:
        def listener(*args: Any) -> None:
            if threading.get_ident() == here:
                sent.counts[kind(*args)] += 1
        return listener

    listeners: list[tuple[Any, str, Callable[..., None]]] = [
        (engine, "before_cursor_execute", statement),
        (engine, "begin", count(_begun)),
        (engine, "commit", count(lambda _conn: "commit")),
        (engine.pool, "checkout", count(lambda *_args: "checkout"))]
    for target, name, listener in listeners:
        event.listen(target, name, listener)
    engine.dialect.do_ping = ping  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        engine.dialect.do_ping = real_ping  # type: ignore[method-assign]
        for target, name, listener in listeners:
            event.remove(target, name, listener)
