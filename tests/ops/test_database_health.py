"""Who holds PostgreSQL's xmin horizon: GET /health/database names the session holding a
snapshot, the dashboard's overview shows it once past QUEUELOG_HORIZON_WARN_SECONDS, and the
maintenance leader logs it once. SQLite has no such horizon. Each holder here is a real
session on the test server, holding a REPEATABLE READ snapshot on a connection of its own."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from flask.testing import FlaskClient
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from app.config import load_settings
from app.core.clock import ManualClock
from app.storage.activity import horizon_holders, sees_every_session
from tests.conftest import Key
from tests.ui.conftest import sign_in

# Low enough for a test to pass it by holding its snapshot a moment.
THRESHOLD_SECONDS = 0.2
WATCH_LOGGER = "app.jobs.usecases.horizon_watch"


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    return {**app_config, "HORIZON_WARN_SECONDS": THRESHOLD_SECONDS}


def _libpq_url(db_url: str) -> str:
    return make_url(db_url).set(drivername="postgresql").render_as_string(
        hide_password=False)


@contextmanager
def held_snapshot(db_url: str, application_name: str) -> Iterator[psycopg.Connection[Any]]:
    """A session of its own holding a REPEATABLE READ snapshot (idle in transaction) for the
    block, as a forgotten BEGIN in psql would."""
    with psycopg.connect(_libpq_url(db_url), application_name=application_name) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT count(*) FROM jobs").fetchone()
        try:
            yield conn
        finally:
            conn.rollback()


def _ours(holders: list[dict[str, Any]], application_name: str) -> list[dict[str, Any]]:
    # The test server may hold other sessions (other tests, other databases): ours by name.
    return [holder for holder in holders if holder["application_name"] == application_name]


def _distinctive() -> str:
    return f"horizon-test-{uuid.uuid4().hex[:8]}"


def test_the_warning_threshold_defaults_to_five_minutes() -> None:
    assert load_settings({})["HORIZON_WARN_SECONDS"] == 300
    assert load_settings({"QUEUELOG_HORIZON_WARN_SECONDS": "2.5"})[
        "HORIZON_WARN_SECONDS"] == 2.5
    with pytest.raises(ValueError, match="QUEUELOG_HORIZON_WARN_SECONDS"):
        load_settings({"QUEUELOG_HORIZON_WARN_SECONDS": "0"})


def test_only_an_admin_key_reads_it(client: FlaskClient, make_key: Any) -> None:
    for role in ("producer", "worker"):
        refused = client.get("/health/database", headers=make_key(f"{role}-h", role).headers)
        assert refused.status_code == 403, refused.json
        assert refused.content_type == "application/problem+json"
    assert client.get("/health/database").status_code == 401
    assert client.get("/health/database",
                      headers=make_key("ops-h", "admin").headers).status_code == 200


def test_a_held_snapshot_is_named_by_health_database(
        engine_name: str, db_url: str, client: FlaskClient, admin: Key) -> None:
    if engine_name == "sqlite":
        answer = client.get("/health/database", headers=admin.headers)
        assert answer.status_code == 200
        assert answer.json == {
            "engine": "sqlite", "horizon": False,
            "detail": "SQLite has no xmin horizon: its readers hold back no removal of dead "
                      "rows, so nothing is listed.",
            "oldest_transaction_seconds": None, "threshold_seconds": THRESHOLD_SECONDS,
            "sees_every_session": None, "holders": []}
        return
    name = _distinctive()
    with held_snapshot(db_url, name) as holding:
        time.sleep(0.05)
        answer = client.get("/health/database", headers=admin.headers)
        assert answer.status_code == 200, answer.json
        body = answer.json
        (holder,) = _ours(body["holders"], name)
        assert holder["kind"] == "transaction"
        assert holder["pid"] == holding.info.backend_pid
        assert holder["state"] == "idle in transaction"
        assert holder["seconds"] > 0
        assert holder["since"].endswith("Z") and holder["name"] is None
        assert holder["client_addr"] is not None and holder["xmin_age"] >= 0
        assert holder["database"] == make_url(db_url).database
        assert body["engine"] == "postgresql" and body["horizon"] is True
        assert "detail" not in body
        assert body["oldest_transaction_seconds"] >= holder["seconds"] - 0.01
        assert body["threshold_seconds"] == THRESHOLD_SECONDS
        assert body["sees_every_session"] is True  # the tests' role is a superuser
        # A holder past the threshold leaves /readyz ready: it slows the queue, stops nothing.
        time.sleep(THRESHOLD_SECONDS)
        assert client.get("/readyz").status_code == 200
    after = client.get("/health/database", headers=admin.headers).json
    assert _ours(after["holders"], name) == []


def test_a_role_without_pg_read_all_stats_lists_what_it_may_see(postgres_server: Any) -> None:
    """Other roles' sessions come back with NULL columns: they are left out, not an error,
    and the role is told it does not see every session. (PostgreSQL's alone: SQLite has no
    roles, and no horizon.)"""
    db_url = postgres_server.create_database()
    role = f"queuelog_probe_{uuid.uuid4().hex[:8]}"
    admin_engine = create_engine(db_url, isolation_level="AUTOCOMMIT")
    with admin_engine.connect() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
    probe = create_engine(make_url(db_url).set(username=role, password=None))
    name = _distinctive()
    try:
        with held_snapshot(db_url, name), probe.connect() as conn:
            holders = horizon_holders(conn)
            assert sees_every_session(conn) is False
            assert all(holder.application_name != name for holder in holders)
    finally:
        probe.dispose()
        with admin_engine.connect() as conn:
            conn.exec_driver_sql(f"DROP ROLE {role}")
        admin_engine.dispose()


def test_the_overview_shows_a_holder_past_the_threshold_and_nothing_otherwise(
        engine_name: str, db_url: str, client: FlaskClient, admin: Key) -> None:
    sign_in(client, admin)
    if engine_name == "sqlite":
        assert "horizon-holders" not in client.get("/ui/").text
        return
    report = client.get("/health/database", headers=admin.headers).json
    page = client.get("/ui/").text
    if not any((holder["seconds"] or 0) > THRESHOLD_SECONDS for holder in report["holders"]):
        # Unless another session of the shared test server holds a snapshot past it too.
        assert "horizon-holders" not in page
    name = _distinctive()
    with held_snapshot(db_url, name) as holding:
        time.sleep(THRESHOLD_SECONDS + 0.1)
        page = client.get("/ui/").text
        assert 'id="horizon-holders"' in page
        row = page.split(f"<code>{name}</code>", 1)
        assert len(row) == 2, "the holder's application name is not shown"
        line = row[0].rsplit("<tr>", 1)[1] + row[1].split("</tr>", 1)[0]
        assert f"pid {holding.info.backend_pid}" in line
        assert "idle in transaction" in line
        assert f"SELECT pg_terminate_backend({holding.info.backend_pid})" in line
    page = client.get("/ui/").text
    assert name not in page


def test_the_leader_logs_each_holder_once_past_the_threshold(
        engine_name: str, db_url: str, app: Any, clock: ManualClock,
        caplog: pytest.LogCaptureFixture) -> None:
    def logged(name: str) -> list[str]:
        return [record.getMessage() for record in caplog.records
                if record.name == WATCH_LOGGER and name in record.getMessage()]

    caplog.set_level(logging.WARNING, logger=WATCH_LOGGER)
    maintenance = app.extensions["queuelog"].maintenance
    if engine_name == "sqlite":
        clock.advance(31)  # a maintenance round: the leader runs its chores
        assert maintenance.leading
        assert not any(record.name == WATCH_LOGGER for record in caplog.records)
        return
    first, second = _distinctive(), _distinctive()
    with held_snapshot(db_url, first) as holding:
        time.sleep(THRESHOLD_SECONDS + 0.1)
        clock.advance(1)  # a maintenance round: the leader runs its chores
        assert maintenance.leading
        (message,) = logged(first)
        assert message.startswith("database: a transaction (pid "
                                  f"{holding.info.backend_pid}, application '{first}'")
        assert "state 'idle in transaction'" in message
        assert "QUEUELOG_HORIZON_WARN_SECONDS" in message
        assert f"SELECT pg_terminate_backend({holding.info.backend_pid})" in message
        assert "SELECT count(*) FROM jobs" not in message  # never the statement
        clock.advance(1)  # within the 30 s between looks: no look
        clock.advance(31)  # a look: the same holder, not logged again
        assert len(logged(first)) == 1
        with held_snapshot(db_url, second):
            time.sleep(THRESHOLD_SECONDS + 0.1)
            clock.advance(31)
            assert len(logged(second)) == 1
            assert len(logged(first)) == 1
