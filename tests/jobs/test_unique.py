"""Unique jobs (contract §10): a twin holding the unique key is returned, rejected or replaced;
the key is held only while its job is in its while statuses; scopes are per producer and type."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.clock import MICROS, to_rfc3339
from tests.conftest import Api, Key


def enqueue(api: Api, key: Key, unique: dict[str, Any] | None = None, **body: Any) -> Any:
    body.setdefault("payload", {"customer": 42})
    return api.enqueue(key, unique=unique if unique is not None else {"key": "reindex-42"},
                       **body)


def batch(client: Any, key: Key, jobs: list[dict[str, Any]]) -> Any:
    return client.post("/jobs/batch", json={"jobs": jobs}, headers=key.headers)


def test_a_twin_is_returned_with_deduplicated_true_and_nothing_is_stored(api, producer):
    first = enqueue(api, producer)
    second = enqueue(api, producer, payload={"customer": 42, "from": "another page"})

    assert first.status_code == 201 and "Deduplicated" not in first.headers
    assert first.json["unique_key"] == "reindex-42"
    assert second.status_code == 200
    assert second.headers["Deduplicated"] == "true"
    assert second.headers["Location"] == f"/jobs/{first.json['id']}"
    assert second.json == first.json
    assert [job["id"] for job in api.list(producer).json["jobs"]] == [first.json["id"]]


def test_jobs_without_unique_show_a_null_unique_key_and_never_collide(api, producer):
    jobs = [api.enqueue(producer, payload={"n": 1}) for _ in range(2)]
    assert [job.status_code for job in jobs] == [201, 201]
    assert [job.json["unique_key"] for job in jobs] == [None, None]


def test_the_default_key_is_a_digest_of_type_and_payload(api, producer):
    first = enqueue(api, producer, unique={}, payload={"b": 1, "a": [1, 2]})
    same = enqueue(api, producer, unique={}, payload={"a": [1, 2], "b": 1})
    other_payload = enqueue(api, producer, unique={}, payload={"a": [2, 1], "b": 1})
    other_type = enqueue(api, producer, unique={}, type="pdf", payload={"b": 1, "a": [1, 2]})

    assert len(first.json["unique_key"]) == 64
    assert (same.status_code, same.json["id"]) == (200, first.json["id"])
    assert other_payload.status_code == 201
    assert other_type.status_code == 201


def test_reject_answers_409_naming_the_existing_job(api, producer):
    first = enqueue(api, producer)
    rejected = enqueue(api, producer, unique={"key": "reindex-42", "on_conflict": "reject"})

    assert rejected.status_code == 409
    assert rejected.mimetype == "application/problem+json"
    assert rejected.json["existing_job_id"] == first.json["id"]
    assert rejected.json["type"].endswith("/unique-conflict")
    assert len(api.list(producer).json["jobs"]) == 1


def test_replace_debounces_a_pending_twin_keeping_its_id_and_idempotency_key(
        api, producer, clock):
    unique = {"key": "digest-7", "on_conflict": "replace"}
    first = enqueue(api, producer, unique=unique, payload={"v": 1}, delay_seconds=30,
                    headers={"Idempotency-Key": "first-request"})
    clock.advance(5)
    second = enqueue(api, producer, unique=unique, payload={"v": 2}, delay_seconds=30,
                     priority="low", max_retries=7)

    assert second.status_code == 200
    assert second.headers["Deduplicated"] == "replaced"
    job = second.json
    assert job["id"] == first.json["id"]
    assert (job["payload"], job["priority"], job["max_retries"]) == ({"v": 2}, "low", 7)
    assert job["run_at"] == to_rfc3339(clock.now_us() + 30 * MICROS)
    assert job["idempotency_key"] == "first-request"
    assert job["created_at"] == first.json["created_at"]
    # The first request, replayed, still finds its job (as it is now): a replay, not a twin.
    replay = enqueue(api, producer, unique=unique, payload={"v": 1}, delay_seconds=30,
                     headers={"Idempotency-Key": "first-request"})
    assert replay.status_code == 200 and replay.headers["Idempotent-Replayed"] == "true"
    assert "Deduplicated" not in replay.headers
    assert replay.json["payload"] == {"v": 2}


def test_replace_without_a_schedule_keeps_the_twins_run_at(api, producer, clock):
    unique = {"key": "k", "on_conflict": "replace"}
    first = enqueue(api, producer, unique=unique, delay_seconds=60)
    clock.advance(1)
    second = enqueue(api, producer, unique=unique, payload={"v": 2})
    assert second.json["run_at"] == first.json["run_at"]


def test_replace_of_a_running_twin_is_409_like_reject(api, producer, worker):
    first = enqueue(api, producer)
    assert api.claim(worker).json["id"] == first.json["id"]

    replaced = enqueue(api, producer, unique={"key": "reindex-42", "on_conflict": "replace"},
                       payload={"v": 2})
    assert replaced.status_code == 409
    assert replaced.json["existing_job_id"] == first.json["id"]
    assert api.get(producer, first.json["id"]).json["payload"] == {"customer": 42}


@pytest.mark.parametrize("finish", ["complete", "fail", "cancel"])
def test_a_job_leaving_its_while_statuses_frees_its_key_at_once(api, producer, worker, admin,
                                                                finish):
    first = enqueue(api, producer, max_retries=0)
    if finish == "cancel":
        assert api.cancel(admin, first.json["id"]).status_code == 200
    else:
        api.claim(worker)
        assert getattr(api, finish)(worker, first.json["id"]).status_code == 200

    second = enqueue(api, producer)
    assert second.status_code == 201
    assert second.json["id"] != first.json["id"]


def test_a_while_set_holding_completed_keeps_the_key_after_the_job_is_done(
        api, producer, worker):
    unique = {"key": "once", "while": ["pending", "running", "completed"]}
    first = enqueue(api, producer, unique=unique)
    api.claim(worker)
    api.complete(worker, first.json["id"])

    again = enqueue(api, producer, unique=unique)
    assert (again.status_code, again.json["id"]) == (200, first.json["id"])
    assert again.json["status"] == "completed"


def test_while_pending_only_lets_a_twin_queue_behind_a_running_job(api, producer, worker):
    unique = {"key": "k", "while": ["pending"]}
    running = enqueue(api, producer, unique=unique)
    api.claim(worker)

    queued = enqueue(api, producer, unique=unique)
    again = enqueue(api, producer, unique=unique)
    assert queued.status_code == 201
    assert (again.status_code, again.json["id"]) == (200, queued.json["id"])
    assert running.json["id"] != queued.json["id"]


def test_a_failed_attempt_back_to_pending_lets_go_of_a_key_its_twin_holds(
        api, producer, worker):
    unique = {"key": "k", "while": ["pending"]}
    first = enqueue(api, producer, unique=unique)
    api.claim(worker)
    twin = enqueue(api, producer, unique=unique)

    failed = api.fail(worker, first.json["id"], retry_in_seconds=0)
    assert failed.status_code == 200 and failed.json["status"] == "pending"
    # The twin still holds the key: a third request meets it, not the retried job.
    third = enqueue(api, producer, unique=unique)
    assert (third.status_code, third.json["id"]) == (200, twin.json["id"])


def test_a_failed_attempt_back_to_pending_takes_its_key_again_when_it_is_free(
        api, producer, worker):
    unique = {"key": "k", "while": ["pending"]}
    first = enqueue(api, producer, unique=unique)
    api.claim(worker)
    api.fail(worker, first.json["id"], retry_in_seconds=0)

    again = enqueue(api, producer, unique=unique)
    assert (again.status_code, again.json["id"]) == (200, first.json["id"])


def test_an_admin_retry_into_a_held_key_is_409_naming_the_holder(api, producer, admin):
    first = enqueue(api, producer)
    api.cancel(admin, first.json["id"])
    second = enqueue(api, producer)

    retried = api.retry(admin, first.json["id"])
    assert retried.status_code == 409
    assert retried.json["existing_job_id"] == second.json["id"]
    assert api.get(admin, first.json["id"]).json["status"] == "cancelled"


def test_periods_are_epoch_aligned_buckets_of_run_at(api, producer, clock):
    period = 3600
    bucket_start = (clock.now_us() // (period * MICROS) + 1) * period * MICROS
    unique = {"key": "digest", "period_seconds": period}

    def at(offset_seconds: int) -> Any:
        return enqueue(api, producer, unique=unique,
                       run_at=to_rfc3339(bucket_start + offset_seconds * MICROS))

    first = at(10)
    same_period = at(period - 1)
    next_period = at(period)
    assert first.status_code == 201
    assert (same_period.status_code, same_period.json["id"]) == (200, first.json["id"])
    assert next_period.status_code == 201
    assert next_period.json["unique_key"] == "digest"


def test_the_same_key_under_another_type_or_period_length_is_another_scope(api, producer):
    assert enqueue(api, producer).status_code == 201
    assert enqueue(api, producer, type="pdf").status_code == 201
    assert enqueue(api, producer, unique={"key": "reindex-42", "period_seconds": 60}
                   ).status_code == 201


def test_two_producers_with_one_key_get_two_jobs_and_learn_nothing_of_each_other(
        api, make_key):
    first, second = make_key("shop", "producer"), make_key("billing", "producer")
    reject = {"key": "daily-digest", "on_conflict": "reject"}
    mine = enqueue(api, first, unique=reject)
    theirs = enqueue(api, second, unique=reject)

    assert (mine.status_code, theirs.status_code) == (201, 201)
    assert "Deduplicated" not in theirs.headers
    assert api.get(second, mine.json["id"]).status_code == 404


@pytest.mark.parametrize("unique,field", [
    ({"while": ["running"]}, "unique.while"),
    ({"while": ["pending", "completed"]}, "unique.while"),
    ({"while": []}, "unique.while"),
    ({"while": ["done"]}, "unique.while.0"),
    # A reserved job takes no unique key: naming it is a 422, never a 500 (schemathesis).
    ({"while": ["pending", "reserved"]}, "unique.while.1"),
    ({"on_conflict": "merge"}, "unique.on_conflict"),
    ({"period_seconds": 0}, "unique.period_seconds"),
    ({"period_seconds": True}, "unique.period_seconds"),
    ({"key": ""}, "unique.key"),
    ({"key": "caf\u00e9"}, "unique.key"),
    ({"keys": "x"}, "unique.keys"),
])
def test_unique_options_the_database_cannot_enforce_are_422(api, producer, unique, field):
    response = enqueue(api, producer, unique=unique)
    assert response.status_code == 422
    assert field in response.json["errors"], response.json


def test_a_batch_item_meets_an_earlier_item_of_its_batch(client, api, producer):
    unique = {"key": "k"}
    response = batch(client, producer, [
        {"type": "email", "payload": {"v": 1}, "unique": unique},
        {"type": "email", "payload": {"v": 2}, "unique": unique},
        {"type": "email", "payload": {"v": 3}, "unique": {**unique, "on_conflict": "replace"}},
        {"type": "email", "payload": {"v": 4}},
    ])

    assert response.status_code == 201
    jobs = response.json["jobs"]
    assert [job["deduplicated"] for job in jobs] == [False, True, "replaced", False]
    assert jobs[0]["id"] == jobs[1]["id"] == jobs[2]["id"] != jobs[3]["id"]
    assert [job["payload"] for job in jobs] == [{"v": 3}, {"v": 3}, {"v": 3}, {"v": 4}]
    assert len(api.list(producer).json["jobs"]) == 2


def test_a_batch_item_meets_a_stored_twin(client, api, producer):
    stored = enqueue(api, producer, unique={"key": "k"}, payload={"v": 0})
    response = batch(client, producer, [
        {"type": "email", "payload": {"v": 1}, "unique": {"key": "k"}},
        {"type": "email", "payload": {"v": 2}, "unique": {"key": "k", "on_conflict": "replace"}},
    ])

    assert response.status_code == 201
    jobs = response.json["jobs"]
    assert [job["id"] for job in jobs] == [stored.json["id"]] * 2
    assert [job["deduplicated"] for job in jobs] == [True, "replaced"]
    assert api.get(producer, stored.json["id"]).json["payload"] == {"v": 2}


def test_a_rejected_batch_item_stores_nothing(client, api, producer):
    stored = enqueue(api, producer, unique={"key": "k"})
    response = batch(client, producer, [
        {"type": "email", "payload": {"v": 1}},
        {"type": "email", "unique": {"key": "k", "on_conflict": "reject"}},
    ])

    assert response.status_code == 409
    assert response.json["existing_job_id"] == stored.json["id"]
    assert "jobs.1" in response.json["detail"]
    assert len(api.list(producer).json["jobs"]) == 1


def test_a_batch_replay_comes_before_unique(client, api, producer):
    item = {"type": "email", "idempotency_key": "i-1", "unique": {"key": "k"}}
    first = batch(client, producer, [item]).json["jobs"][0]
    again = batch(client, producer, [item]).json["jobs"][0]
    assert (again["id"], again["replayed"], again["deduplicated"]) == (first["id"], True, False)
