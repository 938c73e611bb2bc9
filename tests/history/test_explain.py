"""GET /jobs/{id}/explain: why a job is or is not running, most important reason first."""

from __future__ import annotations

from typing import Any

from app.core.clock import to_rfc3339
from tests.conftest import Api


def _without_place(shown: dict[str, Any]) -> dict[str, Any]:
    """The explanation without its place in line (tests/history/test_position.py's), which
    a claimable job always has: next in its type's line here, its type not aging."""
    assert shown["position"] == 0 and shown["position_capped"] is False
    assert shown["aging"] is None
    return {key: value for key, value in shown.items()
            if key not in ("position", "position_capped", "estimated_start_seconds", "aging")}


def explain(client, key, job_id):
    return Api(client).explain(key, job_id)


def codes(shown):
    return [reason["code"] for reason in shown["reasons"]]


def test_a_finished_job_says_finished(api, client, producer, worker, admin):
    job_id = api.enqueue(producer).json["id"]
    api.claim(worker)
    api.complete(worker, job_id)
    shown = explain(client, admin, job_id)
    assert shown["status"] == "completed"
    assert shown["claimable_now"] is False
    assert codes(shown) == ["finished"]


def test_a_running_job_says_who_holds_it_until_when(api, client, producer, worker, admin):
    job_id = api.enqueue(producer).json["id"]
    claimed = api.claim(worker).json
    [reason] = explain(client, admin, job_id)["reasons"]
    assert reason["code"] == "running"
    assert reason["worker_id"] == "worker-1"
    assert reason["lease_expires_at"] == claimed["lease_expires_at"]
    assert "worker-1" in reason["message"]


def test_a_job_scheduled_later_says_until_when(api, client, producer, worker, admin, clock):
    api.claim(worker)  # a live worker that claimed just now
    job_id = api.enqueue(producer, delay_seconds=600).json["id"]
    shown = explain(client, admin, job_id)
    assert shown["claimable_now"] is False
    assert shown["reasons"][0] == {
        "code": "scheduled", "until": to_rfc3339(clock.now_us() + 600_000_000),
        "message": f"It is not claimable before {to_rfc3339(clock.now_us() + 600_000_000)}."}
    assert codes(shown) == ["scheduled"]


def test_a_claimable_job_with_a_recent_worker_and_nothing_ahead_has_no_reason(
        api, client, producer, worker, admin):
    api.claim(worker)
    job_id = api.enqueue(producer).json["id"]
    assert _without_place(explain(client, admin, job_id)) == {
        "job_id": job_id, "status": "pending", "claimable_now": True, "reasons": []}


def test_no_live_worker_key_for_the_type_says_no_worker_for_type(api, client, app, producer,
                                                                 make_key, admin):
    make_key("pdf-only", "worker", types=["pdf"])
    make_key("revoked", "worker")
    app.extensions["queuelog"].keys.revoke_key("revoked")
    job_id = api.enqueue(producer, type="email").json["id"]
    shown = explain(client, admin, job_id)
    assert shown["claimable_now"] is True
    [reason] = shown["reasons"]
    assert (reason["code"], reason["type"], reason["workers"]) == (
        "no_worker_for_type", "email", [])


def test_no_claim_for_five_minutes_says_no_worker_for_type_with_the_last_claim(
        api, client, producer, worker, admin, clock):
    claimed_at = clock.now_us()
    api.claim(worker)
    clock.advance(301)
    job_id = api.enqueue(producer).json["id"]
    [reason] = explain(client, admin, job_id)["reasons"]
    assert reason["code"] == "no_worker_for_type"
    assert reason["workers"] == ["worker-1"]
    assert reason["last_claim_at"] == to_rfc3339(claimed_at)


def test_jobs_ahead_is_exact_at_ten_thousand_pending_jobs(app, api, client, producer, worker,
                                                          admin):
    # QUEUELOG_EXPLAIN_AHEAD_LIMIT raised past the 10,000 stored, so that the count is exact
    # (the capped count: tests/test_backlog_counts.py).
    app.extensions["queuelog"].history.ahead_limit = 10_000
    def batch(count, **job):
        for start in range(0, count, 1000):
            answer = client.post("/jobs/batch", headers=admin.headers, json={
                "jobs": [{"type": "email", **job} for _ in range(min(1000, count - start))]})
            assert answer.status_code == 201

    api.claim(worker)  # a live worker, so that jobs_ahead stands alone
    batch(3000, priority="medium")  # before it, same priority: ahead (by id)
    batch(1000, priority="low", type="pdf")  # lower priority: behind
    job_id = api.enqueue(producer, priority="medium").json["id"]
    batch(2000, priority="medium")  # same priority, later: behind
    batch(3000, priority="high")  # higher priority, later: ahead
    batch(1000, priority="critical", type="pdf")  # ahead, another type
    batch(50, priority="critical", delay_seconds=60)  # not due: not ahead

    shown = explain(client, admin, job_id)

    assert shown["claimable_now"] is True
    [reason] = shown["reasons"]
    assert (reason["code"], reason["count"], reason["of_its_type"]) == ("jobs_ahead", 7000, 6000)
    assert (reason["count_capped"], reason["of_its_type_capped"]) == (False, False)


