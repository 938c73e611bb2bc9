"""Real gunicorn servers for the end-to-end tests: start `gunicorn wsgi:app` on a free loopback
port over a given database, wait until it answers, stop it or kill -9 its whole process group.

The server runs this checkout's code: its working directory and PYTHONPATH are the repository
root, and `-c /dev/null` keeps it from reading a gunicorn.conf.py there, so each test states
every setting it relies on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import requests
from sqlalchemy.engine import make_url

from app.clock import Clock
from app.db import Database, make_engine
from app.jobs.models import Priority
from app.keys.models import Role
from app.keys.service import KeyService

REPO_ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
STARTUP_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 15.0


def free_port() -> int:
    """A loopback port nobody listens on right now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _gunicorn_knows(flag: str) -> bool:
    from gunicorn.config import KNOWN_SETTINGS

    return any(flag in (setting.cli or ()) for setting in KNOWN_SETTINGS)


def _process_group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of the group; a zombie holds no file or lock any more."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command may hold spaces and parentheses; the fields after its last ')' don't.
        fields = stat.rpartition(")")[2].split()
        state, group = fields[0], int(fields[2])
        if group == pgid and state != "Z":
            members.append(int(entry.name))
    return members


class LiveServer:
    """One gunicorn master and its workers, in a process group of their own."""

    def __init__(self, database_url: str, *, log_path: Path, workers: int = 4,
                 threads: int = 4, settings: Mapping[str, str] | None = None,
                 port: int | None = None) -> None:
        self.database_url = database_url
        self.log_path = log_path
        self.workers = workers
        self.threads = threads
        self.settings = dict(settings or {})
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def _command(self) -> list[str]:
        command = [
            sys.executable, "-m", "gunicorn",
            "-c", os.devnull,
            "--bind", f"{HOST}:{self.port}",
            "--workers", str(self.workers),
            "--worker-class", "gthread",
            "--threads", str(self.threads),
            "--timeout", "120",
            "--graceful-timeout", "5",
        ]
        # Newer gunicorns open a control socket at one fixed path per user; two servers at
        # once would fight over it.
        if _gunicorn_knows("--no-control-socket"):
            command.append("--no-control-socket")
        return [*command, "wsgi:app"]

    def _environment(self) -> dict[str, str]:
        env = {name: value for name, value in os.environ.items()
               if not name.startswith("QUEUELOG_") and name != "GUNICORN_CMD_ARGS"}
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        env.update({
            "QUEUELOG_DATABASE_URL": self.database_url,
            "QUEUELOG_JOB_TYPES": "email,pdf,sync",
            "QUEUELOG_DB_POOL_SIZE": str(self.threads),
        })
        env.update({f"QUEUELOG_{key}": value for key, value in self.settings.items()})
        return env

    def start(self, timeout: float = STARTUP_TIMEOUT_SECONDS) -> LiveServer:
        """Start the server and return once it answers GET /openapi.json. When its port was
        taken in between, start again on another."""
        for _attempt in range(3):
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen(
                    self._command(), cwd=REPO_ROOT, env=self._environment(),
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            if self._wait_until_ready(timeout):
                return self
            self.kill()
            if "in use" not in self.log_tail():
                break
            self.port = free_port()
        raise RuntimeError(f"gunicorn did not start; its log ends with:\n{self.log_tail()}")

    def _wait_until_ready(self, timeout: float) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                if requests.get(f"{self.url}/openapi.json", timeout=2).status_code == 200:
                    return True
            except requests.RequestException:
                pass
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        """SIGTERM the group (a graceful gunicorn shutdown), SIGKILL what is left."""
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        self.kill()

    def kill(self) -> None:
        """kill -9 the master and every worker at once, and wait until all are gone."""
        if self.process is None:
            return
        pgid = self.process.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError("the gunicorn master outlived SIGKILL") from exc
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        while _process_group_members(pgid):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"gunicorn workers outlived SIGKILL: {_process_group_members(pgid)}")
            time.sleep(0.05)
        self.process = None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def create_api_key(database_url: str, name: str, role: str, *,
                   max_priority: str | None = None, types: Iterable[str] | None = None) -> str:
    """Create a key as the operator would, straight in the database; returns its token."""
    engine = make_engine(database_url, pooled=False)
    try:
        return KeyService(Database(engine), Clock()).create_key(
            name, Role(role),
            max_priority=Priority.from_label(max_priority) if max_priority else None,
            job_types=types)
    finally:
        engine.dispose()


def sqlite_path(database_url: str) -> str:
    path = make_url(database_url).database
    assert path, database_url
    return path

