"""The ticker: off in apps the factory builds, firing when started, stopping cleanly, and
carrying on through a database that does not answer."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from app import create_app, start_scheduler, stop_scheduler
from app.core.clock import ManualClock
from app.schedules.ticker import Ticker
from tests.schedules.conftest import Schedules, set_clock


def _ticker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "queuelog-schedules" and t.is_alive()]


def test_the_factory_starts_no_ticker(app: Flask) -> None:
    assert "queuelog_ticker" not in app.extensions
    assert _ticker_threads() == []


def test_the_setting_keeps_the_ticker_off_where_the_app_is_served(
        app_config: dict[str, Any]) -> None:
    application = create_app({**app_config, "SCHEDULER": False})
    start_scheduler(application)
    assert "queuelog_ticker" not in application.extensions
    application.extensions["queuelog"].db.engine.dispose()


def test_a_started_ticker_fires_due_slots_and_stops(app: Flask, schedules: Schedules,
                                                    clock: ManualClock) -> None:
    set_clock(clock, "2027-01-15T08:00:00Z")
    schedules.create(cron="*/10 * * * *")
    app.config["SCHEDULER"] = True
    start_scheduler(app)
    ticker: Ticker = app.extensions["queuelog_ticker"]
    ticker.interval = 0.02
    try:
        set_clock(clock, "2027-01-15T08:10:00.100Z")
        deadline = time.monotonic() + 10
        while not schedules.jobs() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        stop_scheduler(app)
    assert schedules.slots() == ["2027-01-15T08:10:00Z"]
    assert not ticker.running


def test_a_database_outage_is_logged_once_and_firing_resumes(
        tmp_path: Path, sqlite_template: str, caplog: pytest.LogCaptureFixture) -> None:
    database = tmp_path / "q.sqlite3"
    database.write_bytes(Path(sqlite_template).read_bytes())
    application = create_app({"DATABASE_URL": f"sqlite:///{database}", "JOB_TYPES": "email",
                              "CLOCK": ManualClock(), "TESTING": True})
    ticker = Ticker(application.extensions["queuelog"].schedules)
    database.unlink()
    database.mkdir()  # the file is gone; a directory stands in its place: no database answers
    with caplog.at_level(logging.WARNING, logger="app.schedules.ticker"):
        for _ in range(3):
            ticker.tick()
        database.rmdir()
        database.write_bytes(Path(sqlite_template).read_bytes())
        application.extensions["queuelog"].db.engine.dispose()
        ticker.tick()
    messages = [record.getMessage() for record in caplog.records]
    assert len([m for m in messages if "did not answer" in m]) == 1
    assert any("answers again" in m for m in messages)
    application.extensions["queuelog"].db.engine.dispose()
