"""Real gunicorn servers for the tests and the benchmarks, from this checkout: started in a
session of their own on a loopback port, waited for with bounded waits, stopped gracefully
or killed with their whole process group however the caller ends.

Two kinds of launch: with the shipped gunicorn.conf.py (the default: `gunicorn_argv()` from
the repository root, the address from QUEUELOG_BIND), or with UNCONFIGURED, where gunicorn
reads no settings file and the caller states every setting it relies on (LiveServer).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from app.core.callers import Role
from app.core.clock import Clock
from app.core.priorities import Priority
from app.keys.service import KeyService
from app.storage.engine import Database, make_engine

REPO_ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
STARTUP_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 15.0
# No gunicorn.conf.py; and no control socket, which gunicorn opens at one fixed path per user,
# where two servers at once would fight over it.
UNCONFIGURED = ("-c", os.devnull, "--no-control-socket")
# The worker class gunicorn.conf.py ships.
WORKER_CLASS = "queuelog_gunicorn.worker.BufferingThreadWorker"
# Variables of the caller's shell that would change what a server does.
_SCRUBBED_PREFIXES = ("QUEUELOG_", "GUNICORN_", "PROMETHEUS_MULTIPROC_DIR", "PORT")


def free_port() -> int:
    """A loopback port nobody listens on right now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def server_environment(directory: Path, **overrides: str) -> dict[str, str]:
    """The caller's environment without queuelog's and gunicorn's settings, running this
    checkout's code, with a TMPDIR of its own under `directory` (where the metrics directory
    appears)."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(_SCRUBBED_PREFIXES)}
    tmpdir = directory / "server-tmp"
    tmpdir.mkdir(parents=True, exist_ok=True)
    env.update(PYTHONPATH=str(REPO_ROOT), TMPDIR=str(tmpdir), PYTHONUNBUFFERED="1")
    env.update(overrides)
    return env


def gunicorn_argv(*flags: str, app: str = "wsgi:app") -> list[str]:
    return [sys.executable, "-m", "gunicorn", *flags, app]


def bearer(token: str) -> dict[str, Any]:
    return {"Authorization": f"Bearer {token}"}


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


class GunicornServer:
    """One command that runs gunicorn (gunicorn itself, or a script that execs it) on `port`,
    in a process group of its own, its output in `logs`. start() may be called again after
    stop() or kill(): a restart on the same port."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], *, port: int, logs: Path,
                 name: str | None = None, keep_stdout: bool = True,
                 cwd: Path = REPO_ROOT, host: str = HOST) -> None:
        self.argv = list(argv)
        self.host = host  # where it listens: loopback, or a network namespace's address
        self.cwd = cwd  # another checkout (a previous release, for a benchmark) runs from its own
        self.env = dict(env)
        self.port = port
        name = name or f"gunicorn-{port}"
        self.stdout_path = logs / f"{name}.stdout.log" if keep_stdout else None
        self.stderr_path = logs / f"{name}.stderr.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def url_of(self, path: str) -> str:
        return self.url + path

    def command(self) -> list[str]:
        return self.argv

    def start(self) -> GunicornServer:
        """Start the command; it is not answering yet (see wait_until_answering)."""
        with contextlib.ExitStack() as files:
            stdout: Any = subprocess.DEVNULL  # one JSON line per request, when not kept
            if self.stdout_path is not None:
                stdout = files.enter_context(self.stdout_path.open("ab"))
            stderr = files.enter_context(self.stderr_path.open("ab"))
            self.process = subprocess.Popen(
                self.command(), cwd=self.cwd, env=self.env, stdout=stdout, stderr=stderr,
                stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def stdout(self) -> str:
        assert self.stdout_path is not None, "stdout was not kept"
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.stderr().splitlines()[-lines:])

    def wait_for(self, condition: Callable[[], bool], what: str,
                 timeout: float = STARTUP_TIMEOUT_SECONDS) -> None:
        """Poll `condition` until it holds; fail when the server exits or `timeout` passes."""
        assert self.process is not None, "not started"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited ({self.process.returncode}) while "
                                   f"waiting for {what}:\n{self.log_tail()}")
            time.sleep(0.1)
        raise RuntimeError(f"timed out waiting for {what}:\n{self.log_tail()}")

    def answers(self, path: str) -> bool:
        """Whether GET `path` answers 200 now."""
        connection = http.client.HTTPConnection(self.host, self.port, timeout=2)
        try:
            connection.request("GET", path)
            return connection.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            connection.close()

    def wait_until_answering(self, path: str = "/readyz",
                             timeout: float = STARTUP_TIMEOUT_SECONDS) -> None:
        self.wait_for(lambda: self.answers(path), f"GET {path} to answer 200", timeout)

    def worker_pids(self) -> list[int]:
        children = Path(f"/proc/{self.pid}/task/{self.pid}/children")
        return [int(pid) for pid in children.read_text().split()]

    def send_signal(self, sig: int = signal.SIGTERM) -> None:
        """Signal the first process: gunicorn's master (a script in front execs it)."""
        os.kill(self.pid, sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Signal the master (SIGTERM: a graceful shutdown) and wait for it to exit; returns
        its exit status. Whatever is left of the group is killed then."""
        assert self.process is not None, "not started"
        try:
            if self.process.poll() is None:
                self.send_signal(sig)
            return self.process.wait(timeout=timeout)
        finally:
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

    def __enter__(self) -> GunicornServer:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.stop()
            self.kill()


class LiveServer(GunicornServer):
    """`gunicorn wsgi:app` without the shipped settings, over a given database: the end-to-end
    tests state every setting they rely on."""

    def __init__(self, database_url: str, *, log_path: Path, workers: int = 4,
                 threads: int = 4, settings: Mapping[str, str] | None = None,
                 port: int | None = None) -> None:
        self.database_url = database_url
        self.workers = workers
        self.threads = threads
        env = server_environment(log_path.parent, **{
            "QUEUELOG_DATABASE_URL": database_url,
            "QUEUELOG_JOB_TYPES": "email,pdf,sync",
            "QUEUELOG_DB_POOL_SIZE": str(threads),
            **{f"QUEUELOG_{key}": value for key, value in (settings or {}).items()},
        })
        super().__init__([], env, port=port or free_port(), logs=log_path.parent,
                         name=log_path.stem)

    def command(self) -> list[str]:
        return gunicorn_argv(
            *UNCONFIGURED,
            "--bind", f"{HOST}:{self.port}",
            "--workers", str(self.workers),
            "--worker-class", WORKER_CLASS,
            "--threads", str(self.threads),
            "--timeout", "120",
            "--graceful-timeout", "5",
        )

    def start(self, timeout: float = STARTUP_TIMEOUT_SECONDS) -> LiveServer:
        """Start the server and return once it answers GET /openapi.json. When its port was
        taken in between, start again on another."""
        for _attempt in range(3):
            super().start()
            try:
                self.wait_until_answering("/openapi.json", timeout)
                return self
            except RuntimeError:
                self.kill()
                if "in use" not in self.log_tail():
                    break
                self.port = free_port()
        raise RuntimeError(f"gunicorn did not start; its log ends with:\n{self.log_tail()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_SECONDS) -> int:
        """SIGTERM (a graceful gunicorn shutdown), SIGKILL what is left."""
        if self.process is None:
            return 0
        try:
            return super().stop(sig, timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -signal.SIGKILL


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

