"""A gunicorn worker told to stop writes the stats counts it still keeps (the shipped
gunicorn.conf.py's worker_exit hook): a stop loses none of them."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from sqlalchemy import create_engine, text

from tests.conftest import JOB_TYPES
from tests.servers import GunicornServer, bearer, gunicorn_argv, server_environment
from tests.servers import create_api_key as create_key

pytestmark = pytest.mark.slow

JOBS = 20


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["term", "int"])
def test_a_stopped_worker_writes_its_last_counts(
        start_server: Callable[..., GunicornServer], db_url: str, tmp_path: Path,
        stop: signal.Signals) -> None:
    token = create_key(db_url, "producer-1", "producer")
    server = start_server(gunicorn_argv(), server_environment(
        tmp_path, QUEUELOG_DATABASE_URL=db_url, QUEUELOG_JOB_TYPES=",".join(sorted(JOB_TYPES)),
        GUNICORN_WORKERS="1"))
    server.wait_until_answering()
    with requests.Session() as session:
        for n in range(JOBS):
            made = session.post(server.url_of("/jobs"), json={"type": "email", "payload": {"n": n}},
                                headers=bearer(token), timeout=10)
            assert made.status_code == 201, made.text
    # At once: the worker's flusher has most likely not written the last of them yet.
    server.send_signal(stop)
    assert server.process is not None and server.process.wait(timeout=60) == 0
    assert "could not be written" not in server.stderr()

    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            counted = conn.execute(text(
                "SELECT sum(enqueued) FROM job_stats WHERE type = 'email'")).scalar()
    finally:
        engine.dispose()
    assert counted == JOBS
