"""A long transaction on PostgreSQL is shown to the operator (docs/OPERATIONS.md, "A
transaction held open for a long time"): /metrics has queuelog_database_oldest_transaction_seconds,
and /readyz warns (staying 200) once it passes QUEUELOG_HORIZON_WARN_SECONDS. SQLite has no
such thing: no gauge, no warning."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import create_engine, text

from app import create_app
from app.config import load_settings
from app.core.callers import Role
from tests.ops.scrape import Scrape

GAUGE = "queuelog_database_oldest_transaction_seconds"
WARNING_SECONDS = 0.2


@contextmanager
def held_snapshot(database_url: str) -> Iterator[None]:
    """A read transaction with its snapshot taken (REPEATABLE READ on PostgreSQL), open for
    the block."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
            conn.execute(text("SELECT count(*) FROM jobs")).scalar_one()
            yield
            conn.rollback()
    finally:
        engine.dispose()


@pytest.fixture
def warning_app(app_config: dict[str, Any]) -> Iterator[Flask]:
    application = create_app({**app_config, "HORIZON_WARN_SECONDS": WARNING_SECONDS})
    yield application
    application.extensions["queuelog"].db.engine.dispose()


def _scrape(client: Any, admin: Any) -> Scrape:
    response = client.get("/metrics", headers=admin.headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    return Scrape(response.get_data(as_text=True))


def test_the_thresholds_former_name_is_read_when_the_new_one_is_not_set() -> None:
    former = "QUEUELOG_LONG_TRANSACTION_WARNING_SECONDS"
    assert load_settings({former: "60"})["HORIZON_WARN_SECONDS"] == 60
    assert load_settings({former: "60", "QUEUELOG_HORIZON_WARN_SECONDS": "120"})[
        "HORIZON_WARN_SECONDS"] == 120


def test_a_threshold_out_of_range_names_its_variable() -> None:
    # The threshold's former name (tests/ops/test_database_health.py checks its own).
    with pytest.raises(ValueError, match="QUEUELOG_LONG_TRANSACTION_WARNING_SECONDS"):
        load_settings({"QUEUELOG_LONG_TRANSACTION_WARNING_SECONDS": "0"})


def test_without_a_long_transaction_readyz_has_no_warning(client: Any) -> None:
    # The default threshold (300 s): no test holds a transaction that long.
    response = client.get("/readyz")
    assert response.status_code == 200
    assert "warnings" not in response.json


def test_the_gauge_is_on_postgresql_only(engine_name: str, client: Any, admin: Any) -> None:
    value = _scrape(client, admin).get(GAUGE)
    if engine_name == "sqlite":
        assert value is None
    else:
        assert value is not None and value >= 0


def test_a_transaction_held_past_the_threshold_shows_in_the_gauge_and_readyz(
        engine_name: str, warning_app: Flask, db_url: str) -> None:
    client = warning_app.test_client()
    admin = warning_app.extensions["queuelog"].keys.create_key("admin-1", Role.ADMIN)
    headers = {"Authorization": f"Bearer {admin}"}
    with held_snapshot(db_url):
        time.sleep(WARNING_SECONDS * 2)
        ready = client.get("/readyz")
        metrics = client.get("/metrics", headers=headers)
    assert ready.status_code == 200  # ready still: every request works, only slower
    value = Scrape(metrics.get_data(as_text=True)).get(GAUGE)
    if engine_name == "sqlite":
        # A SQLite reader holds back nothing: neither gauge nor warning.
        assert value is None
        assert "warnings" not in ready.json
        return
    assert value is not None and value >= WARNING_SECONDS * 2
    [warning] = ready.json["warnings"]
    assert "QUEUELOG_HORIZON_WARN_SECONDS" in warning
    assert "pg_stat_activity" in warning

