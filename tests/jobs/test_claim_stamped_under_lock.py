"""A claim that waits for its types' row locks (PostgreSQL) is stamped from the moment it holds
them: claimed_at no earlier than the rival's release, a full lease, a timeline in order (issue
27, point 10). The ManualClock stands for the time the wait took."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import Connection, text

from app.core.clock import parse_rfc3339
from tests.conftest import ENGINES, Api, Key

WAITED_SECONDS = 30


@pytest.fixture(params=[e for e in ENGINES if getattr(e, "values", [e])[0] == "postgresql"])
def engine_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    return {**app_config, "LEASE_SECONDS": 120}


def claim_in_thread(app: Flask, worker: Key) -> tuple[threading.Thread, list[Any]]:
    found = app.extensions["queuelog"]
    caller = found.keys.caller_for_token(worker.token)
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.extend(found.jobs.claim(caller)))
    thread.start()
    return thread, result


def backend_of(conn: Connection) -> int:
    return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def waiting_for_a_lock(app: Flask) -> set[int]:
    # Asked in a transaction of its own: a transaction sees one snapshot of pg_stat_activity.
    with app.extensions["queuelog"].db.read() as conn:
        return set(conn.execute(text(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'")).scalars())


def wait_until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(what)


def lock_type_row(conn: Connection, job_type: str) -> None:
    assert conn.execute(text("SELECT type FROM job_types WHERE type = :t FOR UPDATE"),
                        {"t": job_type}).all()


def claim_rival(conn: Connection, job_id: int, now_us: int, lease_us: int) -> None:
    """What a rival claim writes (run again, its stamps move): its job running from `now_us`."""
    conn.execute(text("UPDATE jobs SET status = 'running', worker_id = 'rival', "
                      "claimed_at = :now, lease_expires_at = :until, lease_token = 'rival.1', "
                      "updated_at = :now WHERE id = :id"),
                 {"now": now_us, "until": now_us + lease_us, "id": job_id})


def timeline(client: Any, admin: Key, job_id: int) -> list[tuple[int, str]]:
    """The job's events as GET /jobs/{id}/events tells them: (at, event), in order."""
    return [(parse_rfc3339(event["at"]), event["event"]) for event in
            client.get(f"/jobs/{job_id}/events", headers=admin.headers).json["events"]]


def attempt_claimed_at(client: Any, admin: Key, job_id: int) -> int:
    [attempt] = client.get(f"/jobs/{job_id}/attempts", headers=admin.headers).json["attempts"]
    return parse_rfc3339(attempt["claimed_at"])


def assert_stamped_from(app: Flask, client: Any, admin: Key, job: Any, released_at: int,
                        rival_id: int) -> None:
    lease_us = app.config["LEASE_SECONDS"] * 1_000_000
    assert job.claimed_at >= released_at
    assert job.lease_expires_at - job.claimed_at == lease_us
    assert job.updated_at == job.claimed_at
    assert attempt_claimed_at(client, admin, job.id) == job.claimed_at
    # The claim's event tells its stamp, after everything the rival's release recorded.
    mine = timeline(client, admin, job.id)
    assert [at for at, event in mine if event == "claimed"] == [job.claimed_at], mine
    rival = timeline(client, admin, rival_id)
    assert max(at for at, _event in rival) <= job.claimed_at, (rival, mine)


def test_a_claim_checked_under_a_lock_it_waited_for_is_stamped_once_it_holds_it(
        app, client, api: Api, producer, worker, admin, clock):
    assert client.patch("/types/email", json={"max_running": 2},
                        headers=admin.headers).status_code == 200
    rivals = api.enqueue(producer, type="email").json["id"]
    mine = api.enqueue(producer, type="email").json["id"]
    lease_us = app.config["LEASE_SECONDS"] * 1_000_000
    with app.extensions["queuelog"].db.engine.connect() as rival:
        transaction = rival.begin()
        # The rival's job running (unseen by the claim's gate) and the type's row locked:
        # the claim takes the other job, then waits at its check for the row.
        claim_rival(rival, rivals, clock.now_us(), lease_us)
        lock_type_row(rival, "email")
        thread, claimed = claim_in_thread(app, worker)
        wait_until(lambda: waiting_for_a_lock(app), "the claim never waited for the type's row")
        clock.advance(WAITED_SECONDS)
        released_at = clock.now_us()
        claim_rival(rival, rivals, released_at, lease_us)
        transaction.commit()
    thread.join(30)

    assert [c.job.id for c in claimed] == [mine]
    assert_stamped_from(app, client, admin, claimed[0].job, released_at, rivals)


def test_a_claim_made_again_under_the_locks_is_stamped_once_it_holds_them(
        app, client, api: Api, producer, worker, admin, clock):
    # The first attempt's check finds the cap reached (the rival's job runs); the claim is
    # made again on a gate read under the locks, which waits for a second rival.
    assert client.patch("/types/email", json={"max_running": 1},
                        headers=admin.headers).status_code == 200
    rivals = api.enqueue(producer, type="email").json["id"]
    api.enqueue(producer, type="email")
    other_type = api.enqueue(producer, type="pdf").json["id"]
    lease_us = app.config["LEASE_SECONDS"] * 1_000_000
    engine = app.extensions["queuelog"].db.engine
    with engine.connect() as first, engine.connect() as second:
        first_rival, second_rival = first.begin(), second.begin()
        second_backend = backend_of(second)
        rival_backends = {backend_of(first), second_backend}
        claim_rival(first, rivals, clock.now_us(), lease_us)
        lock_type_row(first, "email")
        thread, claimed = claim_in_thread(app, worker)
        wait_until(lambda: waiting_for_a_lock(app) - rival_backends,
                   "the claim never waited at its check")
        # Queued behind the claim for the same row: it takes it when the claim's first attempt
        # (its check finds the cap reached) rolls back, and the claim made again waits for it.
        queued = threading.Thread(target=lambda: lock_type_row(second, "email"))
        queued.start()
        wait_until(lambda: second_backend in waiting_for_a_lock(app),
                   "the second rival never queued for the row")
        first_rival.commit()
        queued.join(30)
        wait_until(lambda: waiting_for_a_lock(app) - rival_backends,
                   "the claim made again never waited for the type's row")
        clock.advance(WAITED_SECONDS)
        released_at = clock.now_us()
        second_rival.commit()
    thread.join(30)

    assert [c.job.id for c in claimed] == [other_type]
    assert_stamped_from(app, client, admin, claimed[0].job, released_at, rivals)
