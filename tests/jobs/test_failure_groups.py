"""Failure groups (contract §19) through the API on both engines: failed attempts grouped by
the fingerprint of their redacted error, kept up to date by the failing transactions, read by
GET /failures, and a group's failed jobs retried by POST /jobs/retry-many's fingerprint."""

from __future__ import annotations

from typing import Any

from app.core.clock import to_rfc3339
from tests.conftest import Api, Key

TIMEOUT = "timeout after {ms} ms on 10.0.3.{host}:5432"
REFUSED = "connection refused by mail.example.com:25"


def fail_once(api: Api, producer: Key, worker: Key, error: str, *, job_type: str = "email",
              max_retries: int = 0, job_id: int | None = None) -> int:
    """Enqueue a job (unless given) and fail its next attempt with `error`; its id."""
    if job_id is None:
        job_id = api.enqueue(producer, type=job_type, max_retries=max_retries).json["id"]
    claimed = api.claim(worker, types=[job_type]).json
    assert claimed["id"] == job_id
    failed = api.fail(worker, job_id, lease_token=claimed["lease_token"], error=error,
                      retry_in_seconds=0)
    assert failed.status_code == 200, failed.json
    return job_id


def groups(client: Any, admin: Key, **query: Any) -> list[dict[str, Any]]:
    answer = client.get("/failures", headers=admin.headers, query_string=query)
    assert answer.status_code == 200, answer.json
    shown: list[dict[str, Any]] = answer.json["groups"]
    return shown


def test_errors_that_differ_only_in_numbers_and_hosts_are_one_group(api, client, clock,
                                                                   producer, worker, admin):
    first_at = clock.now_us()
    fail_once(api, producer, worker, TIMEOUT.format(ms=30012, host=7))
    clock.advance(5)
    fail_once(api, producer, worker, TIMEOUT.format(ms=29876, host=9))
    clock.advance(5)
    refused = fail_once(api, producer, worker, REFUSED, job_type="sync")

    shown = groups(client, admin)

    assert [(g["type"], g["count"], g["jobs_failed"]) for g in shown] == [
        ("sync", 1, 1), ("email", 2, 2)]  # most recently seen first
    email = shown[1]
    assert email["sample"] == TIMEOUT.format(ms=29876, host=9)  # the newest error
    assert email["first_seen"] == to_rfc3339(first_at)
    assert email["last_seen"] == to_rfc3339(first_at + 5_000_000)
    assert len(email["fingerprint"]) == 16 and email["fingerprint"] != shown[0]["fingerprint"]
    attempts = client.get(f"/jobs/{refused}/attempts", headers=admin.headers).json["attempts"]
    assert attempts[0]["fingerprint"] == shown[0]["fingerprint"]


def test_count_is_attempts_and_jobs_failed_is_jobs_that_ended_failed(api, client, producer,
                                                                     worker, admin):
    job_id = fail_once(api, producer, worker, TIMEOUT.format(ms=1, host=1), max_retries=2)
    assert api.get(producer, job_id).json["status"] == "pending"  # retried
    fail_once(api, producer, worker, TIMEOUT.format(ms=2, host=2), job_id=job_id)
    fail_once(api, producer, worker, TIMEOUT.format(ms=3, host=3), job_id=job_id)
    assert api.get(producer, job_id).json["status"] == "failed"

    [group] = groups(client, admin)
    assert (group["count"], group["jobs_failed"]) == (3, 1)


def test_a_lease_that_ran_out_is_a_failure_group_of_its_own(api, client, clock, producer,
                                                           worker, admin):
    job_id = api.enqueue(producer, max_retries=0).json["id"]
    api.claim(worker, lease_seconds=5)
    clock.advance(10)
    assert api.claim(worker).status_code == 204  # the claim rescues the expired lease
    assert api.get(admin, job_id).json["status"] == "failed"

    [group] = groups(client, admin)
    assert (group["sample"], group["count"], group["jobs_failed"]) == ("lease expired", 1, 1)


