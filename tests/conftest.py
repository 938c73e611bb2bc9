"""Fixtures: a fresh, migrated database per test on each engine, the app, keys, helpers.

Every test that takes `app` (or `db_url`) runs once on SQLite and once on PostgreSQL. The
PostgreSQL half needs QUEUELOG_TEST_POSTGRES_URL (a server URL, e.g.
postgresql+psycopg://postgres@127.0.0.1:5432/postgres); without it that half is skipped,
and the run's summary says so.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app import create_app
from app.core.callers import Role
from app.core.clock import ManualClock
from app.storage.migrations import upgrade

pytest_plugins = ["tests.cpu_accounting"]

POSTGRES_URL_VARIABLE = "QUEUELOG_TEST_POSTGRES_URL"
JOB_TYPES = frozenset({"email", "pdf", "sync"})
ENGINES = [
    "sqlite",
    pytest.param("postgresql", marks=pytest.mark.skipif(
        not os.environ.get(POSTGRES_URL_VARIABLE),
        reason=f"PostgreSQL half: set {POSTGRES_URL_VARIABLE} to run it")),
]


# -- databases ------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A migrated SQLite file, copied for each test (cheaper than migrating each time)."""
    path = tmp_path_factory.mktemp("template") / "template.sqlite3"
    upgrade(f"sqlite:///{path}")
    return str(path)


class PostgresServer:
    """Creates throwaway databases on the test server and drops them at the end.

    A migrated database is a copy of a template migrated once per session (a copy takes a
    fraction of a second; twenty migrations take seconds). Each throwaway database commits
    without waiting for its WAL to reach the disk (synchronous_commit off, for that database
    only): a commit is as visible, as isolated and as ordered as with the server's setting,
    only not kept through a crash of the server itself, which no test here causes (the fault
    tests run a PostgreSQL cluster of their own, tests/faults/inject.py, with the setting on).
    """

    def __init__(self, url: str) -> None:
        self.url = make_url(url)
        self.admin = create_engine(self.url, isolation_level="AUTOCOMMIT")
        self.created: list[str] = []
        self._template: str | None = None

    def _url_of(self, name: str) -> str:
        return self.url.set(database=name).render_as_string(hide_password=False)

    def _create(self, template: str | None = None) -> str:
        name = f"queuelog_test_{uuid.uuid4().hex[:12]}"
        copy = f' TEMPLATE "{template}"' if template else ""
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"{copy}'))
            self.created.append(name)
            conn.execute(text(f'ALTER DATABASE "{name}" SET synchronous_commit = off'))
        return name

    def create_database(self, migrated: bool = True) -> str:
        if not migrated:
            return self._url_of(self._create())
        if self._template is None:
            template = self._create()
            upgrade(self._url_of(template))  # disposes its engine: no session stays behind
            self._template = template
        return self._url_of(self._create(template=self._template))

    def drop_all(self) -> None:
        with self.admin.connect() as conn:
            for name in self.created:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        self.admin.dispose()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    url = os.environ.get(POSTGRES_URL_VARIABLE)
    if not url:
        # Only without a server: .ci/run always sets the variable and fails the run when the
        # summary reports this half skipped.
        pytest.skip(f"PostgreSQL half: set {POSTGRES_URL_VARIABLE} to run it")
    server = PostgresServer(url)
    yield server
    server.drop_all()


@pytest.fixture(scope="session")
def postgres_shared_url(postgres_server: PostgresServer) -> str:
    """One migrated database for the session; each test empties it first."""
    return postgres_server.create_database()


