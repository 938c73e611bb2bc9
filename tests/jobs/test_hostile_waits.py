"""Hostile input on the waits' routes (docs/WAITS.md), on both engines: bodies nested 100
deep, numbers in other scripts' digits or past any range, raw bytes, paths of any length, a
key revoked between two requests. Each is a 4xx problem, never a 500, and changes nothing: the
job stays running under its lease, no event is kept, no wait ends."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import text

from tests.jobs.test_waits import post_event, running, suspend

_DEEP: dict[str, Any] = {"a": 1}
for _ in range(100):
    _DEEP = {"x": _DEEP}

SUSPENDS = [
    {"seconds": "\u0666\u0660"},  # "60" in Arabic-Indic digits
    {"seconds": 10**40},
    {"seconds": 1e309},
    {"seconds": 60.5},
    {"until": "\u0662\u0660\u0663\u0660-01-01T00:00:00Z"},
    {"until": "2030-02-30T00:00:00Z"},
    {"wait_for": _DEEP},
    {"wait_for": {"event": "x", "timeout_seconds": 10**40}},
    {"wait_for": {"event": "order\x00paid", "timeout_seconds": 9}},
    {"wait_for": {"event": "x", "key": "\ud800", "timeout_seconds": 9}},
    {"seconds": 60, "checkpoint": _DEEP},
    {"seconds": 60, "bogus": 1},
    {"seconds": 60, "wait_for": None},
]


@pytest.mark.parametrize("body", SUSPENDS, ids=range(len(SUSPENDS)))
def test_a_hostile_suspend_is_a_problem_and_leaves_the_job_running(api, producer, worker,
                                                                   body):
    job_id, lease = running(api, producer, worker)
    # As JSON text: a lone surrogate is \ud800 in it, which a client may send.
    answer = api.client.post(f"/jobs/{job_id}/suspend", headers={
        **worker.headers, "Content-Type": "application/json"},
        data=json.dumps({"lease_token": lease, **body}))
    assert 400 <= answer.status_code < 500, answer.json
    assert answer.headers["Content-Type"].startswith("application/problem+json")
    assert api.get(worker, job_id).json["status"] == "running"


EVENTS = [
    {"name": "order.paid", "data": _DEEP},
    {"name": "order.paid\x00"},
    {"name": "\u0661\u0662\u0663"},  # digits of another script: not printable ASCII
    {"name": "order.paid", "key": "\x7f"},
    {"name": "order.paid", "key": 7},
    {"name": ["order.paid"]},
    {"name": "order.paid", "producer": "p" * 101},
    {"name": "order.paid", "data": 1e309},
]


@pytest.mark.parametrize("body", EVENTS, ids=range(len(EVENTS)))
def test_a_hostile_event_is_a_problem_and_keeps_nothing(app, api, producer, worker, body):
    job_id, lease = running(api, producer, worker)
    assert suspend(api, worker, job_id, lease, wait_for={
        "event": "order.paid", "timeout_seconds": 3600}).status_code == 200
    answer = api.client.post("/events", data=json.dumps(body), headers={
        **producer.headers, "Content-Type": "application/json"})
    assert 400 <= answer.status_code < 500, answer.json
    assert api.get(producer, job_id).json["status"] == "suspended"
    with app.extensions["queuelog"].db.read() as conn:
        assert conn.execute(text("SELECT count(*) FROM posted_events")).scalar() == 0


@pytest.mark.parametrize("token", ["t" * 10_000, "%00", "\u0661" * 64, "..%2F..%2Fetc"])
def test_a_hostile_waitpoint_token_is_a_problem(client, token):
    answer = client.post(f"/waitpoints/{token}", json={"data": {"ok": True}})
    assert answer.status_code in (400, 404, 414, 422), answer.status_code
    assert answer.headers["Content-Type"].startswith("application/problem+json")


def test_a_waitpoints_hostile_data_ends_no_wait(api, client, producer, worker):
    job_id, lease = running(api, producer, worker)
    token = suspend(api, worker, job_id, lease, wait_for={
        "token": True, "timeout_seconds": 3600}).json["waitpoint"]["token"]
    for body in ({"data": _DEEP}, {"data": 1e309}, {"data": {"x": "y"}, "bogus": 1}, [1]):
        answer = client.post(f"/waitpoints/{token}", data=json.dumps(body),
                             headers={"Content-Type": "application/json"})
        assert answer.status_code == 422, answer.json
    assert api.get(producer, job_id).json["status"] == "suspended"
    assert client.post(f"/waitpoints/{token}", json={}).status_code == 200  # still its own


def test_a_key_revoked_between_a_wait_and_its_event_posts_nothing(app, api, producer, worker):
    job_id, lease = running(api, producer, worker)
    assert suspend(api, worker, job_id, lease, wait_for={
        "event": "order.paid", "timeout_seconds": 3600}).status_code == 200
    app.extensions["queuelog"].keys.revoke_key(producer.name)
    answer = post_event(api, producer, name="order.paid")
    assert answer.status_code == 401
    app.extensions["queuelog"].keys.revoke_key(worker.name)
    assert api.client.get(f"/jobs/{job_id}", headers=worker.headers).status_code == 401
    with app.extensions["queuelog"].db.read() as conn:
        assert conn.execute(text("SELECT status FROM jobs WHERE id = :id"),
                            {"id": job_id}).scalar() == "suspended"
