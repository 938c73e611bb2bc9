"""The container: the image built from the Dockerfile and run with podman (over a Debian base
made here, tests/ops/podman.py), and its entry script and health check run on the host, where
`queuelog` and `gunicorn` on PATH are this worktree's, as the image's are."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.ops import podman as container
from tests.ops.podman import RUN_FLAGS, podman
from tests.servers import REPO_ROOT, GunicornServer, bearer, free_port, server_environment

ENTRYPOINT = ["sh", str(REPO_ROOT / "docker" / "entrypoint.sh")]
HEALTHCHECK = [sys.executable, str(REPO_ROOT / "docker" / "healthcheck.py")]
IMAGE_UID = "10001"
STOP_GRACE_SECONDS = 40  # more than gunicorn's graceful_timeout (30 s), as README says


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


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Dockerfile built over a Debian base, from wheels built here: no registry, no index.
    Without podman the tests that need the image skip, as the browser tests skip without a
    browser; in CI (CI=true, where .ci/run installs podman) they run, never skip."""
    if shutil.which("podman") is None and os.environ.get("CI") != "true":
        pytest.skip("podman is not installed (.ci/run installs it)")
    base = container.base_image()
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert container.python_version(base) == python, (
        f"the wheels are built by Python {python}; the base image {base} has another")
    with container.built_image(container.build_context(tmp_path_factory.mktemp("context")),
                               base) as name:
        yield name


class Container:
    """One `podman run` of the image, its port published on loopback only."""

    def __init__(self, image: str, volume: str) -> None:
        self.port = free_port()
        self.id = podman(
            "run", "--detach", *RUN_FLAGS, "--publish", f"127.0.0.1:{self.port}:8000",
            "--volume", f"{volume}:/var/lib/queuelog", "--env", "QUEUELOG_JOB_TYPES=email",
            "--env", "GUNICORN_WORKERS=2", "--env", "GUNICORN_THREADS=4", image,
        ).stdout.strip().splitlines()[-1]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_until_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(requests.RequestException):
                if requests.get(self.url("/readyz"), timeout=2).status_code == 200:
                    return
            state = podman("inspect", "--format", "{{.State.Status}}", self.id).stdout.strip()
            if state != "running" or time.monotonic() > deadline:
                raise AssertionError(f"the container is {state}, /readyz never answered 200:\n"
                                     f"{self.logs()}")
            time.sleep(0.2)

    def exec(self, *argv: str) -> str:
        return podman("exec", self.id, *argv).stdout

    def logs(self) -> str:
        logs = podman("logs", self.id, check=False)
        return logs.stdout + logs.stderr

    def exit_code(self) -> int:
        return int(podman("inspect", "--format", "{{.State.ExitCode}}", self.id).stdout)

    def remove(self) -> None:
        podman("rm", "--force", self.id, check=False)


@pytest.fixture
def run_container(image: str) -> Iterator[Callable[[], Container]]:
    """run_container() starts the image over this test's volume; all are removed at the end."""
    volume = f"queuelog-test-{uuid.uuid4().hex[:12]}"
    podman("volume", "create", volume)
    started: list[Container] = []

    def run() -> Container:
        started.append(Container(image, volume))
        return started[-1]

    yield run
    for each in started:
        each.remove()
    podman("volume", "rm", "--force", volume, check=False)


def _create_key(running: Container, name: str, role: str) -> dict[str, Any]:
    """A key made as README says, with `exec`: the token is the last line printed."""
    return bearer(running.exec("queuelog", "keys", "create", name, "--role", role)
                  .strip().splitlines()[-1])


@pytest.mark.slow
def test_the_image_serves_jobs_as_non_root_and_keeps_them_in_its_volume_across_restarts(
        run_container: Callable[[], Container]) -> None:
    first = run_container()
    first.wait_until_ready()
    # gunicorn, PID 1 (the entry script exec'd it), and anything exec'd run unprivileged.
    assert re.search(rf"^Uid:\s+{IMAGE_UID}\s", first.exec("cat", "/proc/1/status"), re.M)
    assert first.exec("id", "-u").strip() == IMAGE_UID
    assert podman("healthcheck", "run", first.id, check=False).returncode == 0

    producer = _create_key(first, "shop", "producer")
    worker = _create_key(first, "mailer", "worker")
    enqueued = requests.post(first.url("/jobs"), json={"type": "email", "payload": {"to": 1}},
                             headers=producer, timeout=10)
    assert enqueued.status_code == 201, enqueued.text
    claimed = requests.post(first.url("/jobs/claim"), headers=worker, timeout=10)
    assert claimed.status_code == 200, claimed.text
    job = claimed.json()
    assert job["id"] == enqueued.json()["id"] and job["status"] == "running"
    completed = requests.post(first.url(f"/jobs/{job['id']}/complete"), headers=worker,
                              json={"lease_token": job["lease_token"], "result": {"sent": True}},
                              timeout=10)
    assert completed.status_code == 200, completed.text

    # The stop signal reaches gunicorn, which finishes and exits 0 within the grace period;
    # a container still running at its end would be killed (exit 137).
    podman("stop", "--time", str(STOP_GRACE_SECONDS), first.id,
           timeout=STOP_GRACE_SECONDS + 30)
    assert first.exit_code() == 0
    assert "Handling signal: term" in first.logs()

    second = run_container()  # a new container over the same volume
    second.wait_until_ready()
    kept = requests.get(second.url(f"/jobs/{job['id']}"), headers=producer, timeout=10)
    assert kept.status_code == 200, kept.text
    assert kept.json()["status"] == "completed" and kept.json()["result"] == {"sent": True}
    # Already at head: the entry script's upgrade on the second start migrated nothing.
    assert "Running upgrade" not in second.logs()
