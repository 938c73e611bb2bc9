"""Receivers that misbehave on purpose, real ones on loopback, against the dispatcher in
this process (both engines): each one ends its attempt cleanly, and the others' jobs are
delivered meanwhile."""

from __future__ import annotations

from typing import Any

import pytest

from app.clock import Clock
from tests.conftest import Api, Key
from tests.dispatch.receiver import Receiver, Reply, Trickler
from tests.dispatch.test_dispatcher import dispatching, job_of, make_push, wait_until

__all__ = ["dispatching"]  # the fixture, shared with the other dispatcher tests


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    # A failed attempt is retried at once: the budget is spent within the test.
    return {**app_config, "CLOCK": Clock(), "RETRY_BACKOFF_SECONDS": 0.0,
            "RETRY_BACKOFF_MAX_SECONDS": 0.0,
            "JOB_TYPES": app_config["JOB_TYPES"] | {"slow_body", "slow_head"}}


def attempts_of(client: Any, admin: Key, job_id: int) -> list[dict[str, Any]]:
    attempts: list[dict[str, Any]] = client.get(f"/jobs/{job_id}/attempts",
                                                headers=admin.headers).json["attempts"]
    return attempts


def test_a_trickled_answer_ends_as_a_timeout_at_the_deadline_and_others_are_delivered(
        client, api: Api, admin, producer, dispatching):
    """A 200 whose body, or whose headers too, come a byte a second is cut at the type's
    timeout (2 s), however long the receiver keeps sending: each attempt is a timeout the
    dispatcher reports within its lease (never refused as stale), the job is retried as its
    budget says, and a healthy type's jobs are delivered while every thread could be held."""
    with Trickler(headers_too=False) as body_trickler, \
            Trickler(headers_too=True) as header_trickler, \
            Receiver(answer=lambda r: Reply(200, b'{"sent": true}')) as healthy:
        make_push(client, admin, body_trickler.url, job_type="slow_body", timeout_seconds=2)
        make_push(client, admin, header_trickler.url, job_type="slow_head",
                  timeout_seconds=2)
        make_push(client, admin, healthy.url, job_type="email")
        trickled = [api.enqueue(producer, type=job_type, max_retries=1).json["id"]
                    for job_type in ("slow_body", "slow_head") for _ in range(2)]
        running = dispatching(concurrency=2)
        healthy_ids = [api.enqueue(producer, type="email").json["id"] for _ in range(3)]
        # 45 one-byte seconds per answer, were it waited out: far past this wait.
        wait_until(lambda: all(job_of(api, admin, j)["status"] == "failed" for j in trickled)
                   and all(job_of(api, admin, j)["status"] == "completed"
                           for j in healthy_ids), "the trickled jobs' budgets spent",
                   timeout=40)
        running.stop()
        cut = body_trickler.connections + header_trickler.connections
        assert body_trickler.finished == header_trickler.finished == 0
    assert cut == 8  # two attempts each for four jobs; none was sent again on a lapsed lease
    for job_id in trickled:
        job = job_of(api, admin, job_id)
        assert job["retry_count"] == 1
        attempts = attempts_of(client, admin, job_id)
        assert [a["outcome"] for a in attempts] == ["failed", "failed"]
        for attempt in attempts:
            assert attempt["error"].startswith("timed out after 2 s"), attempt["error"]
    assert len(healthy.received) == 3
