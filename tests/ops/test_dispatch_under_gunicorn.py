"""QUEUELOG_DISPATCH=1: the shipped gunicorn.conf.py runs the dispatcher as the master's
child, GET /metrics shows its series, and stopping gunicorn stops it (exit 0)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from tests.conftest import JOB_TYPES
from tests.dispatch.receiver import Receiver, Reply
from tests.servers import (
    REPO_ROOT,
    GunicornServer,
    bearer,
    create_api_key,
    gunicorn_argv,
    server_environment,
)

pytestmark = pytest.mark.slow


def _children(pid: int) -> list[int]:
    # Of every thread: the master starts the dispatcher from a thread of its own.
    return [int(child) for path in Path(f"/proc/{pid}/task").glob("*/children")
            for child in path.read_text().split()]


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def test_the_master_runs_the_dispatcher_and_stops_it(
        start_server: Callable[..., GunicornServer], db_url: str, tmp_path: Path) -> None:
    admin = create_api_key(db_url, "admin", "admin")
    producer = create_api_key(db_url, "shop", "producer")
    env = server_environment(tmp_path, QUEUELOG_DATABASE_URL=db_url,
                             QUEUELOG_JOB_TYPES=",".join(sorted(JOB_TYPES)),
                             QUEUELOG_DISPATCH="1", GUNICORN_WORKERS="2",
                             QUEUELOG_METRICS_PUBLIC="1",
                             PYTHONPATH=f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'client'}")
    server = start_server(gunicorn_argv(), env)
    server.wait_until_answering()
    with Receiver(answer=lambda r: Reply(200)) as receiver:
        patched = requests.patch(server.url_of("/types/email"), headers=bearer(admin),
                                 json={"push": {"url": receiver.url}}, timeout=10)
        receiver.secret = patched.json()["push"]["secret"]
        job = requests.post(server.url_of("/jobs"), headers=bearer(producer),
                            json={"type": "email", "payload": {}}, timeout=10).json()
        server.wait_for(lambda: requests.get(server.url_of(f"/jobs/{job['id']}"),
                                             headers=bearer(admin), timeout=10
                                             ).json()["status"] == "completed",
                        "the job to be delivered")
    assert [r.verified for r in receiver.received] == [True]
    metrics = requests.get(server.url_of("/metrics"), timeout=10).text
    assert 'queuelog_push_deliveries_total{outcome="completed",type="email"} 1.0' in metrics
    assert "queuelog_push_delivery_duration_seconds_bucket" in metrics

    dispatchers = [pid for pid in _children(server.pid) if "-m app dispatch" in _command(pid)]
    assert len(dispatchers) == 1
    server.send_signal(signal.SIGTERM)
    assert server.process is not None and server.process.wait(timeout=60) == 0
    deadline = time.monotonic() + 10
    while _command(dispatchers[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _command(dispatchers[0]), "the dispatcher outlived gunicorn"
    assert "dispatch: stopped" in server.stderr()
