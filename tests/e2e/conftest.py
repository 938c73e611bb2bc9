"""Fixtures for the end-to-end proofs: real gunicorn servers over real database files."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ENGINES
from tests.servers import LiveServer

StartServer = Callable[..., LiveServer]


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[StartServer]:
    """`start_server(database_url, workers=4, threads=4, settings={...})` starts
    `gunicorn wsgi:app` on a free loopback port over that database and returns once it
    answers; every server started is killed (its whole process group) at teardown, as
    tests/ops and tests/faults do: a graceful stop waited out its 5 s grace for each server a
    client still held a connection to, and proved nothing (tests/ops/test_gunicorn.py and
    test_stop_ends_long_polls.py test the graceful stop)."""
    started: list[LiveServer] = []

    def start(database_url: str, **options: Any) -> LiveServer:
        server = LiveServer(database_url, log_path=tmp_path / f"gunicorn-{len(started)}.log",
                            **options)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.kill()


@pytest.fixture
def sqlite_file_url(sqlite_template: str, tmp_path: Path) -> str:
    """A fresh, migrated SQLite file of its own."""
    path = tmp_path / "live.sqlite3"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture
def live_server(start_server: StartServer, sqlite_file_url: str) -> LiveServer:
    """`gunicorn wsgi:app`, 4 workers of the shipped worker class, on a free loopback port
    over a fresh SQLite file."""
    return start_server(sqlite_file_url)


@pytest.fixture(params=ENGINES)
def server_database_url(request: pytest.FixtureRequest, sqlite_file_url: str) -> str:
    """A fresh, migrated database of each engine, for servers to share."""
    if request.param == "sqlite":
        return sqlite_file_url
    return request.getfixturevalue("postgres_server").create_database()
