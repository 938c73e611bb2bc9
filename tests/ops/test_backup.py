"""`queuelog backup PATH`: a consistent, openable copy of the live SQLite database."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from app import create_app
from app.core.callers import Role
from tests.conftest import JOB_TYPES


@pytest.fixture
def make_app() -> Iterator[Callable[[str], Flask]]:
    apps: list[Flask] = []

    def make(database_url: str) -> Flask:
        application = create_app({"TESTING": True, "DATABASE_URL": database_url,
                                  "JOB_TYPES": JOB_TYPES})
        apps.append(application)
        return application

    yield make
    for application in apps:
        application.extensions["queuelog"].db.engine.dispose()


@pytest.fixture
def sqlite_app(make_app: Callable[[str], Flask], sqlite_template: str, tmp_path: Path) -> Flask:
    live = tmp_path / "live" / "queuelog.sqlite3"
    live.parent.mkdir()
    shutil.copyfile(sqlite_template, live)
    return make_app(f"sqlite:///{live}")


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_a_backup_taken_while_the_service_writes_is_consistent_and_openable(
        sqlite_app: Flask, make_app: Callable[[str], Flask], tmp_path: Path) -> None:
    token = sqlite_app.extensions["queuelog"].keys.create_key("producer-1", Role.PRODUCER)
    headers = {"Authorization": f"Bearer {token}"}
    stored: list[int] = []
    failures: list[int] = []
    stop = threading.Event()

    def write(writer: int) -> None:
        client = sqlite_app.test_client()
        n = 0
        while not stop.is_set():
            response = client.post("/jobs", headers=headers,
                                   json={"type": "email", "payload": {"writer": writer, "n": n}})
            if response.status_code != 201:
                failures.append(response.status_code)
                return
            stored.append(response.json["id"])
            n += 1

    writers = [threading.Thread(target=write, args=(w,), daemon=True) for w in range(2)]
    for writer in writers:
        writer.start()
    try:
        _wait_for(lambda: len(stored) >= 30, "the writers to get going")
        before = len(stored)
        target = tmp_path / "backups" / "queuelog-backup.sqlite3"
        target.parent.mkdir()
        result = sqlite_app.test_cli_runner().invoke(args=["backup", str(target)])
        after = len(stored)
        _wait_for(lambda: len(stored) >= after + 10, "writes to go on after the backup")
    finally:
        stop.set()
        for writer in writers:
            writer.join(timeout=30)

    assert result.exit_code == 0, result.output
    assert not failures
    copied = int(re.search(r"backed up (\d+) jobs to ", result.output)[1])
    assert before <= copied < len(stored)

    with sqlite3.connect(target) as copy:
        assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        rows = copy.execute("SELECT id, payload FROM jobs ORDER BY id").fetchall()
    # The database as of one instant: every job up to the newest one it holds, none missing.
    assert [job_id for job_id, _ in rows] == list(range(1, copied + 1))
    assert all(json.loads(payload)["writer"] in (0, 1) for _, payload in rows)
    assert not [p for p in target.parent.iterdir() if p.name.endswith(".partial")]

    # queuelog itself opens the copy: at the newest migration, keys and jobs in it.
    restored = make_app(f"sqlite:///{target}").test_client()
    assert restored.get("/readyz").status_code == 200
    listed = restored.get("/jobs", query_string={"limit": 500}, headers=headers)
    assert listed.status_code == 200
    assert len(listed.json["jobs"]) == min(copied, 500)


def test_a_backup_never_replaces_a_file_unless_forced(sqlite_app: Flask, tmp_path: Path) -> None:
    target = tmp_path / "existing.sqlite3"
    target.write_text("an older backup")
    runner = sqlite_app.test_cli_runner()

    refused = runner.invoke(args=["backup", str(target)])
    assert refused.exit_code == 1
    assert "exists; add --force" in refused.output
    assert target.read_text() == "an older backup"

    forced = runner.invoke(args=["backup", "--force", str(target)])
    assert forced.exit_code == 0, forced.output
    assert "backed up 0 jobs" in forced.output
    with sqlite3.connect(target) as copy:
        assert copy.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


def test_a_backup_refuses_to_overwrite_the_live_database(sqlite_app: Flask) -> None:
    live = sqlite_app.extensions["queuelog"].db.engine.url.database
    result = sqlite_app.test_cli_runner().invoke(args=["backup", "--force", live])
    assert result.exit_code == 1
    assert "live database" in result.output


def test_a_backup_into_a_missing_directory_says_so(sqlite_app: Flask, tmp_path: Path) -> None:
    result = sqlite_app.test_cli_runner().invoke(
        args=["backup", str(tmp_path / "nowhere" / "b.sqlite3")])
    assert result.exit_code == 1
    assert "is not a directory" in result.output


def test_backup_of_postgresql_points_to_pg_dump(make_app: Callable[[str], Flask],
                                                postgres_shared_url: Any,
                                                tmp_path: Path) -> None:
    app = make_app(postgres_shared_url)
    result = app.test_cli_runner().invoke(args=["backup", str(tmp_path / "b.sqlite3")])
    assert result.exit_code == 1
    assert "pg_dump" in result.output
    assert not (tmp_path / "b.sqlite3").exists()
