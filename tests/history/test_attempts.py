"""Attempts: one record per attempt, opened by the claim and closed by complete, fail or a
lease rescue, in their transactions (contract section 13)."""

from __future__ import annotations


def attempts(client, key, job_id):
    return client.get(f"/jobs/{job_id}/attempts", headers=key.headers)


def test_a_job_failed_twice_by_different_workers_then_completed_shows_three_attempts(
        api, client, producer, make_key, admin, clock):
    first, second, third = (make_key(f"worker-{n}", "worker") for n in "abc")
    job_id = api.enqueue(producer, max_retries=3).json["id"]

    api.claim(first)
    clock.advance(2)
    api.fail(first, job_id, error="connect to postgres://app:hunter2@db failed",
             retry_in_seconds=0)
    api.claim(second)
    clock.advance(3)
    api.fail(second, job_id, error="timed out", retry_in_seconds=0)
    api.claim(third)
    clock.advance(0.5)
    assert api.complete(third, job_id).status_code == 200

    answer = attempts(client, admin, job_id)
    assert answer.status_code == 200
    shown = answer.json["attempts"]
    assert [(a["number"], a["worker_id"], a["outcome"], a["error"], a["duration_ms"])
            for a in shown] == [
        (1, "worker-a", "failed", "connect to postgres://***@db failed", 2000),
        (2, "worker-b", "failed", "timed out", 3000),
        (3, "worker-c", "completed", None, 500),
    ]
    assert all(a["ended_at"] is not None for a in shown)


def test_duration_is_whole_milliseconds(api, client, producer, worker, admin, clock):
    job_id = api.enqueue(producer).json["id"]
    api.claim(worker)
    clock.advance(0.4932248)
    api.complete(worker, job_id)
    [attempt] = attempts(client, admin, job_id).json["attempts"]
    assert attempt["duration_ms"] == 493


def test_a_running_attempt_is_open(api, client, producer, worker, admin):
    job_id = api.enqueue(producer).json["id"]
    claimed_at = api.claim(worker).json["claimed_at"]
    [attempt] = attempts(client, admin, job_id).json["attempts"]
    assert attempt == {"number": 1, "worker_id": "worker-1", "worker_instance": None,
                       "claimed_at": claimed_at,
                       "ended_at": None, "outcome": "running", "error": None,
                       "fingerprint": None, "duration_ms": None}


def test_a_lease_rescued_by_the_service_shows_lease_expired(api, client, producer, make_key,
                                                             admin, clock):
    dead = make_key("dead-worker", "worker")
    alive = make_key("alive-worker", "worker")
    job_id = api.enqueue(producer, max_retries=1).json["id"]
    api.claim(dead, lease_seconds=5)
    clock.advance(6)
    api.claim(alive)  # rescues the expired lease, then claims the job again

    shown = attempts(client, admin, job_id).json["attempts"]
    assert [(a["worker_id"], a["outcome"], a["error"], a["duration_ms"]) for a in shown] == [
        ("dead-worker", "lease_expired", "lease expired", 6000),
        ("alive-worker", "running", None, None),
    ]


def test_attempts_are_numbered_on_after_an_admins_retry(api, client, producer, worker, admin):
    job_id = api.enqueue(producer, max_retries=0).json["id"]
    api.claim(worker)
    api.fail(worker, job_id)
    api.retry(admin, job_id)
    api.claim(worker)
    shown = attempts(client, admin, job_id).json["attempts"]
    assert [(a["number"], a["outcome"]) for a in shown] == [(1, "failed"), (2, "running")]


def test_claim_many_opens_one_attempt_per_job(api, client, producer, worker, admin):
    ids = [api.enqueue(producer).json["id"] for _ in range(3)]
    client.post("/jobs/claim-many", json={"max_jobs": 3}, headers=worker.headers)
    for job_id in ids:
        [attempt] = attempts(client, admin, job_id).json["attempts"]
        assert attempt["outcome"] == "running"


def test_a_refused_report_changes_no_attempt(api, client, producer, make_key, admin, clock):
    stale = make_key("stale-worker", "worker")
    fresh = make_key("fresh-worker", "worker")
    job_id = api.enqueue(producer).json["id"]
    api.claim(stale, lease_seconds=5)
    clock.advance(6)
    api.claim(fresh)
    assert api.complete(stale, job_id).status_code == 409
    shown = attempts(client, admin, job_id).json["attempts"]
    assert [a["outcome"] for a in shown] == ["lease_expired", "running"]


def test_the_owning_producer_sees_attempts_without_error_text(api, client, producer, worker):
    job_id = api.enqueue(producer).json["id"]
    api.claim(worker)
    api.fail(worker, job_id, error="password=swordfish")
    [attempt] = attempts(client, producer, job_id).json["attempts"]
    assert attempt["outcome"] == "failed"
    assert "error" not in attempt


def test_another_producer_gets_404_and_a_worker_403(api, client, producer, make_key, worker):
    other = make_key("producer-2", "producer")
    job_id = api.enqueue(producer).json["id"]
    api.claim(worker)
    assert attempts(client, other, job_id).status_code == 404
    assert attempts(client, worker, job_id).status_code == 403
    assert attempts(client, producer, 999_999).status_code == 404
