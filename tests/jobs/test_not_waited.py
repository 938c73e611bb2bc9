"""A request that asks to wait (a claim's wait_seconds, GET /jobs/{id}?wait_seconds) but finds
its process's waiting budget full is answered at once: the answer says so with Retry-After,
so that the client pauses instead of asking again at once. An answer that did
wait, or never asked to, carries no Retry-After."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask

from app import create_app
from app.core.callers import Role
from app.jobs.wake.waiting import NOT_WAITED_RETRY_AFTER_SECONDS, WaitingBudget
from tests.conftest import Api, Key

NOT_WAITED = str(NOT_WAITED_RETRY_AFTER_SECONDS)


@pytest.fixture
def budget_app(app_config: dict[str, Any]) -> Iterator[Callable[..., Flask]]:
    made: list[Flask] = []

    def make(claims: int = 8, reads: int = 4) -> Flask:
        application = create_app({**app_config, "MAX_WAITING_CLAIMS": claims,
                                  "MAX_WAITING_REQUESTS": reads})
        made.append(application)
        return application

    yield make
    for application in made:
        application.extensions["queuelog"].db.engine.dispose()


def _keys(application: Flask, suffix: str = "") -> tuple[Key, Key]:
    keys = application.extensions["queuelog"].keys
    return (Key("p" + suffix, keys.create_key("p" + suffix, Role.PRODUCER)),
            Key("w" + suffix, keys.create_key("w" + suffix, Role.WORKER)))


def _in_thread(call: Callable[[], Any], budget: WaitingBudget
               ) -> tuple[threading.Thread, dict[str, Any]]:
    """`call` in a thread of its own, once it holds its slot of `budget`."""
    answer: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: answer.update(response=call()))
    thread.start()
    deadline = time.monotonic() + 30
    while budget.in_use == 0 and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert budget.in_use == 1, "the first request never took its waiting slot"
    return thread, answer


def test_with_no_waiting_budget_every_waiting_answer_says_it_did_not_wait(budget_app):
    application = budget_app(claims=0, reads=0)
    producer, worker = _keys(application)
    api = Api(application.test_client())

    claim = api.claim(worker, wait_seconds=5)
    assert claim.status_code == 204
    assert claim.headers["Retry-After"] == NOT_WAITED
    many = application.test_client().post("/jobs/claim-many",
                                          json={"wait_seconds": 5, "max_jobs": 3},
                                          headers=worker.headers)
    assert many.json == {"jobs": []}
    assert many.headers["Retry-After"] == NOT_WAITED

    job_id = api.enqueue(producer).json["id"]
    read = application.test_client().get(f"/jobs/{job_id}?wait_seconds=5",
                                         headers=producer.headers)
    assert read.json["status"] == "pending"
    assert read.headers["Retry-After"] == NOT_WAITED


def test_past_a_full_budget_of_one_the_answer_says_it_did_not_wait(budget_app):
    application = budget_app(claims=1, reads=1)
    producer, worker = _keys(application)
    api = Api(application.test_client())

    jobs = application.extensions["queuelog"].jobs
    held_claim, first_claim = _in_thread(lambda: Api(application.test_client()).claim(
        worker, wait_seconds=10), jobs.waiting_claims)
    second = api.claim(worker, wait_seconds=10)
    assert second.status_code == 204 and second.headers["Retry-After"] == NOT_WAITED
    assert held_claim.is_alive()

    job_id = api.enqueue(producer).json["id"]
    held_claim.join(timeout=15)
    assert first_claim["response"].json["id"] == job_id
    assert "Retry-After" not in first_claim["response"].headers  # it did wait

    held_read, first_read = _in_thread(lambda: application.test_client().get(
        f"/jobs/{job_id}?wait_seconds=10", headers=producer.headers), jobs.waiting_reads)
    second_read = application.test_client().get(f"/jobs/{job_id}?wait_seconds=10",
                                                headers=producer.headers)
    assert second_read.json["status"] == "running"
    assert second_read.headers["Retry-After"] == NOT_WAITED
    assert held_read.is_alive()
    api.complete(worker, job_id)
    held_read.join(timeout=15)
    assert first_read["response"].json["status"] == "completed"
    assert "Retry-After" not in first_read["response"].headers


def test_answers_that_waited_or_needed_no_wait_carry_no_retry_after(budget_app):
    application = budget_app(claims=0, reads=0)
    producer, worker = _keys(application)
    api = Api(application.test_client())
    assert "Retry-After" not in api.claim(worker).headers  # asked not to wait
    job_id = api.enqueue(producer).json["id"]
    # Something to answer at once: the budget does not matter.
    claimed = api.claim(worker, wait_seconds=5)
    assert claimed.json["id"] == job_id and "Retry-After" not in claimed.headers
    api.complete(worker, job_id)
    finished = application.test_client().get(f"/jobs/{job_id}?wait_seconds=5",
                                             headers=producer.headers)
    assert finished.json["status"] == "completed" and "Retry-After" not in finished.headers

    waiting = budget_app()
    _, waiting_worker = _keys(waiting, "-2")  # the same database: names of their own
    ran_out = Api(waiting.test_client()).claim(waiting_worker, wait_seconds=0.2)
    assert ran_out.status_code == 204 and "Retry-After" not in ran_out.headers