def test_secrets_are_redacted_before_the_fingerprint_and_never_shown(api, client, producer,
                                                                    worker, admin):
    fail_once(api, producer, worker, "login failed: password=hunter2 for smtp")
    fail_once(api, producer, worker, "login failed: password=correct-horse for smtp")

    [group] = groups(client, admin)
    assert group["count"] == 2
    assert "hunter2" not in group["sample"] and "correct-horse" not in group["sample"]
    assert "***" in group["sample"]


def test_filters_by_type_and_since(api, client, clock, producer, worker, admin):
    fail_once(api, producer, worker, TIMEOUT.format(ms=1, host=1))
    clock.advance(3600)
    since = to_rfc3339(clock.now_us())
    fail_once(api, producer, worker, REFUSED, job_type="sync")

    assert [g["type"] for g in groups(client, admin, type="email")] == ["email"]
    assert [g["type"] for g in groups(client, admin, since=since)] == ["sync"]
    assert groups(client, admin, type="sync", since=since)[0]["count"] == 1
    assert [g["type"] for g in groups(client, admin, limit=1)] == ["sync"]


def test_only_admins_read_failures_and_bad_queries_are_422(client, producer, worker, admin):
    assert client.get("/failures").status_code == 401
    for key in (producer, worker):
        assert client.get("/failures", headers=key.headers).status_code == 403
    for query in ({"since": "yesterday"}, {"limit": 0}, {"limit": 501}, {"kind": "x"},
                  {"since": "2026-12-02T10:00:00"}, {"type": ""}):
        answer = client.get("/failures", headers=admin.headers, query_string=query)
        assert answer.status_code == 422, query
        assert answer.content_type == "application/problem+json"
    assert client.get("/failures/email/zzzz", headers=admin.headers).status_code == 404
    assert client.get("/failures/email/0123456789abcdef",
                      headers=admin.headers).status_code == 404


def test_a_group_shows_its_hours_and_newest_jobs(api, client, clock, producer, worker, admin):
    clock.advance(50 * 60)  # in the second half of an hour: counted in that hour
    first = fail_once(api, producer, worker, TIMEOUT.format(ms=1, host=1))
    clock.advance(2 * 3600)
    second = fail_once(api, producer, worker, TIMEOUT.format(ms=2, host=2))
    [group] = groups(client, admin)

    detail = client.get(f"/failures/email/{group['fingerprint']}", headers=admin.headers)

    assert detail.status_code == 200, detail.json
    hourly = detail.json["hourly"]
    assert len(hourly) == 24
    assert [h["count"] for h in hourly[-3:]] == [1, 0, 1]
    assert sum(h["count"] for h in hourly) == 2
    assert detail.json["newest_job_ids"] == [second, first]


def test_a_group_says_its_jobs_failing_now_beside_those_that_ever_failed(
        api, client, producer, worker, admin, monkeypatch):
    jobs = [fail_once(api, producer, worker, TIMEOUT.format(ms=n, host=n)) for n in range(3)]
    # One retried by hand and failed again alike; one retried and failed with another error.
    for job_id, error in ((jobs[0], TIMEOUT.format(ms=7, host=7)), (jobs[1], REFUSED)):
        assert client.post(f"/jobs/{job_id}/retry", headers=admin.headers).status_code == 200
        fail_once(api, producer, worker, error, job_id=job_id)
    fingerprint = next(g["fingerprint"] for g in groups(client, admin)
                       if g["sample"].startswith("timeout"))

    detail = client.get(f"/failures/email/{fingerprint}", headers=admin.headers).json

    assert (detail["jobs_failed"], detail["failing_now"], detail["failing_now_capped"]) == (
        4, 2, False)
    # What a retry of the group takes.
    retried = client.post("/jobs/retry-many", headers=admin.headers,
                          json={"fingerprint": fingerprint, "status": "failed"}).json
    assert sorted(retried["ids"]) == [jobs[0], jobs[2]]
    detail = client.get(f"/failures/email/{fingerprint}", headers=admin.headers).json
    assert (detail["jobs_failed"], detail["failing_now"]) == (4, 0)
    # Past its cap of attempts read, a lower bound that says so.
    for job_id in (jobs[0], jobs[2]):
        fail_once(api, producer, worker, TIMEOUT.format(ms=8, host=8), job_id=job_id)
    monkeypatch.setattr("app.history.failures.FAILING_NOW_EXAMINED", 2)
    detail = client.get(f"/failures/email/{fingerprint}", headers=admin.headers).json
    assert (detail["failing_now"], detail["failing_now_capped"]) == (2, True)
    monkeypatch.setattr("app.history.failures.FAILING_NOW_EXAMINED", 1)
    detail = client.get(f"/failures/email/{fingerprint}", headers=admin.headers).json
    assert (detail["failing_now"], detail["failing_now_capped"]) == (1, True)


