"""Against a server whose waiting budget is full (here: none at all), every request that asks
to wait is answered at once with Retry-After. The client then waits in the server's stead
instead of asking again at once (without it, one wait(timeout=10) made 4,342 requests, one
idle worker 239 claims in 8 s). The bounds below count requests in real gunicorn's request
log; they follow from the pause being at least Retry-After, whatever the machine's speed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.jobs.wake.waiting import NOT_WAITED_RETRY_AFTER_SECONDS
from queuelog_client import WaitTimeout
from queuelog_client.worker import RECONNECT_BACKOFF_MAX_SECONDS, RECONNECT_BACKOFF_SECONDS
from tests.client.conftest import LiveServer, wait_until

CLAIM = "/jobs/claim"
CLAIM_MANY = "/jobs/claim-many"
READ = "/jobs/<id:job_id>"


@pytest.fixture
def busy_server(tmp_path: Path, sqlite_template: str) -> Iterator[LiveServer]:
    server = LiveServer(tmp_path, sqlite_template, QUEUELOG_MAX_WAITING_CLAIMS="0",
                        QUEUELOG_MAX_WAITING_REQUESTS="0")
    server.start()
    yield server
    server.stop()


def _bound(seconds: float) -> int:
    """Requests in `seconds` when each answer is followed by a pause of at least
    Retry-After: one at the start, one after each whole pause, and one last at the end."""
    return int(seconds / NOT_WAITED_RETRY_AFTER_SECONDS) + 2


def _settled_count(server: LiveServer, route: str) -> int:
    """The count once the last request's log line is written (it follows the answer)."""
    time.sleep(0.5)
    return server.requests_to(route)


def test_waiting_for_a_job_past_a_full_budget_pauses_between_requests(busy_server):
    producer = busy_server.client(busy_server.create_key("p", "producer"))
    job = producer.enqueue("email", {"n": 1})
    with pytest.raises(WaitTimeout):
        producer.wait(job["id"], timeout=3)
    requests = _settled_count(busy_server, READ)
    assert 2 <= requests <= _bound(3), requests


def test_claims_past_a_full_budget_pause_and_still_take_work(busy_server):
    worker = busy_server.client(busy_server.create_key("w", "worker"))
    assert worker.claim(wait_seconds=2) is None
    assert worker.claim_many(5, wait_seconds=2) == []
    # More than one: the client asks again while the caller's wait lasts; but few.
    assert 2 <= _settled_count(busy_server, CLAIM) <= _bound(2)
    assert 2 <= _settled_count(busy_server, CLAIM_MANY) <= _bound(2)

    # The client's own waiting still finds work that comes while it waits.
    producer = busy_server.client(busy_server.create_key("p", "producer"))
    job = producer.enqueue("email", {"n": 1})
    assert worker.claim(wait_seconds=5)["id"] == job["id"]


def test_an_idle_worker_past_a_full_budget_claims_a_bounded_number_of_times(
        busy_server, start_runner):
    token = busy_server.create_key("w", "worker")
    started = time.monotonic()
    runner = start_runner(busy_server, token, "tests.client.handlers:succeed",
                          "--types", "email", "--wait-seconds", "5")
    wait_until(lambda: "waiting for jobs" in runner.log(), what="the runner to start")
    time.sleep(4)
    producer = busy_server.client(busy_server.create_key("p", "producer"))
    job = producer.enqueue("email", {"n": 1})
    # Idle, it still takes the job that comes: its waiting is its own now, not the server's.
    assert producer.wait(job["id"], timeout=30)["status"] == "completed"
    runner.kill()
    elapsed = time.monotonic() - started
    claims = _settled_count(busy_server, CLAIM)
    assert claims <= _bound(elapsed), (claims, elapsed)


def test_a_worker_that_does_not_long_poll_backs_off_while_idle(live_server, start_runner):
    token = live_server.create_key("w", "worker")
    started = time.monotonic()
    runner = start_runner(live_server, token, "tests.client.handlers:succeed",
                          "--wait-seconds", "0")
    wait_until(lambda: "waiting for jobs" in runner.log(), what="the runner to start")
    time.sleep(4)
    runner.kill()
    elapsed = time.monotonic() - started
    # The pauses after empty claims are at least half of 0.25, 0.5, 1, … s, capped at 5.
    bound, slept, pause = 1, 0.0, RECONNECT_BACKOFF_SECONDS
    while slept + pause / 2 <= elapsed:
        slept += pause / 2
        bound += 1
        pause = min(pause * 2, RECONNECT_BACKOFF_MAX_SECONDS)
    claims = _settled_count(live_server, CLAIM)
    assert 1 <= claims <= bound, (claims, bound, elapsed)
