"""The servers the HTTP benchmarks measure, both under the shipped gunicorn.conf.py (only the
bind address and what `overrides` set differ from production): queuelog, and the bare Flask
baseline (bench/baseline_app.py). They are launched by the tests' launcher, tests/servers.py.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.data import JOB_TYPES
from tests.servers import HOST, GunicornServer, free_port, gunicorn_argv, server_environment

# Set by the tests' smoke runs: the workers each server runs (the shipped settings otherwise).
SMOKE_WORKERS_VARIABLE = "QUEUELOG_BENCH_SMOKE_WORKERS"


def gunicorn_server(app: str, directory: str, overrides: dict[str, str],
                    ready_path: str = "/readyz", root: Path | None = None,
                    keep_stdout: bool = False) -> GunicornServer:
    """gunicorn serving `app` from the project root, answering once this returns.
    `keep_stdout` keeps the request log (one JSON line per request) for the caller to read."""
    port = free_port()
    logs = Path(directory) / f"server-{port}"
    env = server_environment(logs, QUEUELOG_BIND=f"{HOST}:{port}", **overrides)
    # The tests' smoke runs (tests/bench) ask for one worker per server: they read no figure,
    # and a server of one worker boots in half the CPU. A script's own GUNICORN_WORKERS wins.
    smoke_workers = os.environ.get(SMOKE_WORKERS_VARIABLE)
    if smoke_workers and "GUNICORN_WORKERS" not in overrides:
        env["GUNICORN_WORKERS"] = smoke_workers
    # stdout carries one JSON line per request; read only when `keep_stdout`.
    if root is not None:  # another checkout: its code, from its own directory
        env["PYTHONPATH"] = str(root)
    server = GunicornServer(gunicorn_argv(app=app), env, port=port, logs=logs,
                            keep_stdout=keep_stdout,
                            **({} if root is None else {"cwd": root})).start()
    try:
        server.wait_until_answering(ready_path)
    except BaseException:
        server.kill()
        raise
    return server


def queuelog_server(directory: str, url: str, *, keep_stdout: bool = False,
                    root: Path | None = None, **overrides: str) -> GunicornServer:
    """queuelog over `url`; `root` serves another checkout's code (gunicorn_server)."""
    return gunicorn_server("wsgi:app", directory, {
        "QUEUELOG_DATABASE_URL": url, "QUEUELOG_JOB_TYPES": JOB_TYPES, **overrides},
        root=root, keep_stdout=keep_stdout)


def baseline_server(directory: str, **overrides: str) -> GunicornServer:
    return gunicorn_server("bench.baseline_app:app", directory, overrides, ready_path="/healthz")


def worker_memory_kib(pid: int) -> dict[str, int]:
    """VmHWM (peak resident set) and VmRSS of a process, in KiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmHWM", "VmRSS"):
            values[name] = int(rest.split()[0])
    return values
