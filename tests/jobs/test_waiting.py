"""wait_seconds: a claim with nothing to do waits for work, like SQS long polling."""

from __future__ import annotations

import threading
import time

import pytest

from app import create_app
from app.core.callers import Role
from tests.conftest import Api, Key


def test_without_wait_an_empty_claim_answers_at_once(api, worker):
    assert api.claim(worker, wait_seconds=0).status_code == 204


def test_a_waiting_claim_receives_a_job_enqueued_while_it_waits(app, producer, worker):
    answer = {}

    def wait_for_job() -> None:
        answer["response"] = Api(app.test_client()).claim(worker, wait_seconds=10)

    waiter = threading.Thread(target=wait_for_job)
    waiter.start()
    time.sleep(0.3)  # let it start waiting
    job_id = Api(app.test_client()).enqueue(producer).json["id"]
    waiter.join(timeout=15)

    assert answer["response"].status_code == 200
    assert answer["response"].json["id"] == job_id


def test_a_waiting_claim_notices_jobs_enqueued_by_another_process(app_config, app, producer,
                                                                  worker):
    # A second app over the same database stands for another gunicorn worker or host:
    # its enqueue cannot signal this process, so the indexed peek must find the job.
    other = create_app(app_config)
    answer = {}

    def wait_for_job() -> None:
        answer["response"] = Api(app.test_client()).claim(worker, wait_seconds=10)

    waiter = threading.Thread(target=wait_for_job)
    waiter.start()
    time.sleep(0.3)
    job_id = Api(other.test_client()).enqueue(producer).json["id"]
    waiter.join(timeout=15)
    other.extensions["queuelog"].db.engine.dispose()

    assert answer["response"].json["id"] == job_id


def test_a_waiting_claim_gives_up_with_204_after_wait_seconds(api, worker):
    started = time.monotonic()
    assert api.claim(worker, wait_seconds=0.3).status_code == 204
    assert time.monotonic() - started >= 0.3


def test_a_waiting_claim_ignores_jobs_of_other_types(app, producer, worker):
    answer = {}

    def wait_for_pdf() -> None:
        answer["response"] = Api(app.test_client()).claim(worker, types=["pdf"],
                                                          wait_seconds=0.5)

    waiter = threading.Thread(target=wait_for_pdf)
    waiter.start()
    time.sleep(0.1)
    Api(app.test_client()).enqueue(producer, type="email")
    waiter.join(timeout=15)
    assert answer["response"].status_code == 204


def test_a_waiting_claim_takes_a_rescued_job_when_a_lease_expires(app, producer, make_key,
                                                                  clock):
    dead = make_key("dead", "worker")
    alive = make_key("alive", "worker")
    api = Api(app.test_client())
    job_id = api.enqueue(producer).json["id"]
    api.claim(dead, lease_seconds=5)
    answer = {}

    def wait_for_job() -> None:
        answer["response"] = Api(app.test_client()).claim(alive, wait_seconds=10)

    waiter = threading.Thread(target=wait_for_job)
    waiter.start()
    time.sleep(0.2)
    clock.advance(6)  # the dead worker's lease runs out while the claim waits
    waiter.join(timeout=15)
    assert answer["response"].json["id"] == job_id


def test_claim_many_waits_too(app, producer, worker):
    answer = {}

    def wait_for_jobs() -> None:
        answer["response"] = app.test_client().post(
            "/jobs/claim-many", json={"wait_seconds": 10, "max_jobs": 5},
            headers=worker.headers)

    waiter = threading.Thread(target=wait_for_jobs)
    waiter.start()
    time.sleep(0.3)
    Api(app.test_client()).enqueue(producer)
    waiter.join(timeout=15)
    assert len(answer["response"].json["jobs"]) == 1


@pytest.mark.parametrize("wait", [-1, 20.5, "1", True, None])
def test_wait_seconds_must_be_a_number_from_0_to_20(api, worker, wait):
    assert api.claim(worker, wait_seconds=wait).status_code == 422


def test_claims_past_the_waiting_limit_answer_at_once(app_config):
    app_config["MAX_WAITING_CLAIMS"] = 1
    application = create_app(app_config)
    services = application.extensions["queuelog"]
    worker = Key("w", services.keys.create_key("w", Role.WORKER))
    producer = Key("p", services.keys.create_key("p", Role.PRODUCER))
    first: dict = {}

    def wait_long() -> None:
        first["response"] = Api(application.test_client()).claim(worker, wait_seconds=10)

    waiter = threading.Thread(target=wait_long)
    waiter.start()
    waits = services.jobs.waiting_claims
    deadline = time.monotonic() + 30
    while waits.in_use == 0 and waiter.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert waits.in_use == 1  # the one waiting slot is taken
    second = Api(application.test_client()).claim(worker, wait_seconds=10)
    assert second.status_code == 204  # answered without waiting, the first still waits
    assert waiter.is_alive()
    job_id = Api(application.test_client()).enqueue(producer).json["id"]
    waiter.join(timeout=15)
    assert first["response"].json["id"] == job_id
    services.db.engine.dispose()
