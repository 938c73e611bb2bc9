"""Events: a job's timeline, with actors, including every report refused with 409 (contract
section 13)."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask
from sqlalchemy.exc import OperationalError

from app import create_app, stop_maintenance
from app.core.callers import Role
from app.jobs.timeline.recorder import HistoryRecorder
from tests.conftest import Api, Key


def events(client, key, job_id) -> list[dict[str, Any]]:
    answer = client.get(f"/jobs/{job_id}/events", headers=key.headers)
    assert answer.status_code == 200, answer.json
    return answer.json["events"]


def names_and_actors(client, key, job_id) -> list[tuple[str, str]]:
    return [(e["event"], e["actor"]) for e in events(client, key, job_id)]


def test_a_jobs_life_is_told_once_per_change_with_its_actors(api, client, producer, worker,
                                                               admin, clock):
    job_id = api.enqueue(producer, max_retries=1).json["id"]
    api.claim(worker)
    api.heartbeat(worker, job_id)  # not an event
    api.fail(worker, job_id, error="token=abc123 rejected", retry_in_seconds=0)
    api.claim(worker)
    api.fail(worker, job_id, error="again")
    api.retry(admin, job_id)
    api.cancel(admin, job_id)

    shown = events(client, admin, job_id)
    assert [(e["event"], e["actor"]) for e in shown] == [
        ("enqueued", "producer-1"),
        ("claimed", "worker-1"),
        ("retry_scheduled", "worker-1"),
        ("claimed", "worker-1"),
        ("failed", "worker-1"),
        ("retried", "admin-1"),
        ("cancelled", "admin-1"),
    ]
    assert shown[2]["detail"]["error"] == "token=*** rejected"
    assert shown[4]["detail"] == {"error": "again"}


def test_completed_is_the_last_event_of_a_completed_job(api, client, producer, worker, admin):
    job_id = api.enqueue(producer).json["id"]
    token = api.claim(worker).json["lease_token"]
    api.complete(worker, job_id, lease_token=token)
    api.complete(worker, job_id, lease_token=token)  # a repeat that landed: no new event
    assert names_and_actors(client, admin, job_id)[-1] == ("completed", "worker-1")
    assert len(events(client, admin, job_id)) == 3


def test_a_lease_rescue_is_told_by_queuelog(api, client, producer, make_key, admin, clock):
    dead = make_key("dead-worker", "worker")
    alive = make_key("alive-worker", "worker")
    job_id = api.enqueue(producer, max_retries=1).json["id"]
    api.claim(dead, lease_seconds=5)
    clock.advance(6)
    api.claim(alive)
    shown = events(client, admin, job_id)
    assert [(e["event"], e["actor"]) for e in shown] == [
        ("enqueued", "producer-1"), ("claimed", "dead-worker"),
        ("lease_expired", "queuelog"), ("claimed", "alive-worker")]
    assert shown[2]["detail"]["worker"] == "dead-worker"
    assert shown[2]["detail"]["status"] == "pending"


def test_a_stale_holders_complete_is_refused_and_told_naming_it(api, client, producer,
                                                                 make_key, admin, clock):
    stale = make_key("stale-worker", "worker")
    fresh = make_key("fresh-worker", "worker")
    job_id = api.enqueue(producer).json["id"]
    api.claim(stale, lease_seconds=5)
    clock.advance(6)
    api.claim(fresh)
    before = api.get(admin, job_id).json

    assert api.complete(stale, job_id).status_code == 409

    assert api.get(admin, job_id).json == before
    last = events(client, admin, job_id)[-1]
    assert last["event"] == "report_refused"
    assert last["actor"] == "stale-worker"
    assert last["detail"] == {"report": "complete",
                              "reason": "The job is held by another worker."}


def test_every_409_on_heartbeat_complete_and_fail_is_told(app, api, client, producer, worker,
                                                           admin, clock):
    job_id = api.enqueue(producer).json["id"]
    token = api.claim(worker, lease_seconds=5).json["lease_token"]
    assert api.heartbeat(worker, job_id, lease_token="x.1").status_code == 409
    stop_maintenance(app)  # the lease runs out, and no maintenance has rescued the job yet
    clock.advance(6)
    assert api.fail(worker, job_id, lease_token=token).status_code == 409
    refused = [e for e in events(client, admin, job_id) if e["event"] == "report_refused"]
    assert [(e["detail"]["report"], e["detail"]["reason"]) for e in refused] == [
        ("heartbeat", "The lease token names an earlier attempt."),
        ("fail", "The lease on this job has expired."),
    ]


def test_complete_many_tells_each_refused_item(api, client, producer, worker, make_key, admin):
    other = make_key("worker-2", "worker")
    job_id = api.enqueue(producer).json["id"]
    api.claim(other)
    answer = client.post("/jobs/complete-many", json={"items": [{"id": job_id}]},
                         headers=worker.headers)
    assert answer.json["results"][0]["status"] == 409
    assert events(client, admin, job_id)[-1]["actor"] == "worker-1"


def test_a_refusal_that_cannot_be_recorded_still_answers_409(api, client, producer, worker,
                                                             make_key, admin, monkeypatch):
    def fail_to_record(*_args, **_kwargs):
        raise OperationalError("INSERT", {}, Exception("disk I/O error"))

    monkeypatch.setattr(HistoryRecorder, "report_refused", fail_to_record)
    other = make_key("worker-2", "worker")
    job_id = api.enqueue(producer).json["id"]
    api.claim(other)
    assert api.complete(worker, job_id).status_code == 409
    assert [e["event"] for e in events(client, admin, job_id)] == ["enqueued", "claimed"]


def test_a_report_on_a_missing_job_is_404_and_no_event(api, client, worker, admin):
    assert api.complete(worker, 4242).status_code == 404
    assert client.get("/jobs/4242/events", headers=admin.headers).status_code == 404


def test_a_batch_tells_each_job_enqueued(client, producer, admin):
    jobs = client.post("/jobs/batch", json={"jobs": [{"type": "email"}, {"type": "pdf"}]},
                       headers=producer.headers).json["jobs"]
    for job in jobs:
        assert names_and_actors(client, admin, job["id"]) == [("enqueued", "producer-1")]


def test_an_idempotent_replay_is_no_new_event(api, client, producer, admin):
    job_id = api.enqueue(producer, idempotency_key="k1").json["id"]
    api.enqueue(producer, idempotency_key="k1")
    assert names_and_actors(client, admin, job_id) == [("enqueued", "producer-1")]


def test_refusals_kept_per_job_are_bounded(api, client, producer, worker, make_key, admin,
                                           monkeypatch):
    monkeypatch.setattr("app.jobs.timeline.recorder.MAX_REFUSALS_KEPT", 3)
    other = make_key("worker-2", "worker")
    job_id = api.enqueue(producer).json["id"]
    api.claim(other)
    for _ in range(5):
        assert api.complete(worker, job_id).status_code == 409
    refused = [e for e in events(client, admin, job_id) if e["event"] == "report_refused"]
    assert len(refused) == 3


def test_a_long_timeline_shows_its_newest_events(api, client, producer, admin, monkeypatch):
    monkeypatch.setattr("app.history.service.MAX_EVENTS_SHOWN", 3)
    job_id = api.enqueue(producer).json["id"]
    api.cancel(admin, job_id)
    api.retry(admin, job_id)
    api.cancel(admin, job_id)
    assert [e["event"] for e in events(client, admin, job_id)] == [
        "cancelled", "retried", "cancelled"]


@pytest.mark.parametrize("role", ["producer", "worker"])
def test_only_admins_read_events(api, client, producer, worker, role):
    job_id = api.enqueue(producer).json["id"]
    key = producer if role == "producer" else worker
    assert client.get(f"/jobs/{job_id}/events", headers=key.headers).status_code == 403


def test_events_can_be_switched_off_and_attempts_stay(app_config):
    app: Flask = create_app({**app_config, "JOB_EVENTS": False})
    try:
        keys = app.extensions["queuelog"].keys
        producer, worker, admin = (Key(f"{role}-x", keys.create_key(f"{role}-x", Role(role)))
                                   for role in ("producer", "worker", "admin"))
        client = app.test_client()
        api = Api(client)
        job_id = api.enqueue(producer).json["id"]
        api.claim(worker)
        api.complete(worker, job_id)
        assert events(client, admin, job_id) == []
        attempts = client.get(f"/jobs/{job_id}/attempts", headers=admin.headers).json
        assert [a["outcome"] for a in attempts["attempts"]] == ["completed"]
    finally:
        app.extensions["queuelog"].db.engine.dispose()


def test_unique_enqueues_that_meet_a_job_are_told_on_its_timeline(api, client, producer,
                                                                   admin):
    unique = {"key": "profile-7"}
    job_id = api.enqueue(producer, payload={"edit": 1}, unique=unique).json["id"]
    returned = api.enqueue(producer, payload={"edit": 1}, unique=unique)
    replaced = api.enqueue(producer, payload={"edit": 2},
                           unique={**unique, "on_conflict": "replace"})
    batch = client.post("/jobs/batch", headers=producer.headers, json={"jobs": [
        {"type": "email", "payload": {"edit": 3}, "unique": unique},
        {"type": "email", "payload": {"edit": 4},
         "unique": {**unique, "on_conflict": "replace"}}]})

    assert returned.headers["Deduplicated"] == "true"
    assert replaced.headers["Deduplicated"] == "replaced"
    assert batch.status_code == 201, batch.json
    assert {job["id"] for job in batch.json["jobs"]} == {job_id}
    assert names_and_actors(client, admin, job_id) == [
        ("enqueued", "producer-1"),
        ("deduplicated", "producer-1"),
        ("replaced", "producer-1"),
        ("deduplicated", "producer-1"),
        ("replaced", "producer-1"),
    ]
