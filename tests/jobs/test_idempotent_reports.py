"""A complete or fail repeated after it landed (a response lost on the way back) answers the
job as the first one left it; anything else that is not the holder's report stays a 409."""

from __future__ import annotations

import pytest


@pytest.fixture
def held(api, producer, worker):
    """A running job held by `worker`: (id, lease token)."""
    def make(**enqueue: object) -> tuple[int, str]:
        job_id = api.enqueue(producer, **enqueue).json["id"]
        claimed = api.claim(worker).json
        assert claimed["id"] == job_id
        return job_id, claimed["lease_token"]
    return make


def test_a_repeated_complete_answers_the_job_as_the_first_left_it(api, worker, held, clock):
    job_id, token = held()
    first = api.complete(worker, job_id, lease_token=token, result={"sent": 1})
    assert first.status_code == 200
    clock.advance(5)
    again = api.complete(worker, job_id, lease_token=token, result={"sent": 1})
    assert again.status_code == 200
    assert again.json == first.json


@pytest.mark.parametrize("repeat", [
    {"result": {"sent": 2}},  # another body
    {"result": None},
    {},  # no lease token
    {"lease_token": "0" * 32 + ".1", "result": {"sent": 1}},
], ids=["other-result", "no-result", "no-lease-token", "other-lease-token"])
def test_a_complete_that_is_not_a_repeat_of_the_one_that_landed_is_409(api, worker, held,
                                                                       repeat):
    job_id, token = held()
    assert api.complete(worker, job_id, lease_token=token, result={"sent": 1}).status_code == 200
    body = {"lease_token": token, **repeat} if repeat else {}
    assert api.complete(worker, job_id, **body).status_code == 409


def test_a_complete_without_a_lease_token_is_never_taken_for_a_repeat(api, worker, held):
    job_id, _token = held()
    assert api.complete(worker, job_id).status_code == 200
    assert api.complete(worker, job_id).status_code == 409


def test_another_worker_repeating_the_report_is_refused(api, make_key, worker, held):
    job_id, token = held()
    assert api.complete(worker, job_id, lease_token=token).status_code == 200
    other = make_key("worker-2", "worker")
    assert api.complete(other, job_id, lease_token=token).status_code == 409


def test_a_repeated_complete_in_a_batch_answers_200(client, api, worker, held):
    job_id, token = held()
    item = {"id": job_id, "lease_token": token, "result": {"n": 1}}
    answers = []
    for _ in range(2):
        response = client.post("/jobs/complete-many", json={"items": [item]},
                               headers=worker.headers)
        assert response.status_code == 200
        answers.append(response.json["results"][0])
    assert [a["status"] for a in answers] == [200, 200]
    assert answers[0]["job"] == answers[1]["job"]


@pytest.mark.parametrize("max_retries,status", [(3, "pending"), (0, "failed")])
def test_a_repeated_fail_answers_the_job_as_the_first_left_it(api, worker, held, clock,
                                                              max_retries, status):
    job_id, token = held(max_retries=max_retries)
    body = {"lease_token": token, "error": "smtp down", "retry_in_seconds": 30}
    first = api.fail(worker, job_id, **body)
    assert first.status_code == 200 and first.json["status"] == status
    clock.advance(1)
    again = api.fail(worker, job_id, **body)
    assert again.status_code == 200
    assert again.json == first.json


@pytest.mark.parametrize("repeat", [
    {"error": "another error"},
    {"retry_in_seconds": 31},
    {"lease_token": None},
], ids=["other-error", "other-delay", "no-lease-token"])
def test_a_fail_that_is_not_a_repeat_of_the_one_that_landed_is_409(api, worker, held, repeat):
    job_id, token = held()
    body = {"lease_token": token, "error": "smtp down", "retry_in_seconds": 30}
    assert api.fail(worker, job_id, **body).status_code == 200
    repeated = {key: value for key, value in (body | repeat).items() if value is not None}
    assert api.fail(worker, job_id, **repeated).status_code == 409


def test_a_repeated_fail_after_the_job_was_claimed_again_is_409(api, worker, held):
    job_id, token = held()
    body = {"lease_token": token, "error": "smtp down", "retry_in_seconds": 0}
    assert api.fail(worker, job_id, **body).json["status"] == "pending"
    assert api.claim(worker).json["id"] == job_id  # the next attempt
    assert api.fail(worker, job_id, **body).status_code == 409


def test_a_repeated_fail_after_an_admin_cancelled_the_job_is_409(api, worker, admin, held):
    job_id, token = held()
    body = {"lease_token": token, "error": "smtp down", "retry_in_seconds": 60}
    assert api.fail(worker, job_id, **body).status_code == 200
    assert api.cancel(admin, job_id).status_code == 200
    assert api.fail(worker, job_id, **body).status_code == 409
