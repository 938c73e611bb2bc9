"""Real gunicorn-served queuelog instances over fresh SQLite files, and worker runners as
subprocesses, for the client and worker tests. Traffic stays on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from app import create_app
from app.core.callers import Role
from queuelog_client import Client
from tests.servers import (
    UNCONFIGURED,
    WORKER_CLASS,
    GunicornServer,
    free_port,
    gunicorn_argv,
    server_environment,
)

ROOT = Path(__file__).resolve().parents[2]
JOB_TYPES = "email,pdf,sync"
START_TIMEOUT_SECONDS = 30.0

T = TypeVar("T")


def wait_until(probe: Callable[[], T], timeout: float = 30.0, what: str = "condition",
               interval: float = 0.05) -> T:
    """Poll `probe` until it returns something truthy; fail the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)




def _child_env(**extra: str) -> dict[str, str]:
    """The test's environment less its QUEUELOG_ settings, with the checkout's server and
    client importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUELOG_")}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), str(ROOT / "client"), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


class LiveServer:
    """gunicorn serving this checkout on a free loopback port over one SQLite file, which
    outlives restarts of the server."""

    def __init__(self, directory: Path, template: str, **settings: str) -> None:
        self.directory = directory
        database = directory / "queuelog.sqlite3"
        shutil.copyfile(template, database)
        self.db_url = f"sqlite:///{database}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = GunicornServer(
            gunicorn_argv(*UNCONFIGURED, "--workers", "2", "--worker-class", WORKER_CLASS,
                          "--threads", "8", "--bind", f"127.0.0.1:{self.port}"),
            server_environment(directory, QUEUELOG_DATABASE_URL=self.db_url,
                               QUEUELOG_JOB_TYPES=JOB_TYPES, **settings),
            port=self.port, logs=directory)
        self.admin_token = self.create_key("admin", "admin")

    def create_key(self, name: str, role: str, **limits: Any) -> str:
        app = create_app({"DATABASE_URL": self.db_url, "JOB_TYPES": JOB_TYPES})
        try:
            return app.extensions["queuelog"].keys.create_key(name, Role(role), **limits)
        finally:
            app.extensions["queuelog"].db.engine.dispose()

    def client(self, token: str | None = None, **options: Any) -> Client:
        return Client(self.url, token or self.admin_token, **options)

    def start(self) -> None:
        self.server.start()
        self.server.wait_for(self._answers, "the server to answer",
                             timeout=START_TIMEOUT_SECONDS)

    def _answers(self) -> bool:
        try:
            self.client(max_attempts=1, timeout=5).list_jobs(limit=1)
            return True
        except Exception:  # not listening yet, or not answering yet
            return False

    def stop(self) -> None:
        """Kill the whole process group (master and workers), like a crash of the host.
        Nothing is left to flush (SQLite commits with synchronous=FULL), and gunicorn's own
        shutdowns took seconds here (a graceful one waits on open connections; a quick one
        once left a worker behind for 15 s)."""
        self.server.kill()

    def log(self) -> str:
        return self.server.log_tail()

    def requests_to(self, route: str) -> int:
        """How many requests the server has logged for `route` (its URL rule, e.g.
        "/jobs/claim"): one JSON line each on its stdout."""
        count = 0
        for line in self.server.stdout().splitlines():
            with contextlib.suppress(ValueError):
                if json.loads(line).get("route") == route:
                    count += 1
        return count


@pytest.fixture
def live_server(tmp_path: Path, sqlite_template: str) -> Iterator[LiveServer]:
    server = LiveServer(tmp_path, sqlite_template)
    server.start()
    yield server
    server.stop()


class RunnerProcess:
    """`queuelog worker …` as a subprocess, its stdout and stderr in one log file."""

    def __init__(self, args: list[str], token: str, log_path: Path) -> None:
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "from app.cli import main; main()", "worker", *args],
                cwd=ROOT, env=_child_env(QUEUELOG_TOKEN=token), stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.process.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> int:
        return self.process.wait(timeout=timeout)

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=15)


@pytest.fixture
def start_runner(tmp_path: Path) -> Iterator[Callable[..., RunnerProcess]]:
    runners: list[RunnerProcess] = []

    def start(server: LiveServer, token: str, handler: str, *options: str,
              url: str | None = None) -> RunnerProcess:
        """A runner of `handler` against `server` (or `url`, a way to it)."""
        log_path = tmp_path / f"runner-{len(runners)}.log"
        runner = RunnerProcess(["--url", url or server.url, "--handler", handler, *options],
                               token, log_path)
        runners.append(runner)
        return runner

    yield start
    for runner in runners:
        runner.kill()
