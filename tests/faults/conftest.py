"""Fixtures of the fault tests: a private PostgreSQL cluster per test process (the tests
restart it and cut its sessions, which the machine's shared cluster must never suffer), and
real gunicorn servers started on a given database."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.faults.inject import PrivatePostgres, postgres_unavailable, unavailable
from tests.servers import LiveServer, create_api_key


class ServerStarter:
    """`start_server(database_url, workers=4, threads=4, settings={...})`: `gunicorn wsgi:app`
    on a free loopback port over that database, returned once it answers;
    `start_server.many(count, database_url, ...)` starts `count` of them at once (their
    imports overlap: quicker on a small machine). Every server started is killed (its whole
    process group, at once: its database is thrown away) by stop_all()."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[LiveServer] = []

    def _make(self, database_url: str, **options: Any) -> LiveServer:
        server = LiveServer(database_url,
                            log_path=self.logs / f"gunicorn-{len(self.started)}.log", **options)
        self.started.append(server)
        return server

    def __call__(self, database_url: str, **options: Any) -> LiveServer:
        return self._make(database_url, **options).start()

    def many(self, count: int, database_url: str, **options: Any) -> list[LiveServer]:
        servers = [self._make(database_url, **options) for _ in range(count)]
        with ThreadPoolExecutor(max_workers=count) as pool:
            return list(pool.map(lambda server: server.start(), servers))

    def stop_all(self) -> None:
        for server in self.started:
            server.kill()


StartServer = ServerStarter


@pytest.fixture(scope="session")
def private_postgres() -> Iterator[PrivatePostgres]:
    """A PostgreSQL 15 cluster of this test process's own (one per xdist worker), started;
    a test that stops it starts it again before it ends. Destroyed with its files at the end
    of the session."""
    reason = postgres_unavailable()
    if reason:
        unavailable("private PostgreSQL cluster", reason)
    cluster = PrivatePostgres().init()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def private_database_url(private_postgres: PrivatePostgres) -> Iterator[str]:
    """A fresh, migrated database on the private cluster; the cluster is running again at
    the end of the test whatever the test did to it."""
    url = private_postgres.create_database()
    yield url
    if not private_postgres.running():
        private_postgres.start()


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[ServerStarter]:
    """A ServerStarter whose servers are stopped at teardown."""
    starter = ServerStarter(tmp_path)
    yield starter
    starter.stop_all()


class Keys:
    """One key of each role on a database, as the load and the tests use them."""

    def __init__(self, database_url: str) -> None:
        self.producer = create_api_key(database_url, "faults-producer", "producer")
        self.worker = create_api_key(database_url, "faults-worker", "worker")
        self.admin = create_api_key(database_url, "faults-admin", "admin")

    def worker_token(self, database_url: str, name: str) -> str:
        return create_api_key(database_url, name, "worker")


@pytest.fixture
def make_keys() -> Callable[[str], Keys]:
    return Keys
