"""Admin routes: cancel and retry, with the job's state before and after."""

from __future__ import annotations


def test_cancel_turns_a_pending_job_cancelled(api, producer, admin):
    job = api.enqueue(producer).json
    assert job["status"] == "pending"
    cancelled = api.cancel(admin, job["id"])
    assert cancelled.status_code == 200 and cancelled.json["status"] == "cancelled"


def test_cancel_of_a_running_job_requests_it_and_leaves_it_running(api, producer, worker,
                                                                    admin):
    job_id = api.enqueue(producer).json["id"]
    api.claim(worker)
    response = api.cancel(admin, job_id)
    assert response.status_code == 200
    assert (response.json["status"], response.json["cancel_requested"]) == ("running", True)
    assert api.get(admin, job_id).json["status"] == "running"


def test_retry_of_a_cancelled_job_makes_it_pending_again(api, producer, admin, worker):
    job_id = api.enqueue(producer).json["id"]
    api.cancel(admin, job_id)
    retried = api.retry(admin, job_id).json
    assert (retried["status"], retried["retry_count"]) == ("pending", 0)
    assert api.claim(worker).json["id"] == job_id


def test_retry_of_a_pending_job_is_409(api, producer, admin):
    job_id = api.enqueue(producer).json["id"]
    assert api.retry(admin, job_id).status_code == 409
    assert api.get(admin, job_id).json["status"] == "pending"


def test_retry_of_a_delayed_failed_job_makes_it_claimable_now(api, producer, worker, admin,
                                                             clock):
    job_id = api.enqueue(producer, max_retries=0, delay_seconds=0).json["id"]
    api.claim(worker)
    api.fail(worker, job_id)
    api.retry(admin, job_id)
    assert api.claim(worker).json["id"] == job_id
