"""On PostgreSQL a limited claim chooses its jobs on a gate read without locks and is checked
under the claimed types' row locks just before it commits (app/types/flow.py). These tests
hold another claim's transaction open at the moment between the two, so the check is what
keeps the limit."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import Connection, text

from tests.conftest import ENGINES, Api, Key

LEASE_US = 600_000_000


@pytest.fixture(params=[e for e in ENGINES if getattr(e, "values", [e])[0] == "postgresql"])
def engine_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def start_running_unseen(conn: Connection, job_id: int, now_us: int, job_type: str) -> None:
    """What another claim does before its commit: its job running (uncommitted, so no other
    transaction counts it) and its type's row locked."""
    conn.execute(text("UPDATE jobs SET status = 'running', worker_id = 'other', "
                      "claimed_at = :now, lease_expires_at = :until, lease_token = 'other.1' "
                      "WHERE id = :id"), {"now": now_us, "until": now_us + LEASE_US, "id": job_id})
    assert conn.execute(text("SELECT type FROM job_types WHERE type = :t FOR UPDATE"),
                        {"t": job_type}).all()


def claim_in_thread(app: Flask, worker: Key) -> tuple[threading.Thread, list[Any]]:
    found = app.extensions["queuelog"]
    caller = found.keys.caller_for_token(worker.token)
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.extend(found.jobs.claim(caller)))
    thread.start()
    return thread, result


def wait_until_a_claim_waits_for_a_lock(app: Flask) -> None:
    # Asked in a transaction of its own each time: a transaction sees one snapshot of
    # pg_stat_activity.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with app.extensions["queuelog"].db.read() as conn:
            waiting = conn.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'")).scalar_one()
        if waiting:
            return
        time.sleep(0.02)
    raise AssertionError("the claim never waited for the type's row")


def claim_while_a_rival_starts(app: Flask, worker: Any, job_id: int, job_type: str,
                               now_us: int) -> list[Any]:
    """A claim made while a rival transaction starts `job_id` running without the claim's
    gate seeing it; the rival commits once the claim waits at its check under the lock.
    Returns what the claim took."""
    with app.extensions["queuelog"].db.engine.connect() as conn:
        transaction = conn.begin()
        start_running_unseen(conn, job_id, now_us, job_type)
        thread, claimed = claim_in_thread(app, worker)
        wait_until_a_claim_waits_for_a_lock(app)
        transaction.commit()
    thread.join(30)
    return claimed


def running_of(app: Flask, job_type: str) -> int:
    with app.extensions["queuelog"].db.read() as conn:
        return int(conn.execute(text("SELECT count(*) FROM jobs WHERE status = 'running' "
                                     "AND type = :t"), {"t": job_type}).scalar_one())


def test_a_claim_that_the_check_finds_over_max_running_takes_the_next_allowed_job(
        app, client, api: Api, producer, worker, admin, clock):
    assert client.patch("/types/email", json={"max_running": 1},
                        headers=admin.headers).status_code == 200
    first = api.enqueue(producer, type="email").json["id"]
    api.enqueue(producer, type="email")
    other_type = api.enqueue(producer, type="pdf").json["id"]
    # The claim's gate cannot see that job running: it takes the second email job, then
    # waits at its check for the row the rival holds.
    claimed = claim_while_a_rival_starts(app, worker, first, "email", clock.now_us())

    assert [c.job.id for c in claimed] == [other_type]
    assert running_of(app, "email") == 1


def test_a_claim_that_the_check_finds_over_its_key_cap_takes_another_key(
        app, client, api: Api, producer, worker, admin, clock):
    assert client.patch("/types/sync", json={"max_running_per_key": 1},
                        headers=admin.headers).status_code == 200
    first = api.enqueue(producer, type="sync", concurrency_key="a").json["id"]
    api.enqueue(producer, type="sync", concurrency_key="a")
    other_key = api.enqueue(producer, type="sync", concurrency_key="b").json["id"]
    claimed = claim_while_a_rival_starts(app, worker, first, "sync", clock.now_us())

    assert [c.job.id for c in claimed] == [other_key]
    assert running_of(app, "sync") == 2


def test_a_cap_far_from_reached_a_moment_ago_still_holds_when_others_reach_it(
        app, client, api: Api, producer, worker, admin, clock):
    # After a claim that found the cap at most half used, the next claims of the process
    # may choose without counting first: the check under the lock is what holds the cap.
    assert client.patch("/types/email", json={"max_running": 2},
                        headers=admin.headers).status_code == 200
    ids = [api.enqueue(producer, type="email").json["id"] for _ in range(3)]
    other_type = api.enqueue(producer, type="pdf").json["id"]
    assert api.claim(worker).json["id"] == ids[0]
    claimed = claim_while_a_rival_starts(app, worker, ids[1], "email", clock.now_us())

    assert [c.job.id for c in claimed] == [other_type]
    assert running_of(app, "email") == 2
