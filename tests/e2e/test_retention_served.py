"""Retention as it runs in production (contract §19): the tickers of two gunicorn servers of
two processes each, on one database, remove every expired job with its history, each job
once, while producers and workers go on; nothing else is removed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text

from app.storage.engine import make_engine
from tests.e2e.client import QueueClient, server_errors
from tests.servers import LiveServer, create_api_key

EXPIRED = 1500
REMOVAL_TIMEOUT_SECONDS = 90


def counted(url: str, sql: str, **params: Any) -> int:
    engine = make_engine(url, pooled=False)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(sql), params).scalar_one())
    finally:
        engine.dispose()


@pytest.mark.slow
def test_the_tickers_of_two_servers_remove_each_expired_job_once(
        start_server: Callable[..., LiveServer], server_database_url: str) -> None:
    url = server_database_url
    servers = [start_server(url, workers=2, threads=4) for _ in range(2)]
    admin = QueueClient(servers[0], create_api_key(url, "admin-1", "admin"))
    producers = [QueueClient(server, create_api_key(url, f"producer-{n}", "producer"))
                 for n, server in enumerate(servers)]
    worker = QueueClient(servers[1], create_api_key(url, "worker-1", "worker"))
    for start in range(0, EXPIRED, 500):
        made = producers[0].request("POST", "/jobs/batch", json={"jobs": [
            {"type": "email", "payload": {"n": n}} for n in range(start, start + 500)]})
        assert made.status_code == 201, made.text
    cancelled = admin.request("POST", "/jobs/cancel-many",
                              json={"type": "email", "limit": EXPIRED})
    assert cancelled.json()["count"] == EXPIRED
    keyed = producers[1].enqueue({"type": "email"}, idempotency_key="order-1001").json()["id"]
    assert admin.request("POST", f"/jobs/{keyed}/cancel").status_code == 200
    # Cancelled two hours ago, as far as retention can tell (the keyed job was created
    # minutes ago: the idempotency floor keeps it).
    engine = make_engine(url, pooled=False)
    with engine.begin() as conn:
        conn.execute(text("UPDATE jobs SET updated_at = updated_at - 7200000000"))
    engine.dispose()
    patched = admin.request("PATCH", "/types/email",
                            json={"retention": {"cancelled_seconds": 60}})
    assert patched.status_code == 200, patched.text

    # Meanwhile the queue goes on: enqueues and claims on both servers.
    deadline = time.monotonic() + REMOVAL_TIMEOUT_SECONDS
    done: list[Any] = []
    while time.monotonic() < deadline:
        for producer in producers:
            assert producer.enqueue({"type": "pdf"}).status_code == 201
        claimed = worker.claim(types=["pdf"])
        if claimed.status_code == 200:
            job = claimed.json()
            assert worker.complete(job["id"], lease_token=job["lease_token"]).status_code == 200
            done.append(job["id"])
        if counted(url, "SELECT count(*) FROM jobs WHERE type = 'email'") == 1:
            break
        time.sleep(0.2)

    # Every expired job is gone with its history; the one the idempotency floor keeps, the
    # pdf jobs (within their 7 days) and their history stay.
    assert counted(url, "SELECT count(*) FROM jobs WHERE type = 'email'") == 1
    assert counted(url, "SELECT count(*) FROM jobs WHERE type = 'email' AND id = :id",
                   id=keyed) == 1
    assert counted(url, "SELECT count(*) FROM job_events WHERE job_id NOT IN "
                        "(SELECT id FROM jobs)") == 0
    assert counted(url, "SELECT count(*) FROM jobs WHERE type = 'pdf'") >= len(done) > 0
    assert server_errors([admin, worker, *producers]) == {}
    for server in servers:
        assert "Traceback" not in server.log_tail(), server.log_tail()