def test_the_owning_producer_may_explain_others_may_not(api, client, producer, make_key,
                                                        worker):
    other = make_key("producer-2", "producer")
    job_id = api.enqueue(producer).json["id"]
    assert client.get(f"/jobs/{job_id}/explain", headers=producer.headers).status_code == 200
    assert client.get(f"/jobs/{job_id}/explain", headers=other.headers).status_code == 404
    assert client.get(f"/jobs/{job_id}/explain", headers=worker.headers).status_code == 403
    assert client.get("/jobs/77777/explain", headers=producer.headers).status_code == 404


def set_type(client, admin, job_type, **settings):
    answer = client.patch(f"/types/{job_type}", json=settings, headers=admin.headers)
    assert answer.status_code == 200, answer.json


def test_a_paused_type_says_type_paused_first_and_not_claimable(api, client, producer,
                                                                 worker, admin):
    api.claim(worker)
    set_type(client, admin, "email", paused=True)
    ahead = api.enqueue(producer).json["id"]
    job_id = api.enqueue(producer).json["id"]
    shown = explain(client, admin, job_id)
    assert shown["claimable_now"] is False
    assert codes(shown) == ["type_paused", "jobs_ahead"]
    assert shown["reasons"][0]["type"] == "email"
    assert explain(client, admin, ahead)["claimable_now"] is False
    # A scheduled job is held back by its run_at: flow control adds nothing to it.
    later = api.enqueue(producer, delay_seconds=60).json["id"]
    assert codes(explain(client, admin, later)) == ["scheduled"]


def test_max_running_reached_says_type_at_max_running(api, client, producer, worker, admin):
    set_type(client, admin, "email", max_running=2)
    api.enqueue(producer)
    api.enqueue(producer)
    first = api.claim(worker).json
    second = api.claim(worker).json
    job_id = api.enqueue(producer).json["id"]
    shown = explain(client, admin, job_id)
    assert shown["claimable_now"] is False
    [reason] = shown["reasons"]
    assert reason["code"] == "type_at_max_running"
    assert (reason["running"], reason["limit"]) == (2, 2)
    assert reason["next_lease_expiry"] == min(first["lease_expires_at"],
                                              second["lease_expires_at"])
    api.complete(worker, first["id"])
    assert _without_place(explain(client, admin, job_id)) == {
        "job_id": job_id, "status": "pending", "claimable_now": True, "reasons": []}


def test_a_full_concurrency_key_says_key_at_max_running(api, client, producer, worker, admin):
    set_type(client, admin, "email", max_running_per_key=1)
    api.enqueue(producer, concurrency_key="tenant-a")
    api.claim(worker)
    held = api.enqueue(producer, concurrency_key="tenant-a").json["id"]
    free = api.enqueue(producer, concurrency_key="tenant-b").json["id"]
    shown = explain(client, admin, held)
    assert shown["claimable_now"] is False
    [reason] = shown["reasons"]
    assert reason["code"] == "key_at_max_running"
    assert (reason["concurrency_key"], reason["running"], reason["limit"]) == ("tenant-a", 1, 1)
    other = explain(client, admin, free)
    assert other["claimable_now"] is True
    assert "key_at_max_running" not in codes(other)


def test_an_empty_bucket_says_rate_limited_with_the_next_token(api, client, producer, worker,
                                                                admin, clock):
    set_type(client, admin, "email", rate_per_second=2, burst=1)
    api.enqueue(producer)
    api.claim(worker)
    spent_at = clock.now_us()
    job_id = api.enqueue(producer).json["id"]
    shown = explain(client, admin, job_id)
    assert shown["claimable_now"] is False
    [reason] = shown["reasons"]
    assert reason["code"] == "rate_limited"
    assert reason["next_token_at"] == to_rfc3339(spent_at + 500_000)
    clock.advance(0.25)
    assert explain(client, admin, job_id)["reasons"][0]["next_token_at"] == to_rfc3339(
        spent_at + 500_000)
    clock.advance(0.25)
    assert api.claim(worker).json["id"] == job_id


def test_limits_not_reached_add_no_reason(api, client, producer, worker, admin):
    set_type(client, admin, "email", max_running=5, max_running_per_key=2, rate_per_second=10)
    api.enqueue(producer, concurrency_key="k")
    api.claim(worker)
    job_id = api.enqueue(producer, concurrency_key="k").json["id"]
    assert _without_place(explain(client, admin, job_id)) == {
        "job_id": job_id, "status": "pending", "claimable_now": True, "reasons": []}
