"""PostgreSQL connections are not pinged on checkout: one whose backend is gone is dropped
at checkout when its server closed it, and a write transaction whose first statement meets a
dead connection runs once more on another, unseen by the client. A connection that dies after
something may have been committed is never run again: no write is made twice. A step that is
one statement (autocommit) is its own commit, so it is never run again: it answers 503.

The steps that run in a transaction here are enqueues with tags (the job's INSERT, then its
tags') and a claim naming its types."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from sqlalchemy import event
from sqlalchemy.engine import make_url

from app import create_app
from app.core.callers import Role
from tests.conftest import JOB_TYPES, Api, Key
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.parametrize("engine_name", ["postgresql"], indirect=True)


def _admin(url: str) -> psycopg.Connection[Any]:
    parsed = make_url(url)
    return psycopg.connect(host=parsed.host, port=parsed.port or 5432, user=parsed.username,
                           dbname=parsed.database, autocommit=True)


def _terminate(url: str, pids: list[int]) -> None:
    """pg_terminate_backend of these backends, returning once they are gone."""
    with _admin(url) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))
        deadline = time.monotonic() + 10
        while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)",
                           (pids,)).fetchone() != (0,):
            assert time.monotonic() < deadline, "the backends would not end"
            time.sleep(0.01)


def _backends_of(url: str) -> list[int]:
    with _admin(url) as conn:
        return [pid for (pid,) in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'", (make_url(url).database,))]


def _jobs_stored(url: str) -> int:
    with _admin(url) as conn:
        row = conn.execute("SELECT count(*) FROM jobs").fetchone()
    return int(row[0]) if row else 0


@contextmanager
def _killed_after_checkout(app: Any, url: str) -> Iterator[list[int]]:
    """Every connection checked out in the block has its backend terminated between its
    checkout and its first statement: the first statement meets a dead connection. Yields
    the pids killed."""
    killed: list[int] = []

    def kill(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        if not killed:
            killed.append(dbapi_connection.info.backend_pid)
            _terminate(url, killed)

    pool = app.extensions["queuelog"].db.engine.pool
    event.listen(pool, "checkout", kill)
    try:
        yield killed
    finally:
        event.remove(pool, "checkout", kill)


@contextmanager
def _killed_after(app: Any, url: str, statement_start: str) -> Iterator[list[int]]:
    """The backend that runs the first statement starting with `statement_start` is
    terminated as soon as that statement has run (before the next, or before COMMIT)."""
    killed: list[int] = []
    engine = app.extensions["queuelog"].db.engine

    def kill(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if not killed and statement.lstrip().startswith(statement_start):
            killed.append(conn.connection.dbapi_connection.info.backend_pid)
            _terminate(url, killed)

    event.listen(engine, "after_cursor_execute", kill)
    try:
        yield killed
    finally:
        event.remove(engine, "after_cursor_execute", kill)


TAGGED = {"tags": ["eu"]}


def _steps_work(api: Api, producer: Key, worker: Key) -> None:
    job = api.enqueue(producer)
    assert job.status_code == 201, job.json
    claimed = api.claim(worker)
    assert claimed.status_code == 200, claimed.json
    done = api.complete(worker, claimed.json["id"], lease_token=claimed.json["lease_token"])
    assert done.status_code == 200, done.json


def test_pooled_connections_whose_backends_were_killed_are_replaced_unseen(
        engine_name, app, api, db_url, producer, worker):
    _steps_work(api, producer, worker)  # the pool now holds connections
    killed = _backends_of(db_url)
    assert killed
    _terminate(db_url, killed)

    _steps_work(api, producer, worker)
    _steps_work(api, producer, worker)
    assert not set(killed) & set(_backends_of(db_url))


def test_a_write_whose_first_statement_meets_a_dead_connection_runs_again_once(
        engine_name, app, api, db_url, producer, worker):
    _steps_work(api, producer, worker)
    stored = _jobs_stored(db_url)

    with _killed_after_checkout(app, db_url) as killed:
        response = api.enqueue(producer, **TAGGED)
    assert killed and response.status_code == 201, response.json
    assert _jobs_stored(db_url) == stored + 1

    with _killed_after_checkout(app, db_url) as killed:
        response = api.claim(worker, types=["email"])
    assert killed and response.status_code == 200, response.json
    assert api.get(producer, response.json["id"]).json["status"] == "running"


def test_a_one_statement_step_that_meets_a_dead_connection_is_not_run_again(
        engine_name, app, api, db_url, producer, worker):
    _steps_work(api, producer, worker)
    stored = _jobs_stored(db_url)

    with _killed_after_checkout(app, db_url) as killed:
        response = api.enqueue(producer)
    # Its statement may have been its commit: the client is told (503), and its retry is its
    # own. (The connection killed may be the key's lookup's instead, when the key is read
    # again: then the enqueue meets a live one.) Never stored twice.
    assert killed and response.status_code in (201, 503), response.json
    first = int(response.status_code == 201)
    assert _jobs_stored(db_url) == stored + first

    assert api.enqueue(producer).status_code == 201
    assert _jobs_stored(db_url) == stored + first + 1


def test_a_connection_killed_between_statements_is_not_run_again(
        engine_name, app, api, db_url, producer, worker):
    _steps_work(api, producer, worker)
    stored = _jobs_stored(db_url)

    with _killed_after(app, db_url, "INSERT INTO jobs") as killed:
        response = api.enqueue(producer, **TAGGED)
    assert killed and response.status_code == 503
    assert _jobs_stored(db_url) == stored  # undone whole, and not made again

    assert api.enqueue(producer).status_code == 201
    assert _jobs_stored(db_url) == stored + 1


@pytest.fixture
def proxied(postgres_server, clock) -> Iterator[tuple[Any, TcpProxy, str]]:
    url = make_url(postgres_server.create_database())
    proxy = TcpProxy(url.port or 5432, url.host or "127.0.0.1")
    proxy.start()
    application = create_app({
        "DATABASE_URL": url.set(port=proxy.port).render_as_string(hide_password=False),
        "JOB_TYPES": JOB_TYPES, "CLOCK": clock, "TESTING": True, "DB_POOL_SIZE": 2,
        "DB_POOL_TIMEOUT_SECONDS": 2,
    })
    yield application, proxy, url.render_as_string(hide_password=False)
    proxy.stop()
    application.extensions["queuelog"].db.engine.dispose()


def test_a_commit_whose_answer_is_lost_is_not_run_again(engine_name, proxied):
    application, proxy, url = proxied
    producer = Key("p", application.extensions["queuelog"].keys.create_key("p", Role.PRODUCER))
    api = Api(application.test_client())
    assert api.enqueue(producer).status_code == 201

    proxy.lose_answer_to(b"COMMIT")
    response = api.enqueue(producer, **TAGGED)

    assert proxy.answers_lost == 1
    # When the lost answer is the enqueue's COMMIT the client cannot know (503), and its
    # retry is its own; the COMMIT may also be of a note the process writes beside the
    # request (the key's activity), and then the enqueue answers. Never stored twice.
    assert response.status_code in (201, 503)
    assert _jobs_stored(url) == 2  # committed once, never twice
