"""POST /jobs/claim: order, filters, atomicity."""

from __future__ import annotations

import threading

from app.core.clock import to_rfc3339
from tests.conftest import Api


def test_claim_answers_204_with_no_body_when_nothing_is_claimable(api, worker):
    response = api.claim(worker)
    assert response.status_code == 204
    assert response.data == b""


def test_claim_marks_the_job_running_for_the_calling_worker(api, producer, worker, clock):
    job_id = api.enqueue(producer).json["id"]
    claimed = api.claim(worker, lease_seconds=60).json
    assert claimed["id"] == job_id
    assert claimed["status"] == "running"
    assert claimed["worker_id"] == "worker-1"
    assert claimed["claimed_at"] == to_rfc3339(clock.now_us())
    assert claimed["lease_expires_at"] == to_rfc3339(clock.now_us() + 60_000_000)
    assert claimed["lease_token"]
    assert "lease_token" not in api.get(worker, job_id).json


def test_claim_takes_highest_priority_then_oldest_then_lowest_id(api, admin, worker, clock):
    low = api.enqueue(admin, priority="low").json["id"]
    medium_old = api.enqueue(admin, priority="medium").json["id"]
    clock.advance(1)
    critical = api.enqueue(admin, priority="critical").json["id"]
    medium_new = api.enqueue(admin, priority="medium").json["id"]
    high_a = api.enqueue(admin, priority="high").json["id"]
    high_b = api.enqueue(admin, priority="high").json["id"]  # same created_at as high_a

    order = [api.claim(worker).json["id"] for _ in range(6)]

    assert order == [critical, high_a, high_b, medium_old, medium_new, low]
    assert api.claim(worker).status_code == 204


def test_claim_with_types_takes_only_those(api, producer, worker):
    api.enqueue(producer, type="email")
    pdf = api.enqueue(producer, type="pdf").json["id"]
    assert api.claim(worker, types=["pdf", "sync"]).json["id"] == pdf
    assert api.claim(worker, types=["pdf"]).status_code == 204


def test_claim_with_an_empty_type_list_finds_nothing(api, producer, worker):
    api.enqueue(producer)
    assert api.claim(worker, types=[]).status_code == 204


def test_claim_accepts_an_empty_body_and_its_own_worker_id(client, api, producer, worker):
    api.enqueue(producer)
    api.enqueue(producer)
    assert client.post("/jobs/claim", headers=worker.headers).status_code == 200
    assert api.claim(worker, worker_id="worker-1").status_code == 200


def test_claim_skips_jobs_whose_run_at_is_in_the_future(api, producer, worker, clock):
    api.enqueue(producer, delay_seconds=30)
    assert api.claim(worker).status_code == 204
    clock.advance(30)
    assert api.claim(worker).status_code == 200


def test_claim_skips_running_and_finished_jobs(api, producer, worker):
    first = api.enqueue(producer).json["id"]
    second = api.enqueue(producer).json["id"]
    token = api.claim(worker).json["lease_token"]
    api.complete(worker, first, lease_token=token)
    assert api.claim(worker).json["id"] == second
    assert api.claim(worker).status_code == 204


def test_two_threads_claiming_from_one_queue_never_get_the_same_job(app, producer, worker):
    api = Api(app.test_client())
    job_ids = {api.enqueue(producer).json["id"] for _ in range(60)}
    claimed: dict[str, list[int]] = {"a": [], "b": []}
    errors: list[int] = []

    def drain(name: str) -> None:
        thread_api = Api(app.test_client())
        while True:
            response = thread_api.claim(worker)
            if response.status_code == 204:
                return
            if response.status_code != 200:
                errors.append(response.status_code)
                return
            claimed[name].append(response.json["id"])

    threads = [threading.Thread(target=drain, args=(name,)) for name in claimed]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    assert not set(claimed["a"]) & set(claimed["b"])
    assert sorted(claimed["a"] + claimed["b"]) == sorted(job_ids)


def test_a_claim_over_several_types_keeps_one_claim_order_across_them(client, api, admin,
                                                                     worker, clock):
    email_low = api.enqueue(admin, type="email", priority="low").json["id"]
    pdf_high = api.enqueue(admin, type="pdf", priority="high").json["id"]
    clock.advance(1)
    email_high = api.enqueue(admin, type="email", priority="high").json["id"]
    api.enqueue(admin, type="sync", priority="critical")  # not asked for
    pdf_medium = api.enqueue(admin, type="pdf").json["id"]

    claimed = client.post("/jobs/claim-many", json={"types": ["pdf", "email"], "max_jobs": 3},
                          headers=worker.headers).json["jobs"]

    assert [job["id"] for job in claimed] == [pdf_high, email_high, pdf_medium]
    assert api.claim(worker, types=["email", "pdf"]).json["id"] == email_low


def test_a_claim_naming_unconfigured_types_is_422_naming_them(api, producer, worker):
    api.enqueue(producer)
    response = api.claim(worker, types=["email", "emial", "pfd"])
    assert response.status_code == 422
    assert response.json["errors"] == {
        "types": ["Not configured: emial, pfd (configured: email, pdf, sync)."]}
    assert api.claim(worker, types=["email"]).status_code == 200  # nothing was claimed


def test_a_claim_names_at_most_100_types(api, worker):
    response = api.claim(worker, types=["email"] * 101)
    assert response.status_code == 422 and "types" in response.json["errors"]
    assert api.claim(worker, types=["email"] * 100).status_code == 204


def test_configured_types_outside_the_workers_key_find_nothing(api, make_key, producer):
    mailer = make_key("mailer", "worker", types=["email"])
    api.enqueue(producer, type="pdf")
    assert api.claim(mailer, types=["pdf"]).status_code == 204
