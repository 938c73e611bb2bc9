"""GET /healthz and GET /readyz: no key needed; readiness means a reachable, migrated database."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from app import create_app
from app.storage.migrations import head_revision, upgrade
from app.web.problems import PROBLEM_CONTENT_TYPE
from tests.conftest import JOB_TYPES


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def unreachable_db_url(engine_name: str, tmp_path: Any, request: pytest.FixtureRequest) -> str:
    """A database URL of the test's engine that no database answers at."""
    if engine_name == "sqlite":
        return f"sqlite:///{tmp_path / 'no-such-directory' / 'queuelog.sqlite3'}"
    server = request.getfixturevalue("postgres_server")
    return server.url.set(host="127.0.0.1", port=_closed_port(),
                          database="queuelog").render_as_string(hide_password=False)


@pytest.fixture
def make_app() -> Iterator[Any]:
    apps: list[Flask] = []

    def make(database_url: str, **config: Any) -> Flask:
        application = create_app({"TESTING": True, "DATABASE_URL": database_url,
                                  "JOB_TYPES": JOB_TYPES, "DB_POOL_TIMEOUT_SECONDS": 2,
                                  **config})
        apps.append(application)
        return application

    yield make
    for application in apps:
        application.extensions["queuelog"].db.engine.dispose()


def test_healthz_answers_without_a_key(client: Any) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json == {"status": "ok"}


def test_healthz_answers_while_the_database_is_unreachable(make_app: Any,
                                                           unreachable_db_url: str) -> None:
    response = make_app(unreachable_db_url).test_client().get("/healthz")
    assert response.status_code == 200


def test_readyz_answers_ready_on_a_migrated_database_without_a_key(client: Any) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json == {"status": "ready", "revision": head_revision(), "maintenance": {
        "leader": False,  # the test's clock has not moved: no round has run
        "cascades": {"under_way": 0, "oldest_seconds": 0.0}, "failing": {}}}


def test_readyz_is_503_on_a_database_with_no_schema(make_app: Any, empty_db_url: str) -> None:
    response = make_app(empty_db_url).test_client().get("/readyz")
    assert response.status_code == 503
    assert response.content_type == PROBLEM_CONTENT_TYPE
    assert response.json["type"].endswith("/service-unavailable")
    assert "queuelog db upgrade" in response.json["detail"]


def test_readyz_is_503_on_a_database_behind_the_newest_migration(make_app: Any,
                                                                 empty_db_url: str) -> None:
    upgrade(empty_db_url, "0001")
    client = make_app(empty_db_url).test_client()
    response = client.get("/readyz")
    assert response.status_code == 503
    assert "0001" in response.json["detail"]

    upgrade(empty_db_url, "head")
    assert client.get("/readyz").status_code == 200


def test_readyz_is_a_503_problem_not_a_500_when_the_database_is_unreachable(
        make_app: Any, unreachable_db_url: str) -> None:
    client = make_app(unreachable_db_url, TESTING=False).test_client()
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.content_type == PROBLEM_CONTENT_TYPE
    assert response.json["status"] == 503
    assert response.headers["Retry-After"]
    # Nothing of the driver's message (host, user, file path) reaches the caller.
    assert "no-such-directory" not in response.get_data(as_text=True)
    assert "127.0.0.1" not in response.get_data(as_text=True)


def test_probes_take_no_other_method(client: Any) -> None:
    response = client.post("/readyz")
    assert response.status_code == 405
    assert response.content_type == PROBLEM_CONTENT_TYPE


def test_readyz_warns_when_no_job_types_are_configured(make_app: Any, db_url: str) -> None:
    response = make_app(db_url, JOB_TYPES=frozenset()).test_client().get("/readyz")
    assert response.status_code == 200
    assert response.get_json()["status"] == "ready"
    assert "QUEUELOG_JOB_TYPES is not set" in response.get_json()["warnings"][0]


def test_readyz_has_no_warnings_when_job_types_are_configured(client: Any) -> None:
    assert "warnings" not in client.get("/readyz").get_json()


def test_serving_without_job_types_warns_on_stderr_and_commands_do_not(tmp_path: Any) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUELOG_")}
    env["QUEUELOG_DATABASE_URL"] = f"sqlite:///{tmp_path / 'q.sqlite3'}"
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    started = subprocess.run([sys.executable, "-c", "import wsgi"], env=env,
                             cwd=env["PYTHONPATH"], capture_output=True, text=True, timeout=60)
    assert started.returncode == 0, started.stderr
    assert "QUEUELOG_JOB_TYPES is not set" in started.stderr
    assert started.stdout == ""
    env["QUEUELOG_JOB_TYPES"] = "email"
    configured = subprocess.run([sys.executable, "-c", "import wsgi"], env=env,
                                cwd=env["PYTHONPATH"], capture_output=True, text=True,
                                timeout=60)
    assert "QUEUELOG_JOB_TYPES" not in configured.stderr
    # An operator's command runs in a shell that may lack the service's settings: it would
    # only be told something untrue of the service.
    del env["QUEUELOG_JOB_TYPES"]
    command = subprocess.run([sys.executable, "-c", "from app.cli import main; main()",
                              "db", "upgrade"], env=env, cwd=env["PYTHONPATH"],
                             capture_output=True, text=True, timeout=60)
    assert command.returncode == 0, command.stderr
    assert "QUEUELOG_JOB_TYPES" not in command.stderr
