"""POST /jobs/retry-many and /jobs/cancel-many: by filter or ids, skipping jobs in other statuses
(contract section 13); their batches: tests/jobs/test_bulk_in_batches.py."""

from __future__ import annotations

from app.core.clock import to_rfc3339


def bulk(client, key, action, **body):
    return client.post(f"/jobs/{action}-many", json=body, headers=key.headers)


def failed_job(api, producer, worker, **enqueue):
    job_id = api.enqueue(producer, max_retries=0, **enqueue).json["id"]
    claimed = api.claim(worker, types=[enqueue.get("type", "email")]).json
    assert claimed["id"] == job_id
    api.fail(worker, job_id)
    return job_id


def test_cancel_many_cancels_the_pending_jobs_of_a_type_and_skips_the_others(
        api, client, producer, worker, admin):
    emails = [api.enqueue(producer, type="email").json["id"] for _ in range(3)]
    pdf = api.enqueue(producer, type="pdf").json["id"]
    running = api.claim(worker).json["id"]  # the first email: running, skipped

    answer = bulk(client, admin, "cancel", type="email")

    assert answer.status_code == 200
    assert answer.json == {"count": 2, "ids": [i for i in emails if i != running]}
    assert api.get(admin, pdf).json["status"] == "pending"
    assert api.get(admin, running).json["status"] == "running"
    assert all(api.get(admin, i).json["status"] == "cancelled" for i in answer.json["ids"])


def test_retry_many_gives_failed_jobs_a_fresh_budget(api, client, producer, worker, admin):
    ids = [failed_job(api, producer, worker) for _ in range(2)]
    pending = api.enqueue(producer).json["id"]

    answer = bulk(client, admin, "retry", ids=[*ids, pending, 999_999])

    assert answer.json == {"count": 2, "ids": ids}
    for job_id in ids:
        job = api.get(admin, job_id).json
        assert (job["status"], job["retry_count"]) == ("pending", 0)


def test_a_status_the_action_does_not_start_from_changes_nothing(api, client, producer, admin):
    api.enqueue(producer)
    assert bulk(client, admin, "retry", status="pending").json == {"count": 0, "ids": []}


def test_retry_many_by_status_takes_only_that_status(api, client, producer, worker, admin):
    failed = failed_job(api, producer, worker)
    cancelled = api.enqueue(producer).json["id"]
    api.cancel(admin, cancelled)
    assert bulk(client, admin, "retry", status="cancelled").json == {
        "count": 1, "ids": [cancelled]}
    assert api.get(admin, failed).json["status"] == "failed"


def test_created_before_after_and_limit_narrow_the_jobs(api, client, producer, admin, clock):
    early = [api.enqueue(producer).json["id"] for _ in range(3)]
    clock.advance(60)
    cut = clock.now_us()
    clock.advance(60)
    late = api.enqueue(producer).json["id"]

    answer = bulk(client, admin, "cancel", created_before=to_rfc3339(cut), limit=2)
    assert answer.json == {"count": 2, "ids": early[:2]}
    answer = bulk(client, admin, "cancel", created_after=to_rfc3339(cut))
    assert answer.json == {"count": 1, "ids": [late]}


def test_each_job_changed_gets_its_event(api, client, producer, admin):
    ids = [api.enqueue(producer).json["id"] for _ in range(2)]
    bulk(client, admin, "cancel", ids=ids)
    for job_id in ids:
        shown = client.get(f"/jobs/{job_id}/events", headers=admin.headers).json["events"]
        assert (shown[-1]["event"], shown[-1]["actor"]) == ("cancelled", "admin-1")


def test_bad_filters_are_422(client, admin):
    for body in ({"limit": 0}, {"limit": 10_001}, {"ids": []}, {"status": "done"},
                 {"created_before": "yesterday"}, {"ids": ["1"]}, {"extra": 1}):
        assert bulk(client, admin, "cancel", **body).status_code == 422, body


def test_only_admins_act_in_bulk(client, producer, worker):
    for key in (producer, worker):
        assert bulk(client, key, "cancel").status_code == 403
        assert bulk(client, key, "retry").status_code == 403


def test_retry_many_skips_a_job_whose_unique_key_a_twin_holds(api, client, producer, worker,
                                                              admin):
    unique = {"key": "reindex-42"}
    failed = failed_job(api, producer, worker, payload={"n": 1}, unique=unique)
    other_failed = failed_job(api, producer, worker, payload={"n": 2})
    twin = api.enqueue(producer, payload={"n": 3}, unique=unique).json["id"]

    answer = bulk(client, admin, "retry", ids=[failed, other_failed])

    assert answer.status_code == 200, answer.json
    assert answer.json == {"count": 1, "ids": [other_failed]}
    assert api.get(admin, failed).json["status"] == "failed"
    assert api.get(admin, twin).json["status"] == "pending"
