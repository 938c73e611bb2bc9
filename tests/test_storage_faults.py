"""A database whose storage refuses writes (issue 36): SQLite's disk full, its file read-only,
PostgreSQL's disk_full. Each is a 503 `storage-unavailable` problem with Retry-After, never a
500; the group commit fails every caller of a failed commit, so none is told 201; reads go
on; and writes succeed again once the space is back, in the same process."""

from __future__ import annotations

import logging
import shutil
import sqlite3
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from sqlalchemy.exc import OperationalError

from app import create_app
from app.core.callers import Role
from app.core.errors import StorageUnavailable
from app.core.storage_refusal import storage_refusal
from app.schedules.ticker import Ticker
from tests.faults.inject import SmallFilesystem, mount_unavailable, unavailable

THREADS = 6
ENQUEUES_PER_THREAD = 10


def _wrapped(error: Exception) -> OperationalError:
    return OperationalError("INSERT …", {}, error)


def _sqlite_error(setup: str, statement: str, uri: str) -> sqlite3.Error:
    connection = sqlite3.connect(uri, uri=True)
    try:
        connection.executescript(setup)
        connection.execute(statement)
        connection.commit()
    except sqlite3.Error as error:
        return error
    finally:
        connection.close()
    raise AssertionError("no error")


def test_sqlite_full_is_a_full_disk(tmp_path: Path) -> None:
    # max_page_count reached is SQLITE_FULL, as a full disk is: the same code, the same path.
    error = _sqlite_error("PRAGMA max_page_count=2; CREATE TABLE t (x);",
                          "INSERT INTO t SELECT randomblob(100000)",
                          f"file:{tmp_path / 'full.sqlite3'}")

    refusal = storage_refusal(_wrapped(error))

    assert refusal is not None
    assert isinstance(refusal[0], StorageUnavailable) and "full" in refusal[0].detail
    assert refusal[1] == "SQLITE_FULL"


def test_a_read_only_database_refuses_writes_as_storage(tmp_path: Path) -> None:
    path = tmp_path / "ro.sqlite3"
    sqlite3.connect(path).executescript("CREATE TABLE t (x);")
    error = _sqlite_error("", "INSERT INTO t VALUES (1)", f"file:{path}?mode=ro")

    refusal = storage_refusal(_wrapped(error))

    assert refusal is not None and "read-only" in refusal[0].detail
    assert refusal[1] == "SQLITE_READONLY"


def test_postgres_disk_full_is_a_full_disk() -> None:
    class DiskFull(Exception):
        sqlstate = "53100"

    refusal = storage_refusal(_wrapped(DiskFull()))
    assert refusal is not None and refusal[1] == "disk_full"


def test_the_ticker_says_a_full_disk_once_as_a_full_disk(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    error = _sqlite_error("PRAGMA max_page_count=2; CREATE TABLE t (x);",
                          "INSERT INTO t SELECT randomblob(100000)",
                          f"file:{tmp_path / 'full.sqlite3'}")

    def refused() -> None:
        raise _wrapped(error)

    class NoSchedules:
        fire_due = staticmethod(refused)

    ticker = Ticker(NoSchedules())  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="app.schedules.ticker"):
        ticker.tick()
        ticker.tick()
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 1 and "storage refuses writes (SQLITE_FULL)" in said[0]
    assert caplog.records[0].levelno == logging.ERROR


def test_a_locked_database_is_not_a_storage_refusal(tmp_path: Path) -> None:
    error = sqlite3.OperationalError("database is locked")
    error.sqlite_errorcode = 5  # type: ignore[attr-defined]  # SQLITE_BUSY
    assert storage_refusal(_wrapped(error)) is None
    assert storage_refusal(_wrapped(RuntimeError("no code"))) is None


# -- through the app, the database on a filesystem the test fills ------------------------------

@pytest.fixture
def small_disk() -> Iterator[SmallFilesystem]:
    reason = mount_unavailable()
    if reason:
        unavailable("a small filesystem", reason)
    with SmallFilesystem(size_bytes=4 * 1024 * 1024) as disk:
        yield disk


@pytest.fixture
def app_on_small_disk(small_disk: SmallFilesystem, sqlite_template: str) -> Iterator[Flask]:
    path = small_disk.path / "queuelog.sqlite3"
    shutil.copyfile(sqlite_template, path)
    application = create_app({"DATABASE_URL": f"sqlite:///{path}", "JOB_TYPES": ["email"],
                              "DB_POOL_SIZE": THREADS + 2, "TESTING": False})
    yield application
    application.extensions["queuelog"].db.engine.dispose()


def _headers(app: Flask, role: str) -> dict[str, str]:
    token = app.extensions["queuelog"].keys.create_key(f"{role}-1", Role(role))
    return {"Authorization": f"Bearer {token}"}


def _enqueue_at_once(app: Flask, headers: dict[str, str]) -> tuple[Counter[Any], list[int]]:
    """THREADS threads enqueueing together, so that the group commit gathers several callers
    in one commit: every answer, and the ids told 201."""
    answers: Counter[Any] = Counter()
    acknowledged: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(THREADS)

    def enqueue(thread: int) -> None:
        client = app.test_client()
        start.wait()
        for n in range(ENQUEUES_PER_THREAD):
            response = client.post("/jobs", headers=headers, json={
                "type": "email", "payload": {"thread": thread, "n": n, "pad": "x" * 4000}})
            with lock:
                if response.status_code == 201:
                    acknowledged.append(response.json["id"])
                    answers[201] += 1
                else:
                    answers[response.status_code, response.headers.get("Retry-After"),
                            response.content_type, response.json["type"]] += 1

    threads = [threading.Thread(target=enqueue, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers, acknowledged


def test_a_full_disk_fails_every_caller_of_the_group_commit_and_reads_go_on(
        app_on_small_disk: Flask, small_disk: SmallFilesystem,
        caplog: pytest.LogCaptureFixture) -> None:
    app = app_on_small_disk
    producer, admin = _headers(app, "producer"), _headers(app, "admin")
    client = app.test_client()
    before = client.post("/jobs", headers=producer, json={"type": "email", "payload": {}})
    assert before.status_code == 201
    small_disk.fill()

    answers, acknowledged = _enqueue_at_once(app, producer)

    refused = (503, "1", "application/problem+json",
               "https://queuelog.dev/problems/storage-unavailable")
    # A commit that still found room in the WAL acknowledged its callers; every other
    # caller was refused, and every acknowledged job is stored (see below).
    assert set(answers) <= {refused, 201}, answers
    assert answers[refused] > 0
    assert client.get(f"/jobs/{before.json['id']}", headers=admin).status_code == 200
    assert client.get("/jobs", headers=admin).status_code == 200
    assert "database storage refuses writes (SQLITE_FULL)" in caplog.text

    small_disk.free()
    after = client.post("/jobs", headers=producer, json={"type": "email", "payload": {}})
    assert after.status_code == 201
    for job_id in acknowledged:
        assert client.get(f"/jobs/{job_id}", headers=admin).status_code == 200
    app.extensions["queuelog"].db.engine.dispose()
    connection = sqlite3.connect(small_disk.path / "queuelog.sqlite3")
    try:
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        connection.close()
