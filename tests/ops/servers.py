"""Real gunicorn processes for tests: started in their own session on a free loopback port,
waited for with bounded waits, and killed as a group however the test ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[2]
# Variables of the developer's shell that would change what the server does.
_SCRUBBED_PREFIXES = ("QUEUELOG_", "GUNICORN_", "PROMETHEUS_MULTIPROC_DIR", "PORT")




def server_environment(tmp_path: Path, **overrides: str) -> dict[str, str]:
    """The test process's environment without queuelog's and gunicorn's settings, running
    this worktree's code, with its own TMPDIR (where the metrics directory appears)."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(_SCRUBBED_PREFIXES)}
    tmpdir = tmp_path / "server-tmp"
    tmpdir.mkdir(exist_ok=True)
    env.update(PYTHONPATH=str(ROOT), TMPDIR=str(tmpdir), PYTHONUNBUFFERED="1")
    env.update(overrides)
    return env


class Server:
    def __init__(self, argv: list[str], env: Mapping[str, str], port: int, logs: Path) -> None:
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.stdout_path = logs / f"stdout-{port}.log"
        self.stderr_path = logs / f"stderr-{port}.log"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(argv, cwd=ROOT, env=dict(env), stdout=out,
                                            stderr=err, stdin=subprocess.DEVNULL,
                                            start_new_session=True)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def url(self, path: str) -> str:
        return self.base_url + path

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            if self.process.poll() is not None:
                raise AssertionError(f"the server exited ({self.process.returncode}) while "
                                     f"waiting for {what}:\n{self.stderr()[-4000:]}")
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}:\n{self.stderr()[-4000:]}")

    def wait_until_answering(self, path: str = "/readyz", timeout: float = 60) -> None:
        def answers() -> bool:
            try:
                return requests.get(self.url(path), timeout=2).status_code == 200
            except requests.RequestException:
                return False

        self.wait_for(answers, f"GET {path} to answer 200", timeout)

    def send_signal(self, sig: int = signal.SIGTERM) -> None:
        """Signal the server's first process: gunicorn's master (the entry script execs it)."""
        os.kill(self.pid, sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Signal the server and wait for it to exit; returns its exit status."""
        if self.process.poll() is None:
            self.send_signal(sig)
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)


def gunicorn_argv(*extra: str) -> list[str]:
    return [sys.executable, "-m", "gunicorn", *extra, "wsgi:app"]




def bearer(token: str) -> dict[str, Any]:
    return {"Authorization": f"Bearer {token}"}
