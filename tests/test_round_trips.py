"""What a plain step sends to PostgreSQL, counted on the engine: the pool's checkouts, the
pings, BEGIN, each statement, COMMIT. A plain enqueue, claim, heartbeat and complete pay no
pre-ping and no read of their caller's key of its own (its liveness rides on the step's
statement), and a step that is one statement runs in autocommit: one round trip."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event


class Sent:
    """What one engine sent, by kind; `statements` lists their SQL."""

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


def _begun(conn: Any) -> str:
    # In autocommit SQLAlchemy still begins its own transaction, but sends no BEGIN.
    autocommit = conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
    return "autocommit" if autocommit else "begin"


@contextmanager
def counting(app: Any) -> Iterator[Sent]:
    engine = app.extensions["queuelog"].db.engine
    sent = Sent()
    real_ping = engine.dialect.do_ping

    def ping(dbapi_connection: Any) -> bool:
        sent.counts["ping"] += 1
        return bool(real_ping(dbapi_connection))

    def statement(_conn: Any, _cursor: Any, sql: str, *_args: Any) -> None:
        sent.statements.append(sql)

    listeners = [(engine, "before_cursor_execute", statement),
                 (engine, "begin", lambda conn: sent.counts.update([_begun(conn)])),
                 (engine, "commit", lambda _conn: sent.counts.update(["commit"])),
                 (engine.pool, "checkout", lambda *_args: sent.counts.update(["checkout"]))]
    for target, name, listener in listeners:
        event.listen(target, name, listener)
    engine.dialect.do_ping = ping
    try:
        yield sent
    finally:
        engine.dialect.do_ping = real_ping
        for target, name, listener in listeners:
            event.remove(target, name, listener)


@pytest.mark.parametrize("engine_name", ["postgresql"], indirect=True)
def test_a_plain_step_pays_no_ping_and_no_read_of_its_key(engine_name, app, api, producer,
                                                          worker):
    # Each key seen once, so that the steps below find it in the process's cache.
    api.enqueue(producer)
    first = api.claim(worker).json
    api.complete(worker, first["id"], lease_token=first["lease_token"])

    with counting(app) as enqueue:
        job_id = api.enqueue(producer).json["id"]
    with counting(app) as claim:
        claimed = api.claim(worker).json
    with counting(app) as heartbeat:
        assert api.heartbeat(worker, job_id,
                             lease_token=claimed["lease_token"]).status_code == 200
    with counting(app) as complete:
        assert api.complete(worker, job_id,
                            lease_token=claimed["lease_token"]).status_code == 200

    steps = {"enqueue": enqueue, "claim": claim, "heartbeat": heartbeat, "complete": complete}
    for step, sent in steps.items():
        print(f"{step}: {sent.round_trips} round trips, {dict(sent.counts)}, "
              f"{len(sent.statements)} statements: {[sql[:60] for sql in sent.statements]}")
    for step, sent in steps.items():
        assert sent.counts["ping"] == 0, step
        assert not sent.reads_keys(), (step, sent.statements)
    # Already one statement: sent alone, in autocommit.
    assert heartbeat.round_trips == 1, heartbeat.statements
    assert heartbeat.counts["autocommit"] == 1