# Every table but Alembic's emptied, and every sequence back at its start (ids from 1 again),
# in one statement. A test's few rows go by DELETE, in milliseconds, where a TRUNCATE makes new
# files for the table and each of its indexes (most of a second for all twenty); a table a test
# filled (thousands of rows and more) goes by TRUNCATE, which costs the same whatever it holds
# and leaves no dead rows for the next test to step over. No table references another (no
# foreign keys), so the order is free.
_EMPTY_POSTGRES = """
DO $$
DECLARE
    item record;
    held integer;
BEGIN
    FOR item IN SELECT tablename FROM pg_tables
                WHERE schemaname = current_schema() AND tablename <> 'alembic_version' LOOP
        EXECUTE 'SELECT count(*) FROM (SELECT FROM ' || quote_ident(item.tablename)
                || ' LIMIT 1000) AS sample' INTO held;
        IF held >= 1000 THEN
            EXECUTE 'TRUNCATE ' || quote_ident(item.tablename);
        ELSIF held > 0 THEN
            EXECUTE 'DELETE FROM ' || quote_ident(item.tablename);
        END IF;
    END LOOP;
    FOR item IN SELECT sequencename, start_value FROM pg_sequences
                WHERE schemaname = current_schema() AND last_value IS NOT NULL LOOP
        PERFORM setval(quote_ident(item.sequencename), item.start_value, false);
    END LOOP;
END
$$
"""


# The maintenance lead an earlier test's app kept (one it built itself and never stopped)
# ended, so that this test's app can take it: its session is ended, and the lock waited for
# (the server frees it as the session ends, a moment later).
_END_EARLIER_LEADERS = """
DO $$
BEGIN
    PERFORM pg_terminate_backend(pid) FROM pg_locks
    WHERE locktype = 'advisory' AND pid <> pg_backend_pid()
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database());
    FOR attempt IN 1..500 LOOP
        EXIT WHEN NOT EXISTS (
            SELECT FROM pg_locks WHERE locktype = 'advisory' AND pid <> pg_backend_pid()
              AND database = (SELECT oid FROM pg_database WHERE datname = current_database()));
        PERFORM pg_sleep(0.01);
    END LOOP;
END
$$
"""


