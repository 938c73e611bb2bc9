"""A plain job's fail (one statement on PostgreSQL, app/jobs/sql/fail_repository.py) leaves the
history a fail in a transaction leaves: the same events, attempts, failure group counts and
explanation, after a retry and after a failure for good. A fail that is not plain (a wrong
lease token, a cancel requested, dependents, a concurrency key) answers as it always did."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Api, Key
from tests.test_statement_budget import counting

A_ERROR = "disk full on alpha"
B_ERROR = "disk full on beta"  # another failure group


def _shown(client: Any, key: Key, job_id: int, what: str) -> list[dict[str, Any]]:
    answer = client.get(f"/jobs/{job_id}/{what}", headers=key.headers)
    assert answer.status_code == 200, answer.json
    rows: list[dict[str, Any]] = answer.json[what]
    return rows


def _story(api: Api, client: Any, admin: Key, job_id: int, error: str) -> dict[str, Any]:
    """What the job's history shows, its id (and lease token, which names it) left out and
    its own error and its failure group's fingerprint written alike."""
    group = [g for g in client.get("/failures", headers=admin.headers).json["groups"]
             if g["sample"] == error]

    def alike(value: Any) -> Any:
        if isinstance(value, dict):
            return {name: alike(item) for name, item in value.items()
                    if name not in ("id", "job_id", "lease_token")}
        if isinstance(value, list):
            return [alike(item) for item in value]
        if isinstance(value, str):
            for group_of_error in group:
                value = value.replace(group_of_error["fingerprint"], "<fingerprint>")
            return value.replace(error, "<error>")
        return value

    explained = api.explain(admin, job_id)
    return alike({"events": _shown(client, admin, job_id, "events"),
                  "attempts": _shown(client, admin, job_id, "attempts"),
                  "group": [(g["count"], g["jobs_failed"], g["first_seen"], g["last_seen"])
                            for g in group],
                  "job": api.get(admin, job_id).json,
                  "explained": explained})


def _fail_both(api: Api, app: Any, worker: Key, a: dict[str, Any], b: dict[str, Any],
               **body: Any) -> None:
    """Fail job `a` plainly and job `b` with a checkpoint (which takes the transaction path
    on PostgreSQL and adds nothing to the history), both with `body`."""
    with counting(app) as plain:
        failed_a = api.fail(worker, a["id"], lease_token=a["lease_token"], error=A_ERROR,
                            **body)
    failed_b = api.fail(worker, b["id"], lease_token=b["lease_token"], error=B_ERROR,
                        checkpoint={"row": 1}, **body)
    assert failed_a.status_code == failed_b.status_code == 200, (failed_a.json, failed_b.json)
    if app.extensions["queuelog"].db.engine.dialect.name == "postgresql":
        assert len(plain.statements) == 1, plain.shown()


def _claim_both(api: Api, worker: Key, ids: list[int]) -> tuple[dict[str, Any], ...]:
    claimed = tuple(api.claim(worker).json for _ in ids)
    assert [job["id"] for job in claimed] == ids
    return claimed


@pytest.mark.parametrize("scenario", ["a retry", "a failure for good", "a retry, then for good",
                                      "a retry after a refused report"])
def test_a_plain_fail_leaves_the_history_a_fail_in_a_transaction_leaves(
        api, app, client, clock, producer, worker, admin, make_key, scenario):
    max_retries = {"a retry": 3, "a failure for good": 0}.get(scenario, 1)
    ids = [api.enqueue(producer, max_retries=max_retries).json["id"] for _ in range(2)]
    a, b = _claim_both(api, worker, ids)
    if scenario == "a retry after a refused report":
        # The refusal stores the attempt's claim: the fail ends that row rather than add one.
        other = make_key("worker-2", "worker")
        for job in (a, b):
            assert api.heartbeat(other, job["id"]).status_code == 409
    _fail_both(api, app, worker, a, b, retry_in_seconds=30)
    if scenario == "a retry, then for good":
        clock.advance(60)
        a, b = _claim_both(api, worker, ids)
        _fail_both(api, app, worker, a, b)

    story = _story(api, client, admin, ids[0], A_ERROR)
    assert story == _story(api, client, admin, ids[1], B_ERROR)
    events = [event["event"] for event in story["events"]]
    attempts = [(attempt["number"], attempt["outcome"], attempt["error"])
                for attempt in story["attempts"]]
    [(count, jobs_failed, *_seen)] = story["group"]
    if scenario == "a retry":
        assert events == ["enqueued", "claimed", "retry_scheduled"]
        assert attempts == [(1, "failed", "<error>")]
        assert (count, jobs_failed, story["job"]["status"]) == (1, 0, "pending")
    elif scenario == "a failure for good":
        assert events == ["enqueued", "claimed", "failed"]
        assert attempts == [(1, "failed", "<error>")]
        assert (count, jobs_failed, story["job"]["status"]) == (1, 1, "failed")
    elif scenario == "a retry, then for good":
        assert events == ["enqueued", "claimed", "retry_scheduled", "claimed", "failed"]
        assert attempts == [(1, "failed", "<error>"), (2, "failed", "<error>")]
        assert (count, jobs_failed, story["job"]["status"]) == (2, 1, "failed")
    else:
        assert events == ["enqueued", "claimed", "report_refused", "retry_scheduled"]
        assert attempts == [(1, "failed", "<error>")]
        assert (count, jobs_failed, story["job"]["status"]) == (1, 0, "pending")


