"""GET /jobs/{id}?wait_seconds=N: answers once the job is completed, failed or cancelled, or
after N seconds with the job as it is then."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from app import create_app
from app.core.callers import Role
from tests.conftest import Api, Key


def get(client: Any, key: Key, job_id: int, wait: Any) -> Any:
    return client.get(f"/jobs/{job_id}", query_string={"wait_seconds": wait},
                      headers=key.headers)


def wait_in_thread(app: Any, key: Key, job_id: int, wait: Any = 30) -> tuple[threading.Thread,
                                                                              dict[str, Any]]:
    answer: dict[str, Any] = {}

    def wait_for_result() -> None:
        answer["response"] = get(app.test_client(), key, job_id, wait)

    waiter = threading.Thread(target=wait_for_result)
    waiter.start()
    time.sleep(0.3)  # let it start waiting
    return waiter, answer


def test_a_waiting_read_answers_with_the_completed_job(app, api, producer, worker):
    job_id = api.enqueue(producer).json["id"]
    lease = api.claim(worker).json["lease_token"]
    waiter, answer = wait_in_thread(app, producer, job_id)
    assert waiter.is_alive()

    api.complete(worker, job_id, lease_token=lease, result={"sent": True})
    waiter.join(timeout=15)

    assert answer["response"].status_code == 200
    assert answer["response"].json["status"] == "completed"
    assert answer["response"].json["result"] == {"sent": True}


@pytest.mark.parametrize("finish", ["fail", "cancel"])
def test_a_waiting_read_answers_when_the_job_fails_or_is_cancelled(app, api, producer, worker,
                                                                   admin, finish):
    job_id = api.enqueue(producer, max_retries=0).json["id"]
    if finish == "fail":
        api.claim(worker)
    waiter, answer = wait_in_thread(app, producer, job_id)

    if finish == "fail":
        api.fail(worker, job_id)
    else:
        api.cancel(admin, job_id)
    waiter.join(timeout=15)
    assert answer["response"].json["status"] == ("failed" if finish == "fail" else "cancelled")


def test_a_waiting_read_notices_a_job_finished_by_another_process(app_config, app, api,
                                                                  producer, worker):
    # A second app over the same database stands for another gunicorn worker or host: its
    # complete cannot signal this process, so the periodic read must see it.
    other = create_app(app_config)
    job_id = api.enqueue(producer).json["id"]
    api.claim(worker)
    waiter, answer = wait_in_thread(app, producer, job_id)

    Api(other.test_client()).complete(worker, job_id)
    waiter.join(timeout=15)
    other.extensions["queuelog"].db.engine.dispose()
    assert answer["response"].json["status"] == "completed"


def test_a_retried_attempt_is_not_an_end_the_read_keeps_waiting(app, api, producer, worker):
    job_id = api.enqueue(producer, max_retries=1).json["id"]
    api.claim(worker)
    waiter, answer = wait_in_thread(app, producer, job_id)

    api.fail(worker, job_id, retry_in_seconds=0)
    time.sleep(0.3)
    assert waiter.is_alive()
    api.claim(worker)
    api.complete(worker, job_id)
    waiter.join(timeout=15)
    assert answer["response"].json["status"] == "completed"


def test_after_wait_seconds_the_job_is_answered_as_it_is(api, producer, client):
    job_id = api.enqueue(producer).json["id"]
    started = time.monotonic()
    response = get(client, producer, job_id, "0.3")
    assert response.status_code == 200 and response.json["status"] == "pending"
    assert time.monotonic() - started >= 0.3


def test_a_finished_job_is_answered_without_waiting(api, producer, worker, client):
    job_id = api.enqueue(producer).json["id"]
    api.claim(worker)
    api.complete(worker, job_id)
    # Were it to wait, this test would take a minute.
    assert get(client, producer, job_id, 60).json["status"] == "completed"


def test_waiting_for_a_job_the_caller_may_not_see_is_404(api, producer, make_key, client):
    job_id = api.enqueue(producer).json["id"]
    stranger = make_key("stranger", "producer")
    assert get(client, stranger, job_id, 1).status_code == 404


@pytest.mark.parametrize("wait", ["-1", "60.5", "1e1", "\u0665", "", "true", " 1"])
def test_wait_seconds_must_be_ascii_seconds_from_0_to_60(api, producer, client, wait):
    job_id = api.enqueue(producer).json["id"]
    response = get(client, producer, job_id, wait)
    assert response.status_code == 422
    assert "wait_seconds" in response.json["errors"]


def test_other_query_parameters_on_a_job_are_422(api, producer, client):
    job_id = api.enqueue(producer).json["id"]
    response = client.get(f"/jobs/{job_id}?wait_seconds=1&wait=2", headers=producer.headers)
    assert response.status_code == 422
    assert response.json["errors"] == {"wait": ["Unknown query parameter."]}


def test_reads_past_the_waiting_budget_answer_at_once(app_config):
    app_config["MAX_WAITING_REQUESTS"] = 1
    application = create_app(app_config)
    services = application.extensions["queuelog"]
    producer = Key("p", services.keys.create_key("p", Role.PRODUCER))
    worker = Key("w", services.keys.create_key("w", Role.WORKER))
    api = Api(application.test_client())
    job_id = api.enqueue(producer).json["id"]
    api.claim(worker)
    waiter, first = wait_in_thread(application, producer, job_id, wait=30)

    # The one slot is taken: this read answers at once (else it would wait 30 s), while
    # claims, with a budget of their own, still wait.
    second = get(application.test_client(), producer, job_id, 30)
    assert second.json["status"] == "running"
    assert waiter.is_alive()
    api.complete(worker, job_id)
    waiter.join(timeout=15)
    assert first["response"].json["status"] == "completed"
    services.db.engine.dispose()
