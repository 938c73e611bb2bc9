"""Every transition of the state machine, allowed and refused, seen through the API."""

from __future__ import annotations

import pytest

from app.core.statuses import JobStatus


@pytest.fixture
def job_in(api, producer, worker, admin):
    """Put a fresh job into the given status; returns (job id, lease token or None)."""

    def make(status: str) -> tuple[int, str | None]:
        if status == "waiting":  # on a dependency that stays pending
            dependency = api.enqueue(producer).json["id"]
            waiting = api.enqueue(producer, max_retries=0, depends_on=[dependency]).json
            assert waiting["status"] == "waiting"
            return waiting["id"], None
        if status == "reserved":
            reserved = api.enqueue(producer, max_retries=0,
                                   reserve={"confirm_within_seconds": 60}).json
            assert reserved["status"] == "reserved"
            return reserved["id"], None
        job_id = api.enqueue(producer, max_retries=0).json["id"]
        if status == "pending":
            return job_id, None
        if status == "cancelled":
            assert api.cancel(admin, job_id).status_code == 200
            return job_id, None
        claimed = api.claim(worker).json
        assert claimed["id"] == job_id
        token = claimed["lease_token"]
        if status == "running":
            return job_id, token
        if status == "suspended":  # on an event nobody posts (docs/WAITS.md)
            suspended = api.client.post(f"/jobs/{job_id}/suspend", headers=worker.headers,
                                        json={"lease_token": token, "wait_for": {
                                            "event": "never", "timeout_seconds": 3600}})
            assert suspended.json["status"] == "suspended"
            return job_id, None
        if status == "completed":
            assert api.complete(worker, job_id, lease_token=token).status_code == 200
        elif status == "failed":
            assert api.fail(worker, job_id, lease_token=token).json["status"] == "failed"
        return job_id, None

    return make


ALL = [s.value for s in JobStatus]

# (action, the statuses it is allowed from, the status it leads to)
TRANSITIONS = [
    ("complete", {"running"}, "completed"),
    ("fail", {"running"}, "failed"),  # max_retries=0: straight to failed
    ("heartbeat", {"running"}, "running"),
    # A running job's cancel is a request: it stays running until its worker reports
    # (tests/jobs/test_running_jobs.py).
    # A reserved job's cancel is its release (tests/jobs/test_reserved_jobs.py).
    ("cancel", {"pending", "waiting", "running", "reserved", "suspended"}, "cancelled"),
    ("retry", {"failed", "cancelled"}, "pending"),
]


def _act(api, action, job_id, token, worker, admin):
    if action == "complete":
        return api.complete(worker, job_id)
    if action == "fail":
        return api.fail(worker, job_id)
    if action == "heartbeat":
        return api.heartbeat(worker, job_id)
    if action == "cancel":
        return api.cancel(admin, job_id)
    return api.retry(admin, job_id)


@pytest.mark.parametrize("action,allowed,result", TRANSITIONS, ids=[t[0] for t in TRANSITIONS])
@pytest.mark.parametrize("status", ALL)
def test_transition_from_each_status(api, job_in, worker, admin, action, allowed, result,
                                     status):
    job_id, token = job_in(status)

    response = _act(api, action, job_id, token, worker, admin)

    after = api.get(admin, job_id).json["status"]
    if status in allowed:
        assert response.status_code == 200, response.json
        expected = "running" if (action, status) == ("cancel", "running") else result
        assert response.json["status"] == expected == after
    else:
        assert response.status_code == 409
        assert response.content_type == "application/problem+json"
        assert after == status


def test_complete_stores_the_result_and_keeps_the_last_holder(api, producer, worker):
    job_id = api.enqueue(producer).json["id"]
    token = api.claim(worker).json["lease_token"]
    done = api.complete(worker, job_id, lease_token=token, result={"pages": 3}).json
    assert done["result"] == {"pages": 3}
    assert done["worker_id"] == "worker-1"
    assert done["lease_expires_at"] is None


def test_fail_with_retries_left_requeues_with_retry_count_plus_one(api, producer, worker,
                                                                     admin):
    job_id = api.enqueue(producer, max_retries=3).json["id"]
    api.claim(worker)
    failed = api.fail(worker, job_id, error="smtp down").json
    assert failed["status"] == "pending"
    assert failed["retry_count"] == 1
    assert failed["claimed_at"] is None and failed["worker_id"] is None
    assert failed["lease_expires_at"] is None
    assert api.get(admin, job_id).json["error"] == "smtp down"


@pytest.mark.parametrize("max_retries", [0, 3])
def test_retries_until_max_retries_then_failed(api, producer, worker, admin, clock,
                                               max_retries):
    job_id = api.enqueue(producer, max_retries=max_retries).json["id"]
    statuses = []
    for _ in range(max_retries + 1):
        clock.advance(7200)  # past any backoff
        assert api.claim(worker).json["id"] == job_id
        statuses.append(api.fail(worker, job_id, error="nope").json["status"])

    assert statuses == ["pending"] * max_retries + ["failed"]
    final = api.get(admin, job_id).json
    assert final["retry_count"] == max_retries
    assert final["worker_id"] == "worker-1"  # the last holder is kept
    clock.advance(7200)
    assert api.claim(worker).status_code == 204


def test_admin_retry_gives_a_fresh_budget(api, producer, worker, admin):
    job_id = api.enqueue(producer, max_retries=0).json["id"]
    api.claim(worker)
    api.fail(worker, job_id)
    retried = api.retry(admin, job_id).json
    assert retried["status"] == "pending" and retried["retry_count"] == 0
    assert retried["worker_id"] is None
    assert api.claim(worker).json["id"] == job_id


def test_cancelled_job_is_never_claimed(api, producer, worker, admin):
    job_id = api.enqueue(producer).json["id"]
    api.cancel(admin, job_id)
    assert api.claim(worker).status_code == 204


@pytest.mark.parametrize("action", ["cancel", "retry"])
def test_admin_transitions_on_unknown_jobs_answer_404(api, admin, action):
    response = api.cancel(admin, 4242) if action == "cancel" else api.retry(admin, 4242)
    assert response.status_code == 404