def test_a_plain_retrys_event_and_row_say_when_it_runs_again(api, client, clock, producer,
                                                             worker, admin):
    job_id = api.enqueue(producer, max_retries=2).json["id"]
    claimed = api.claim(worker).json
    failed = api.fail(worker, job_id, lease_token=claimed["lease_token"], error="boom").json
    assert (failed["status"], failed["retry_count"]) == ("pending", 1)
    assert api.get(admin, job_id).json["error"] == "boom"
    # The backoff's run_at, as the row stores it and the event tells it.
    [*_told, retried] = _shown(client, admin, job_id, "events")
    assert retried["event"] == "retry_scheduled"
    assert retried["detail"] == {"error": "boom", "run_at": failed["run_at"]}
    [claim] = [e for e in _shown(client, admin, job_id, "events") if e["event"] == "claimed"]
    assert claim["actor"] == "worker-1"
    assert claim["detail"] == {"lease_expires_at": claimed["lease_expires_at"]}
    # It runs again when its backoff is over, not before.
    assert api.claim(worker).status_code == 204
    clock.advance(3600)
    assert api.claim(worker).json["id"] == job_id


def test_a_fail_under_a_wrong_lease_token_is_refused_and_recorded(api, client, producer,
                                                                  worker, admin):
    job_id = api.enqueue(producer).json["id"]
    claimed = api.claim(worker).json
    refused = api.fail(worker, job_id, lease_token="0" * 32 + f".{job_id}")
    assert refused.status_code == 409
    assert refused.json["detail"] == "The lease token names an earlier attempt."
    assert api.get(admin, job_id).json["status"] == "running"
    assert [e["event"] for e in _shown(client, admin, job_id, "events")] == [
        "enqueued", "claimed", "report_refused"]
    # The holder's own fail lands, and its repeat is answered with the job as it left it.
    landed = api.fail(worker, job_id, lease_token=claimed["lease_token"], retry_in_seconds=5)
    again = api.fail(worker, job_id, lease_token=claimed["lease_token"], retry_in_seconds=5)
    assert landed.status_code == again.status_code == 200
    assert again.json == landed.json
    assert len(_shown(client, admin, job_id, "attempts")) == 1


def test_a_fail_of_a_job_whose_cancel_was_requested_ends_it_cancelled(api, client, producer,
                                                                      worker, admin):
    job_id = api.enqueue(producer, max_retries=3).json["id"]
    claimed = api.claim(worker).json
    assert api.cancel(admin, job_id).status_code == 200
    stopped = api.fail(worker, job_id, lease_token=claimed["lease_token"])
    assert (stopped.status_code, stopped.json["status"]) == (200, "cancelled")
    events = _shown(client, admin, job_id, "events")
    assert [e["event"] for e in events] == ["enqueued", "claimed", "cancel_requested",
                                            "cancelled"]
    assert events[-1]["detail"] == {"cancel_requested_by": "admin-1"}
    [attempt] = _shown(client, admin, job_id, "attempts")
    assert attempt["outcome"] == "cancelled"


def test_a_fail_for_good_of_a_job_with_dependents_settles_them(api, producer, worker, admin):
    first = api.enqueue(producer, max_retries=0).json["id"]
    second = api.enqueue(producer, depends_on=[first]).json["id"]
    claimed = api.claim(worker).json
    assert claimed["id"] == first
    failed = api.fail(worker, first, lease_token=claimed["lease_token"])
    assert failed.json["status"] == "failed"
    assert api.get(admin, second).json["status"] == "cancelled"


def test_a_fail_of_a_job_with_a_concurrency_key_retries_it(api, client, producer, worker,
                                                           admin):
    job_id = api.enqueue(producer, max_retries=1, concurrency_key="tenant-1").json["id"]
    claimed = api.claim(worker).json
    failed = api.fail(worker, job_id, lease_token=claimed["lease_token"], retry_in_seconds=0)
    assert (failed.json["status"], failed.json["retry_count"]) == ("pending", 1)
    assert [e["event"] for e in _shown(client, admin, job_id, "events")] == [
        "enqueued", "claimed", "retry_scheduled"]
    assert api.claim(worker).json["id"] == job_id
