"""The push dispatcher as the gunicorn master's child (QUEUELOG_DISPATCH=1, the container).

Why the master and not the entry script: the container's stop signal goes to PID 1 alone,
which is gunicorn (docker/entrypoint.sh execs it). As its child, the dispatcher is stopped
by it: SIGTERM as soon as the master begins its graceful shutdown (the first worker exit
with the listeners closed), and waited for at the master's exit, so the stop timeout covers
both at once rather than one after the other. It inherits the master's environment, the
metrics directory included, so GET /metrics shows its series. A dispatcher that dies is
started again after a pause (doubling up to a minute); one that exits 0 was told to stop.

This module imports nothing of the app: the child runs `python -m app dispatch`, which
reads and checks QUEUELOG_DISPATCH itself (and exits at once when it is off).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Any

VARIABLE = "QUEUELOG_DISPATCH"
RESTART_PAUSE_SECONDS = (1.0, 60.0)
# Beyond the dispatcher's own grace (QUEUELOG_DISPATCH_GRACE_SECONDS), before it is killed.
KILL_AFTER_EXTRA_SECONDS = 5.0


class Supervisor:
    def __init__(self, log: Any) -> None:
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> None:
        threading.Thread(target=self._run, name="queuelog-dispatch-supervisor",
                         daemon=True).start()

    def pid(self) -> int | None:
        process = self.process
        return None if process is None or process.poll() is not None else process.pid

    def _run(self) -> None:
        pause = RESTART_PAUSE_SECONDS[0]
        while not self.stopping.is_set():
            with self._lock:
                if self.stopping.is_set():
                    return
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "app", "dispatch", "--only-if-enabled"])
            self.log.info("queuelog dispatch started (pid %s)", self.process.pid)
            status = self.process.wait()
            if status == 0 or self.stopping.is_set():
                return
            self.log.error("queuelog dispatch exited with %s; starting it again in %.0f s",
                           status, pause)
            if self.stopping.wait(pause):
                return
            pause = min(pause * 2, RESTART_PAUSE_SECONDS[1])

    def signal_stop(self) -> None:
        """SIGTERM the dispatcher (once): it finishes or releases its deliveries."""
        with self._lock:
            if self.stopping.is_set():
                return
            self.stopping.set()
            process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)

    def wait(self) -> None:
        self.signal_stop()
        process = self.process
        if process is None:
            return
        grace = float(os.environ.get("QUEUELOG_DISPATCH_GRACE_SECONDS") or 20)
        try:
            process.wait(timeout=grace + KILL_AFTER_EXTRA_SECONDS)
        except (subprocess.TimeoutExpired, ValueError):
            process.kill()
            process.wait()


_supervisor: Supervisor | None = None


def wanted(environ: Any = os.environ) -> bool:
    return bool(environ.get(VARIABLE, "").strip())


def start(server: Any) -> None:
    global _supervisor
    if wanted() and _supervisor is None:
        _supervisor = Supervisor(server.log)
        _supervisor.start()


def live_pid() -> set[int]:
    pid = None if _supervisor is None else _supervisor.pid()
    return set() if pid is None else {pid}


def shutting_down(server: Any) -> None:
    """Called at each worker's exit: once the master has closed its listeners it is
    shutting down, and the dispatcher is told to stop too."""
    if _supervisor is not None and not server.LISTENERS:
        _supervisor.signal_stop()


def stop() -> None:
    if _supervisor is not None:
        _supervisor.wait()
