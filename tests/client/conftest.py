"""Real gunicorn-served queuelog instances over fresh SQLite files, and worker runners as
subprocesses, for the client and worker tests. Traffic stays on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from app import create_app
from app.keys.models import Role
from queuelog_client import Client
from tests.servers import free_port

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


def _gunicorn_flags() -> list[str]:
    # Recent gunicorns open a control socket at one fixed path per user; several test
    # servers (and other checkouts' tests) must not fight over it.
    from gunicorn.config import KNOWN_SETTINGS

    if any(setting.name == "control_socket_disable" for setting in KNOWN_SETTINGS):
        return ["--no-control-socket"]
    return []


class LiveServer:
    """gunicorn serving this checkout on a free loopback port over one SQLite file, which
    outlives restarts of the server."""

    def __init__(self, directory: Path, template: str) -> None:
        self.directory = directory
        database = directory / "queuelog.sqlite3"
        shutil.copyfile(template, database)
        self.db_url = f"sqlite:///{database}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = directory / "gunicorn.log"
        self.process: subprocess.Popen[bytes] | None = None
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
        env = _child_env(QUEUELOG_DATABASE_URL=self.db_url, QUEUELOG_JOB_TYPES=JOB_TYPES)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "-c", "/dev/null", "--workers", "2",
                 "--worker-class", "gthread", "--threads", "8",
                 "--bind", f"127.0.0.1:{self.port}", *_gunicorn_flags(), "wsgi:app"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"gunicorn exited at start:\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
                self.client(max_attempts=1, timeout=5).list_jobs(limit=1)
                return
            except Exception:  # not listening yet, or not answering yet
                time.sleep(0.05)
        raise AssertionError(f"gunicorn did not get ready:\n{self.log()}")

    def stop(self) -> None:
        """Kill the whole process group (master and workers), like a crash of the host.
        Nothing is left to flush (SQLite commits with synchronous=FULL), and gunicorn's own
        shutdowns took seconds here (a graceful one waits on open connections; a quick one
        once left a worker behind for 15 s)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=15)
        self.process = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


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

    def start(server: LiveServer, token: str, handler: str, *options: str) -> RunnerProcess:
        log_path = tmp_path / f"runner-{len(runners)}.log"
        runner = RunnerProcess(["--url", server.url, "--handler", handler, *options], token,
                               log_path)
        runners.append(runner)
        return runner

    yield start
    for runner in runners:
        runner.kill()
