"""How the stats counts reach job_stats (docs/OPERATIONS.md, The queue over time): kept in
process for committed transactions only, written about once a second in one statement by a
thread of the process, summed across processes, and kept through a failed write; both
engines."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import event, func, select, text
from sqlalchemy.exc import SQLAlchemyError

from app import create_app, start_stats_flusher
from app.core.clock import MICROS, ManualClock, to_rfc3339
from app.jobs.timeline.stats_buffer import StatsBuffer
from app.storage.engine import Database
from app.storage.schema import job_stats
from tests.conftest import Api, Key

START = 1_800_000_000_000_000  # the clock fixture's start: a minute's first microsecond
MINUTE = 60 * MICROS
WAIT_SECONDS = 20  # for another process's flusher: far beyond its second


def counts(client: FlaskClient, admin: Key, job_type: str | None = None,
           minutes: int = 3) -> list[tuple[int, int, int, int]]:
    query = {"from": to_rfc3339(START), "to": to_rfc3339(START + minutes * MINUTE)}
    if job_type is not None:
        query["type"] = job_type
    answer = client.get("/stats", query_string=query, headers=admin.headers)
    assert answer.status_code == 200, answer.json
    return [(b["enqueued"], b["claimed"], b["completed"], b["failed"])
            for b in answer.json["buckets"]]


@contextmanager
def statements(app: Flask) -> Iterator[list[str]]:
    """Every statement the app's engine sends meanwhile."""
    sent: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent.append(statement)

    engine = app.extensions["queuelog"].db.engine
    event.listen(engine, "before_cursor_execute", seen)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", seen)


@contextmanager
def job_stats_away(db: Database) -> Iterator[None]:
    """job_stats renamed for a while: every write to it fails, as the database's would."""
    with db.write() as conn:
        conn.execute(text("ALTER TABLE job_stats RENAME TO job_stats_away"))
    try:
        yield
    finally:
        with db.write() as conn:
            conn.execute(text("ALTER TABLE job_stats_away RENAME TO job_stats"))


def stats_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "queuelog-stats" and t.is_alive()]


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT_SECONDS} s for {what}"
        time.sleep(0.05)


def test_a_plain_steps_transaction_sends_no_stats_statement(
        app: Flask, client, api: Api, producer, worker, admin) -> None:
    with statements(app) as sent:
        made = api.enqueue(producer)
        claimed = api.claim(worker).json
        done = api.complete(worker, claimed["id"], lease_token=claimed["lease_token"])
    assert made.status_code == 201 and done.status_code == 200
    assert sent and not [statement for statement in sent if "job_stats" in statement]
    # Counted all the same: the read writes this process's counts first.
    assert counts(client, admin, "email", minutes=1) == [(1, 1, 1, 0)]


def test_one_statement_writes_every_type_and_minute_counted_since_the_last(
        app: Flask, client, api: Api, producer, admin, clock: ManualClock) -> None:
    api.enqueue(producer)
    api.enqueue(producer, type="pdf")
    clock.advance(60)
    api.enqueue(producer)
    clock.advance(60)  # the counts stay in the minutes of their transactions
    with statements(app) as sent:
        assert counts(client, admin, "email") == [(1, 0, 0, 0), (1, 0, 0, 0), (0, 0, 0, 0)]
    assert len([statement for statement in sent if "job_stats (" in statement]) == 1
    assert counts(client, admin, "pdf") == [(1, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0)]
    with app.extensions["queuelog"].db.read() as conn:
        assert conn.execute(select(func.count()).select_from(job_stats)).scalar() == 3


def test_a_rolled_back_transaction_counts_nothing(client, api: Api, producer, admin) -> None:
    unique = {"key": "report-7", "on_conflict": "reject"}
    assert api.enqueue(producer, unique=unique).status_code == 201
    # A batch is all or nothing: its second job meets the twin and the whole batch is
    # refused, the first job's enqueue (counted in the same transaction) with it.
    refused = client.post("/jobs/batch", headers=producer.headers, json={"jobs": [
        {"type": "email"}, {"type": "email", "unique": unique}, {"type": "pdf"}]})
    assert refused.status_code == 409, refused.json
    assert len(api.list(admin).json["jobs"]) == 1
    assert counts(client, admin, minutes=1) == [(1, 0, 0, 0)]