def test_retry_many_by_fingerprint_retries_that_group_only(api, client, producer, worker,
                                                           admin):
    timeouts = [fail_once(api, producer, worker, TIMEOUT.format(ms=n, host=n))
                for n in range(3)]
    refused = fail_once(api, producer, worker, REFUSED)
    # Failed first with a timeout, then for good with a refusal: its error is the refusal.
    moved_on = fail_once(api, producer, worker, TIMEOUT.format(ms=9, host=9), max_retries=1)
    fail_once(api, producer, worker, REFUSED, job_id=moved_on)
    by_sample = {g["sample"][:7]: g["fingerprint"] for g in groups(client, admin)}

    retried = client.post("/jobs/retry-many", headers=admin.headers,
                          json={"fingerprint": by_sample["timeout"], "status": "failed"})

    assert retried.status_code == 200, retried.json
    assert sorted(retried.json["ids"]) == timeouts
    assert api.get(admin, refused).json["status"] == "failed"
    assert api.get(admin, moved_on).json["status"] == "failed"
    for bad in ("ABCDEF0123456789", "0123", "0123456789abcdeg", 12):
        answer = client.post("/jobs/retry-many", headers=admin.headers,
                             json={"fingerprint": bad})
        assert answer.status_code == 422, bad
        assert "fingerprint" in answer.json["errors"]


def test_groups_not_seen_within_the_failed_window_are_forgotten(app, api, client, clock,
                                                                producer, worker, admin):
    client.patch("/types/email", headers=admin.headers,
                 json={"retention": {"failed_seconds": 3600}})
    fail_once(api, producer, worker, TIMEOUT.format(ms=1, host=1))
    clock.advance(7200)
    services = app.extensions["queuelog"]
    services.jobs.retention.remove_expired(services.types.retention_windows)

    assert groups(client, admin) == []


def test_hostile_failure_queries_and_filters_are_422s_that_change_nothing(
        app, api, client, producer, worker, admin, make_key):
    job_id = fail_once(api, producer, worker, TIMEOUT.format(ms=1, host=1))
    deep: object = "0123456789abcdef"
    for _ in range(100):
        deep = [deep]
    for query in ({"limit": "\u0665\u0660"}, {"limit": "1" + "0" * 400}, {"limit": " 5"},
                  {"since": "9999999-01-01T00:00:00Z"}, {"since": "2026-12-02T10:00:00Z" * 50},
                  {"type": "x" * 101}, {"type": "e\x00mail"}):
        answer = client.get("/failures", headers=admin.headers, query_string=query)
        assert answer.status_code == 422, query
        assert answer.content_type == "application/problem+json"
    for body in ({"fingerprint": deep}, {"fingerprint": "\uff10" * 16},
                 {"fingerprint": "0123456789abcdef\n"}, {"fingerprint": 10**400},
                 {"fingerprint": "0123456789abcdef", "unknown": 1}):
        answer = client.post("/jobs/retry-many", headers=admin.headers, json=body)
        assert answer.status_code == 422, body
    assert api.get(admin, job_id).json["status"] == "failed"
    # A revoked admin key retries nothing.
    [group] = groups(client, admin)
    ops = make_key("ops-2", "admin")
    app.extensions["queuelog"].keys.revoke_key("ops-2")
    refused = client.post("/jobs/retry-many", headers=ops.headers,
                          json={"fingerprint": group["fingerprint"]})
    assert refused.status_code == 401
    assert api.get(admin, job_id).json["status"] == "failed"
