"""POST /jobs/batch, /jobs/claim-many and /jobs/complete-many, on both engines."""

from __future__ import annotations

import threading

import pytest

from tests.conftest import Api


def batch(client, key, jobs, headers=None):
    return client.post("/jobs/batch", json={"jobs": jobs},
                       headers={**key.headers, **(headers or {})})


def claim_many(client, key, **body):
    return client.post("/jobs/claim-many", json=body, headers=key.headers)


def complete_many(client, key, items):
    return client.post("/jobs/complete-many", json={"items": items}, headers=key.headers)


def test_batch_stores_every_job_in_request_order(client, api, producer):
    jobs = [{"type": "email", "payload": {"n": n}} for n in range(5)]
    response = batch(client, producer, jobs)

    assert response.status_code == 201
    created = response.json["jobs"]
    assert [job["payload"]["n"] for job in created] == list(range(5))
    assert [job["replayed"] for job in created] == [False] * 5
    assert created == sorted(created, key=lambda job: job["id"])
    for job in created:
        stored = api.get(producer, job["id"]).json
        assert stored == {k: v for k, v in job.items() if k not in ("replayed", "deduplicated")}


def test_batch_of_a_thousand_jobs_is_accepted_and_a_thousand_and_one_refused(client, api,
                                                                              admin):
    jobs = [{"type": "sync"} for _ in range(1000)]
    assert len(batch(client, admin, jobs).json["jobs"]) == 1000
    too_many = batch(client, admin, [*jobs, {"type": "sync"}])
    assert too_many.status_code == 422 and "jobs" in too_many.json["errors"]
    assert api.list(admin, limit=500, status="pending").json["next_cursor"] is not None


def test_one_invalid_item_stores_nothing_and_errors_are_keyed_by_position(client, api,
                                                                          producer, admin):
    # Checked in two passes: the shape of every item first, then the rules that need the
    # configuration (types, sizes); each pass reports every item it refuses.
    malformed = [{"type": "email"}, {"type": 5}, {"type": "pdf", "max_retries": "x"}]
    response = batch(client, producer, malformed)
    assert response.status_code == 422
    assert set(response.json["errors"]) == {"jobs.1.type", "jobs.2.max_retries"}

    disallowed = [{"type": "email"}, {"type": "nope"},
                  {"type": "email", "payload": {"big": "x" * 70_000}}]
    response = batch(client, producer, disallowed)
    assert response.status_code == 422
    assert set(response.json["errors"]) == {"jobs.1.type", "jobs.2.payload"}
    assert api.list(admin).json["jobs"] == []


def test_an_item_above_the_priority_ceiling_forbids_the_batch(client, api, producer, admin):
    response = batch(client, producer, [{"type": "email"}, {"type": "email",
                                                            "priority": "critical"}])
    assert response.status_code == 403 and "jobs.1" in response.json["detail"]
    assert api.list(admin).json["jobs"] == []


@pytest.mark.parametrize("body", [{}, {"jobs": []}, {"jobs": {}}, {"jobs": [1]},
                                  {"jobs": [{"type": "email"}], "extra": 1}])
def test_malformed_batches_are_422(client, producer, body):
    response = client.post("/jobs/batch", json=body, headers=producer.headers)
    assert response.status_code == 422
    assert response.content_type == "application/problem+json"


def test_batch_items_replay_their_idempotency_keys(client, api, producer):
    first = api.enqueue(producer, idempotency_key="a", payload={"v": 1}).json
    response = batch(client, producer, [
        {"type": "email", "idempotency_key": "a", "payload": {"v": 1}},
        {"type": "email", "idempotency_key": "b"},
        {"type": "email", "idempotency_key": "b"},  # the same key twice in one batch
        {"type": "email"},
    ])
    jobs = response.json["jobs"]
    assert response.status_code == 201
    assert [job["replayed"] for job in jobs] == [True, False, True, False]
    assert jobs[0]["id"] == first["id"]
    assert jobs[1]["id"] == jobs[2]["id"]
    again = batch(client, producer, [{"type": "email", "idempotency_key": "b"}]).json["jobs"]
    assert again[0]["id"] == jobs[1]["id"] and again[0]["replayed"] is True


def test_batch_item_reusing_a_key_for_another_request_is_422_and_stores_nothing(
        client, api, producer, admin):
    api.enqueue(producer, idempotency_key="a", payload={"v": 1})
    response = batch(client, producer, [{"type": "email"},
                                        {"type": "email", "idempotency_key": "a",
                                         "payload": {"v": 2}}])
    assert response.status_code == 422
    assert "jobs.1.idempotency_key" in response.json["errors"]
    assert len(api.list(admin).json["jobs"]) == 1


def test_batch_refuses_the_idempotency_key_header(client, producer):
    response = batch(client, producer, [{"type": "email"}], headers={"Idempotency-Key": "k"})
    assert response.status_code == 422


