"""The container's entry script and health check, run on the host (no container engine runs
here): `queuelog` and `gunicorn` on PATH are this worktree's, as the image's would be."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from tests.servers import REPO_ROOT, GunicornServer, bearer, server_environment

ENTRYPOINT = ["sh", str(REPO_ROOT / "docker" / "entrypoint.sh")]
HEALTHCHECK = [sys.executable, str(REPO_ROOT / "docker" / "healthcheck.py")]


@pytest.fixture
def image_like_env(tmp_path: Path) -> dict[str, str]:
    """The commands the image installs, on PATH, running this worktree's code."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "queuelog").write_text(
        f'#!/bin/sh\nexec "{sys.executable}" -c "from app.cli import main; main()" "$@"\n')
    (bin_dir / "gunicorn").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m gunicorn "$@"\n')
    for script in bin_dir.iterdir():
        script.chmod(0o755)
    return server_environment(tmp_path, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                              QUEUELOG_JOB_TYPES="email", GUNICORN_WORKERS="2",
                              GUNICORN_THREADS="4")


@pytest.mark.slow
def test_entry_script_brings_up_a_migrated_serving_instance_from_an_empty_volume(
        start_server: Callable[..., GunicornServer], image_like_env: dict[str, str],
        tmp_path: Path) -> None:
    volume = tmp_path / "volume"
    volume.mkdir()
    server = start_server(ENTRYPOINT, {**image_like_env, "QUEUELOG_DATA_DIR": str(volume)})
    server.wait_until_answering("/readyz")
    database = volume / "queuelog.sqlite3"
    assert database.exists()

    # What `docker exec … queuelog keys create` does, with the image's environment.
    operator_env = {**image_like_env, "QUEUELOG_DATABASE_URL": f"sqlite:///{database}"}
    created = subprocess.run(["queuelog", "keys", "create", "billing", "--role", "producer"],
                             env=operator_env, cwd=tmp_path, capture_output=True, text=True,
                             timeout=60, check=True)
    token = created.stdout.strip().splitlines()[-1]

    enqueued = requests.post(server.url_of("/jobs"), json={"type": "email", "payload": {"to": 1}},
                             headers=bearer(token), timeout=10)
    assert enqueued.status_code == 201
    fetched = requests.get(server.url_of(enqueued.headers["Location"]), headers=bearer(token),
                           timeout=10)
    assert fetched.json()["status"] == "pending"
    health_env = {**image_like_env, "QUEUELOG_BIND": f"0.0.0.0:{server.port}"}
    assert subprocess.run(HEALTHCHECK, env=health_env, timeout=30).returncode == 0

    assert server.stop() == 0  # SIGTERM reached gunicorn itself: the script exec'd it

    assert subprocess.run(HEALTHCHECK, env=health_env, timeout=30).returncode == 1
    # stdout holds the request lines only; the migration's output went to stderr.
    lines = [json.loads(line) for line in server.stdout().splitlines()]
    assert {"route": "/jobs", "status": 201, "key_name": "billing"}.items() <= next(
        line for line in lines if line["method"] == "POST").items()
    assert "database at head" in server.stderr()
    assert not list((tmp_path / "server-tmp").glob("queuelog-metrics-*"))


def test_entry_script_refuses_a_database_directory_it_cannot_write(
        image_like_env: dict[str, str], tmp_path: Path) -> None:
    missing = tmp_path / "not-mounted"
    result = subprocess.run(ENTRYPOINT, env={**image_like_env, "QUEUELOG_DATA_DIR": str(missing)},
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert f"{missing} is not a writable directory" in result.stderr
    assert not missing.exists()


def test_the_image_runs_the_entry_script_as_a_non_root_user_with_a_volume() -> None:
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    assert dockerfile.startswith("#") and "FROM python:3.11-slim" in dockerfile
    assert "\nUSER queuelog\n" in dockerfile
    assert 'VOLUME ["/var/lib/queuelog"]' in dockerfile
    assert "HEALTHCHECK" in dockerfile and "healthcheck.py" in dockerfile
    assert 'ENTRYPOINT ["/srv/queuelog/entrypoint.sh"]' in dockerfile