def _empty_postgres(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(_EMPTY_POSTGRES)
    with engine.connect() as conn:
        conn.exec_driver_sql(_END_EARLIER_LEADERS)
        conn.commit()
    engine.dispose()


@pytest.fixture(params=ENGINES)
def engine_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def db_url(engine_name: str, request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """A migrated, empty database of the test's engine."""
    if engine_name == "sqlite":
        path = tmp_path / "queuelog.sqlite3"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        return f"sqlite:///{path}"
    url = request.getfixturevalue("postgres_shared_url")
    _empty_postgres(url)
    return url


@pytest.fixture
def empty_db_url(engine_name: str, request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """A database of the test's engine with no tables at all (for migration tests)."""
    if engine_name == "sqlite":
        return f"sqlite:///{tmp_path / 'empty.sqlite3'}"
    return request.getfixturevalue("postgres_server").create_database(migrated=False)


# -- the app ----------------------------------------------------------------------------------

@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start_us=1_800_000_000_000_000)  # 2027-01-15, away from any boundary


@pytest.fixture
def app_config(db_url: str, clock: ManualClock) -> dict[str, Any]:
    return {
        "TESTING": True,
        "DATABASE_URL": db_url,
        "JOB_TYPES": JOB_TYPES,
        "CLOCK": clock,
        "DB_POOL_SIZE": 4,
    }


@pytest.fixture
def app(app_config: dict[str, Any]) -> Iterator[Flask]:
    application = create_app(app_config)
    yield application
    application.extensions["queuelog"].close()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def runner(app: Flask) -> Any:
    return app.test_cli_runner()


# -- keys and helpers ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Key:
    name: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@pytest.fixture
def make_key(app: Flask) -> Any:
    def make(name: str, role: str, *, max_priority: Any = None,
             types: list[str] | None = None) -> Key:
        token = app.extensions["queuelog"].keys.create_key(
            name, Role(role), max_priority=max_priority, job_types=types)
        return Key(name, token)

    return make


@pytest.fixture
def producer(make_key: Any) -> Key:
    return make_key("producer-1", "producer")


@pytest.fixture
def worker(make_key: Any) -> Key:
    return make_key("worker-1", "worker")


@pytest.fixture
def admin(make_key: Any) -> Key:
    return make_key("admin-1", "admin")


class Api:
    """Short calls for tests: each returns the Flask test response."""

    def __init__(self, client: FlaskClient) -> None:
        self.client = client
        self._reason_codes: list[str] | None = None

    def _documented_reason_codes(self) -> list[str]:
        # Read once per test: the document is built from the app, which a test does not change.
        if self._reason_codes is None:
            schemas = self.client.get("/openapi.json").json["components"]["schemas"]
            self._reason_codes = schemas["Reason"]["properties"]["code"]["enum"]
        return self._reason_codes

    def enqueue(self, key: Key, headers: dict[str, str] | None = None, **body: Any) -> Any:
        body.setdefault("type", "email")
        return self.client.post("/jobs", json=body, headers={**key.headers, **(headers or {})})

    def claim(self, key: Key, **body: Any) -> Any:
        return self.client.post("/jobs/claim", json=body, headers=key.headers)

    def complete(self, key: Key, job_id: int, **body: Any) -> Any:
        return self.client.post(f"/jobs/{job_id}/complete", json=body, headers=key.headers)

    def fail(self, key: Key, job_id: int, **body: Any) -> Any:
        body.setdefault("error", "it broke")
        return self.client.post(f"/jobs/{job_id}/fail", json=body, headers=key.headers)

    def heartbeat(self, key: Key, job_id: int, **body: Any) -> Any:
        return self.client.post(f"/jobs/{job_id}/heartbeat", json=body, headers=key.headers)

    def cancel(self, key: Key, job_id: int) -> Any:
        return self.client.post(f"/jobs/{job_id}/cancel", headers=key.headers)

    def retry(self, key: Key, job_id: int) -> Any:
        return self.client.post(f"/jobs/{job_id}/retry", headers=key.headers)

    def get(self, key: Key, job_id: int) -> Any:
        return self.client.get(f"/jobs/{job_id}", headers=key.headers)

    def list(self, key: Key, **query: Any) -> Any:
        return self.client.get("/jobs", query_string=query, headers=key.headers)

    def explain(self, key: Key, job_id: int) -> dict[str, Any]:
        """The job's explanation, whose every reason code /openapi.json documents (a client
        generated from the document rejects any other)."""
        answer = self.client.get(f"/jobs/{job_id}/explain", headers=key.headers)
        assert answer.status_code == 200, answer.json
        for reason in answer.json["reasons"]:
            assert reason["code"] in self._documented_reason_codes(), reason
        explanation: dict[str, Any] = answer.json
        return explanation


@pytest.fixture
def api(client: FlaskClient) -> Api:
    return Api(client)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not os.environ.get(POSTGRES_URL_VARIABLE):
        skipped = sum(1 for report in terminalreporter.stats.get("skipped", [])
                      if "PostgreSQL half" in str(report.longrepr))
        if not skipped:
            return
        terminalreporter.write_line(
            f"NOTE: the PostgreSQL half of the suite was skipped ({skipped} of the skipped "
            f"tests); set {POSTGRES_URL_VARIABLE} (e.g. postgresql+psycopg://postgres@"
            "127.0.0.1:5432/postgres) to run it.", yellow=True, bold=True)


# -- the order the files run in ---------------------------------------------------------------

LONGEST_FILES = Path(__file__).with_name("longest_files.txt")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist, the files listed in longest_files.txt first, in its order, then the
    rest by their number of tests, most first. The processes take a file at a time in this
    order (scripts/test.sh passes --no-loadscope-reorder), so a long file starts while the
    short ones remain to share out, and no long file is left running alone at the end while
    the other process idles. A plain run keeps the collected order."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    listed = [line.strip() for line in LONGEST_FILES.read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    rank = {path: place for place, path in enumerate(listed)}
    tests_in = Counter(item.nodeid.split("::", 1)[0] for item in items)

    def place(item: pytest.Item) -> tuple[int, int]:
        path = item.nodeid.split("::", 1)[0]
        return rank.get(path, len(rank)), -tests_in[path]

    items.sort(key=place)  # stable: a file's tests keep their order, and stay together