def test_concurrent_batches_with_shared_keys_make_each_job_once(app, producer, admin):
    barrier = threading.Barrier(6)
    statuses: list[int] = []

    def send() -> None:
        client = app.test_client()
        barrier.wait(timeout=30)
        jobs = [{"type": "email", "idempotency_key": f"k{n}"} for n in range(20)]
        statuses.append(batch(client, producer, jobs).status_code)

    threads = [threading.Thread(target=send) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert statuses == [201] * 6
    assert len(Api(app.test_client()).list(admin).json["jobs"]) == 20


def test_claim_many_takes_up_to_max_jobs_in_claim_order_each_with_its_token(client, api,
                                                                            admin, worker):
    low = api.enqueue(admin, priority="low").json["id"]
    high = api.enqueue(admin, priority="high").json["id"]
    medium = [api.enqueue(admin).json["id"] for _ in range(3)]

    first = claim_many(client, worker, max_jobs=3).json["jobs"]
    rest = claim_many(client, worker, max_jobs=100).json["jobs"]

    assert [job["id"] for job in first] == [high, *medium[:2]]
    assert [job["id"] for job in rest] == [medium[2], low]
    tokens = [job["lease_token"] for job in first + rest]
    assert len(set(tokens)) == 5
    assert all(job["status"] == "running" and job["worker_id"] == "worker-1"
               for job in first + rest)
    assert claim_many(client, worker).json == {"jobs": []}


def test_claim_many_defaults_to_ten_and_refuses_more_than_a_hundred(client, api, admin,
                                                                    worker):
    for _ in range(12):
        api.enqueue(admin)
    assert len(claim_many(client, worker).json["jobs"]) == 10
    for max_jobs in (0, 101, True, "5"):
        assert claim_many(client, worker, max_jobs=max_jobs).status_code == 422


def test_claim_many_honours_types_and_the_worker_id_rule(client, api, producer, worker):
    api.enqueue(producer, type="email")
    pdf = api.enqueue(producer, type="pdf").json["id"]
    assert [j["id"] for j in claim_many(client, worker, types=["pdf"]).json["jobs"]] == [pdf]
    assert claim_many(client, worker, worker_id="someone-else").status_code == 403


def test_claim_many_is_for_workers_only(client, producer):
    assert claim_many(client, producer).status_code == 403


def test_threads_claiming_many_never_share_a_job(app, admin, worker):
    api = Api(app.test_client())
    batch(app.test_client(), admin, [{"type": "sync"} for _ in range(300)])
    seen: list[int] = []
    lock = threading.Lock()

    def drain() -> None:
        client = app.test_client()
        while jobs := claim_many(client, worker, max_jobs=7).json["jobs"]:
            with lock:
                seen.extend(job["id"] for job in jobs)

    threads = [threading.Thread(target=drain) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(seen) == len(set(seen)) == 300
    assert api.list(admin, status="pending").json["jobs"] == []


def test_complete_many_answers_each_item_on_its_own(client, api, producer, make_key,
                                                    worker, clock):
    other = make_key("worker-2", "worker")
    ids = [api.enqueue(producer).json["id"] for _ in range(4)]
    mine = claim_many(client, worker, max_jobs=3).json["jobs"]
    theirs = api.claim(other).json

    response = complete_many(client, worker, [
        {"id": mine[0]["id"], "lease_token": mine[0]["lease_token"], "result": {"n": 0}},
        {"id": mine[1]["id"], "lease_token": "stale"},
        {"id": theirs["id"]},
        {"id": 999_999},
        {"id": mine[2]["id"]},
    ])

    assert response.status_code == 200
    results = response.json["results"]
    assert [(r["id"], r["status"]) for r in results] == [
        (mine[0]["id"], 200), (mine[1]["id"], 409), (theirs["id"], 409), (999_999, 404),
        (mine[2]["id"], 200)]
    assert results[0]["job"]["status"] == "completed"
    assert results[0]["job"]["result"] == {"n": 0}
    assert results[1]["problem"]["status"] == 409
    assert results[3]["problem"]["type"].endswith("not-found")
    assert api.get(worker, mine[1]["id"]).json["status"] == "running"
    assert api.get(other, theirs["id"]).json["status"] == "running"
    assert set(ids) == {job["id"] for job in mine} | {theirs["id"]}


@pytest.mark.parametrize("body", [{}, {"items": []}, {"items": [{"lease_token": "x"}]},
                                  {"items": [{"id": 0}]}, {"items": [{"id": "1"}]},
                                  {"items": [{"id": 1}] * 101}])
def test_malformed_complete_many_is_422(client, worker, body):
    response = client.post("/jobs/complete-many", json=body, headers=worker.headers)
    assert response.status_code == 422


def test_complete_many_with_a_result_too_large_completes_nothing(client, api, producer,
                                                                 worker):
    ids = [api.enqueue(producer).json["id"] for _ in range(2)]
    claim_many(client, worker)
    response = complete_many(client, worker, [{"id": ids[0]},
                                               {"id": ids[1], "result": {"x": "y" * 70_000}}])
    assert response.status_code == 422
    assert api.get(worker, ids[0]).json["status"] == "running"


def test_claim_many_naming_unconfigured_types_is_422_naming_them(client, api, producer,
                                                                 worker):
    api.enqueue(producer)
    response = claim_many(client, worker, types=["emial"], wait_seconds=5)
    assert response.status_code == 422
    assert "emial" in response.json["errors"]["types"][0]
    assert [j["type"] for j in claim_many(client, worker, types=["email"]).json["jobs"]] == [
        "email"]
