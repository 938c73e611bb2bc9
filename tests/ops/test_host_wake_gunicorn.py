"""The workers of one gunicorn wake each other's waiting requests through Unix sockets in a
directory of their database under $TMPDIR (app/jobs/wake/host_wake.py): on SQLite a worker's
socket is bound while a request waits in it; on PostgreSQL, where one worker listens to the
database's notifications and tells the others, every worker's is bound from its start. A
stopped server leaves none behind."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from app.jobs.wake.host_wake import wake_directory
from app.storage.engine import database_identity
from tests.conftest import JOB_TYPES
from tests.servers import GunicornServer, bearer, gunicorn_argv, server_environment
from tests.servers import create_api_key as create_key

pytestmark = pytest.mark.slow


@pytest.fixture
def short_tmpdir() -> Iterator[Path]:
    # A socket's path must fit in about 100 bytes: pytest's own directories can be too deep.
    path = Path(tempfile.mkdtemp(prefix="ql-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def wake_directory_under(parent: Path, db_url: str) -> Path:
    """The wake directory a server of `db_url` makes under `parent` (as its $TMPDIR)."""
    return parent / Path(wake_directory(database_identity(db_url))).name


def sockets(directory: Path) -> list[Path]:
    return list(directory.iterdir()) if directory.exists() else []


def bound_from_the_start(db_url: str) -> bool:
    return db_url.startswith("postgresql")


def claim_while_a_job_is_enqueued(server: GunicornServer, db_url: str,
                                  directory: Path) -> None:
    """A claim waits in one of the server's two workers and gets the job enqueued meanwhile;
    while it waits, its worker's socket is bound in `directory`, of mode 0700."""
    producer = bearer(create_key(db_url, "producer-1", "producer"))
    worker = bearer(create_key(db_url, "worker-1", "worker"))
    server.wait_until_answering()
    if bound_from_the_start(db_url):
        server.wait_for(lambda: len(sockets(directory)) == 2, "both workers' sockets")
        assert {int(bound.name.split(".")[0]) for bound in sockets(directory)} == set(
            server.worker_pids())
    else:
        assert sockets(directory) == []  # nothing bound until a request waits

    answer: dict[str, Any] = {}

    def claim() -> None:
        answer["response"] = requests.post(server.url_of("/jobs/claim"),
                                           json={"wait_seconds": 20}, headers=worker,
                                           timeout=60)

    waiting = threading.Thread(target=claim)
    waiting.start()
    server.wait_for(lambda: bool(sockets(directory)), "the waiting claim's socket")
    bound = sockets(directory)[0]
    assert int(bound.name.split(".")[0]) in server.worker_pids()
    assert bound.parent.stat().st_mode & 0o777 == 0o700
    if not bound_from_the_start(db_url):
        assert len(sockets(directory)) == 1

    made = requests.post(server.url_of("/jobs"), json={"type": "email"}, headers=producer,
                         timeout=30)
    waiting.join(timeout=60)
    assert answer["response"].status_code == 200
    assert answer["response"].json()["id"] == made.json()["id"]


def test_a_waiting_claim_binds_its_workers_socket_and_a_stopped_server_leaves_none(
        start_server: Callable[..., GunicornServer], db_url: str, tmp_path: Path,
        short_tmpdir: Path) -> None:
    server = start_server(gunicorn_argv(), server_environment(
        tmp_path, QUEUELOG_DATABASE_URL=db_url, QUEUELOG_JOB_TYPES=",".join(sorted(JOB_TYPES)),
        GUNICORN_WORKERS="2", TMPDIR=str(short_tmpdir)))
    claim_while_a_job_is_enqueued(server, db_url, wake_directory_under(short_tmpdir, db_url))

    assert server.stop() == 0
    assert list(short_tmpdir.glob("queuelog-wake-*")) == []  # the last worker out removed it


@pytest.fixture
def own_db_url(db_url: str, request: pytest.FixtureRequest) -> str:
    """A database no other test uses. Its wake directory is named after the database, and
    under the shared /tmp the session's other PostgreSQL servers and apps bind theirs in the
    directory of the session's shared database (and a killed one leaves its socket there)."""
    if not db_url.startswith("postgresql"):
        return db_url  # a file of this test's own
    return str(request.getfixturevalue("postgres_server").create_database())


def test_a_tmpdir_too_deep_for_a_socket_binds_under_tmp_instead(
        start_server: Callable[..., GunicornServer], own_db_url: str, tmp_path: Path) -> None:
    db_url = own_db_url
    deep = tmp_path / ("deep" * 20)
    deep.mkdir()
    server = start_server(gunicorn_argv(), server_environment(
        tmp_path, QUEUELOG_DATABASE_URL=db_url, QUEUELOG_JOB_TYPES=",".join(sorted(JOB_TYPES)),
        GUNICORN_WORKERS="2", TMPDIR=str(deep)))
    under_tmp = wake_directory_under(Path("/tmp"), db_url)
    claim_while_a_job_is_enqueued(server, db_url, under_tmp)
    assert list(deep.glob("queuelog-wake-*")) == []

    assert server.stop() == 0
    assert not under_tmp.exists()