def test_two_apps_on_one_database_add_up(app: Flask, app_config: dict[str, Any], client,
                                         api: Api, producer, worker, admin) -> None:
    other = create_app(app_config)
    start_stats_flusher(other)
    try:
        assert stats_threads()
        other_api = Api(other.test_client())
        for _ in range(3):
            assert other_api.enqueue(producer).status_code == 201
        claimed = api.claim(worker).json
        api.complete(worker, claimed["id"], lease_token=claimed["lease_token"])
        # The other app's thread writes its counts within a second, unasked.
        wait_for(lambda: counts(client, admin, minutes=1) == [(3, 1, 1, 0)],
                 "the other app's counts")
    finally:
        other.extensions["queuelog"].close()
    assert not stats_threads()  # stopped with the services that started it


def test_closing_the_services_writes_what_is_left(app_config: dict[str, Any], producer,
                                                  admin) -> None:
    first = create_app(app_config)
    assert Api(first.test_client()).enqueue(producer).status_code == 201
    assert not stats_threads()  # the factory starts none: tests run no thread of their own
    first.extensions["queuelog"].close()
    second = create_app(app_config)
    try:
        assert counts(second.test_client(), admin, minutes=1) == [(1, 0, 0, 0)]
    finally:
        second.extensions["queuelog"].close()


def test_a_failed_write_keeps_the_counts_for_the_next(
        app: Flask, client, api: Api, producer, worker, admin,
        caplog: pytest.LogCaptureFixture) -> None:
    services = app.extensions["queuelog"]
    with job_stats_away(services.db):
        # The steps never touch job_stats: they go on while it cannot be written.
        assert api.enqueue(producer).status_code == 201
        claimed = api.claim(worker).json
        assert api.fail(worker, claimed["id"], lease_token=claimed["lease_token"]
                        ).status_code == 200
        with pytest.raises(SQLAlchemyError):
            services.stats_flusher.buffer.flush()
        with caplog.at_level(logging.WARNING, logger="app.jobs.timeline.stats_flusher"):
            for _ in range(3):
                services.stats_flusher.flush()
    with caplog.at_level(logging.WARNING, logger="app.jobs.timeline.stats_flusher"):
        services.stats_flusher.flush()
    messages = [record.getMessage() for record in caplog.records]
    assert len([m for m in messages if "did not take" in m]) == 1
    assert any("again" in m for m in messages)
    assert counts(client, admin, minutes=1) == [(1, 1, 0, 1)]


# A database refusing connections is PostgreSQL's (ALLOW_CONNECTIONS): collected for it alone.
@pytest.mark.parametrize("engine_name", ["postgresql"], indirect=True)
def test_a_refused_connection_keeps_the_counts_for_the_next(
        app: Flask, engine_name: str, request: pytest.FixtureRequest, client, api: Api,
        producer, admin) -> None:
    server = request.getfixturevalue("postgres_server")
    name = app.extensions["queuelog"].db.engine.url.database
    assert api.enqueue(producer).status_code == 201
    with server.admin.connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
        try:
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = :name"), {"name": name})
            with pytest.raises(SQLAlchemyError):
                app.extensions["queuelog"].stats_flusher.buffer.flush()
        finally:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
    assert counts(client, admin, minutes=1) == [(1, 0, 0, 0)]


def test_a_long_outage_keeps_the_newest_minutes_only(
        app: Flask, caplog: pytest.LogCaptureFixture) -> None:
    db = app.extensions["queuelog"].db
    buffer = StatsBuffer(db, kept_minutes=2)
    for minute in range(5):
        buffer.add(START + minute * MINUTE, {("email", "enqueued"): minute + 1})
    with job_stats_away(db), caplog.at_level(logging.WARNING), pytest.raises(SQLAlchemyError):
        buffer.flush()
    assert "6 counts of 3 minutes dropped" in caplog.text
    assert buffer.flush() == 2
    with db.read() as conn:
        kept = dict(conn.execute(select(job_stats.c.minute, job_stats.c.enqueued)).all())
    assert kept == {START + 3 * MINUTE: 4, START + 4 * MINUTE: 5}
