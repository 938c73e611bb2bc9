"""Maintenance runs off the request path, led by one process per database
(docs/OPERATIONS.md, "Maintenance"): a claim sends no sweep, one app of several on a
database leads, and when it stops another takes the lead and rescues what ran out."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import event

from app import create_app, start_maintenance, stop_maintenance
from app.core.clock import Clock

# Statements that look for overdue jobs: a sweep's probes (expired leases, expired jobs).
SWEEP_MARKS = ("lease_expires_at <=", "expires_at <=")
EVENTUALLY_SECONDS = 30.0


def statements_of(app: Flask) -> tuple[list[str], Any]:
    """The statements the app's engine sends from now on, and the listener to remove."""
    sent: list[str] = []

    def listen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent.append(statement)

    engine = app.extensions["queuelog"].db.engine
    event.listen(engine, "before_cursor_execute", listen)
    return sent, listen


def test_a_claim_sends_no_sweep_statement(app: Flask, api: Any, producer: Any,
                                          worker: Any) -> None:
    api.enqueue(producer)
    sent, listener = statements_of(app)
    try:
        claimed = api.claim(worker)
    finally:
        event.remove(app.extensions["queuelog"].db.engine, "before_cursor_execute", listener)
    assert claimed.status_code == 200
    assert sent  # the claim's own statements were seen
    assert [s for s in sent if any(mark in s for mark in SWEEP_MARKS)] == []


def test_a_lease_that_runs_out_is_rescued_before_any_claim(api: Any, producer: Any,
                                                           worker: Any, admin: Any,
                                                           clock: Any) -> None:
    job_id = api.enqueue(producer).json["id"]
    assert api.claim(worker, lease_seconds=5).status_code == 200
    clock.advance(5)  # time passing runs what fell due: the leader's round
    job = api.get(admin, job_id).json
    assert (job["status"], job["error"], job["retry_count"]) == ("pending", "lease expired", 1)


@pytest.fixture
def second_app(app_config: dict[str, Any]) -> Iterator[Flask]:
    """Another app on the test's database and clock: another process, as far as the lead
    goes (each opens its own lock file, or connection)."""
    other = create_app(app_config)
    yield other
    stop_maintenance(other)
    other.extensions["queuelog"].db.engine.dispose()


def leads(app: Flask) -> bool:
    ready = app.test_client().get("/readyz")
    assert ready.status_code == 200
    leader: bool = ready.json["maintenance"]["leader"]
    return leader


def test_one_app_of_two_leads_and_the_other_takes_over_when_it_stops(
        app: Flask, second_app: Flask, api: Any, producer: Any, worker: Any, admin: Any,
        clock: Any) -> None:
    clock.advance(1)
    assert (leads(app), leads(second_app)) == (True, False)
    job_id = api.enqueue(producer).json["id"]
    assert api.claim(worker, lease_seconds=5).status_code == 200

    stop_maintenance(app)  # the leader's process stops, and gives the lead up
    clock.advance(6)

    assert (leads(app), leads(second_app)) == (False, True)
    job = api.get(admin, job_id).json
    assert (job["status"], job["error"]) == ("pending", "lease expired")
    again = second_app.test_client().post("/jobs/claim", json={}, headers=worker.headers)
    assert (again.status_code, again.json["id"]) == (200, job_id)


def test_a_follower_never_runs_the_chores(app: Flask, second_app: Flask, api: Any,
                                          producer: Any, worker: Any, admin: Any,
                                          clock: Any) -> None:
    clock.advance(1)  # the first app takes the lead
    job_id = api.enqueue(producer).json["id"]
    api.claim(worker, lease_seconds=5)
    sent, listener = statements_of(second_app)
    try:
        clock.advance(6)
    finally:
        event.remove(second_app.extensions["queuelog"].db.engine, "before_cursor_execute",
                     listener)
    assert api.get(admin, job_id).json["status"] == "pending"  # the leader rescued it
    assert [s for s in sent if any(mark in s for mark in SWEEP_MARKS)] == []


def _pids(app: Flask, query: str) -> set[int]:
    with app.extensions["queuelog"].db.engine.connect() as conn:
        return set(conn.exec_driver_sql(query).scalars())


def sessions_of(app: Flask) -> set[int]:
    """The sessions the database shows for its own name (this one's left out), by pid."""
    return _pids(app, "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                      " AND pid <> pg_backend_pid()")


def lead_holder(app: Flask) -> set[int]:
    """The session holding the database's maintenance lock."""
    return _pids(app, "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND"
                      " database = (SELECT oid FROM pg_database"
                      " WHERE datname = current_database())")


def _empty_pools(*apps: Flask) -> None:
    for each in apps:
        each.extensions["queuelog"].db.engine.dispose()


@pytest.mark.parametrize("engine_name", ["postgresql"], indirect=True)
def test_only_the_leader_keeps_a_connection_for_the_lead(
        app: Flask, second_app: Flask, clock: Any) -> None:
    # Every process of every host tries for the lead: were each try's connection kept, a
    # host's connections would grow by one per worker process for nothing. Sessions of
    # this database that other tests left are there before and after, and not counted.
    _empty_pools(app, second_app)
    before = sessions_of(app)
    _empty_pools(app, second_app)
    clock.advance(1)
    clock.advance(1)
    assert (leads(app), leads(second_app)) == (True, False)
    _empty_pools(app, second_app)  # only what the lead holds is left
    held = lead_holder(app)
    assert len(held) == 1 and sessions_of(app) - before == held
    stop_maintenance(app)
    clock.advance(1)
    assert (leads(app), leads(second_app)) == (False, True)
    _empty_pools(app, second_app)
    held = lead_holder(second_app)
    assert len(held) == 1 and sessions_of(second_app) - before == held


def wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + EVENTUALLY_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"not within {EVENTUALLY_SECONDS} s: {what}"
        time.sleep(0.05)


def test_the_loops_threads_on_a_real_clock_elect_one_leader_and_hand_the_lead_over(
        app_config: dict[str, Any], producer: Any, worker: Any, admin: Any) -> None:
    config = {**app_config, "CLOCK": Clock()}
    first, second = create_app(config), create_app(config)
    try:
        start_maintenance(first)
        start_maintenance(second)
        loops = [first.extensions["queuelog"].maintenance,
                 second.extensions["queuelog"].maintenance]
        wait_for(lambda: sum(loop.leading for loop in loops) == 1, "one leader")
        leader, follower = (first, second) if loops[0].leading else (second, first)
        client = follower.test_client()
        job_id = client.post("/jobs", json={"type": "email"},
                             headers=producer.headers).json["id"]
        claimed = client.post("/jobs/claim", json={"lease_seconds": 1},
                              headers=worker.headers)
        assert (claimed.status_code, claimed.json["id"]) == (200, job_id)

        stop_maintenance(leader)
        wait_for(lambda: client.get(f"/jobs/{job_id}", headers=admin.headers)
                 .json["status"] == "pending", "the rescue")
        assert client.get(f"/jobs/{job_id}", headers=admin.headers).json["error"] == (
            "lease expired")
        again = client.post("/jobs/claim", json={}, headers=worker.headers)
        assert (again.status_code, again.json["id"]) == (200, job_id)
        assert leads(follower)
    finally:
        for application in (first, second):
            stop_maintenance(application)
            application.extensions["queuelog"].db.engine.dispose()


def test_advancing_the_clock_from_two_threads_runs_each_round_whole(
        api: Any, producer: Any, worker: Any, admin: Any, clock: Any) -> None:
    ids = [api.enqueue(producer).json["id"] for _ in range(5)]
    for _ in ids:
        assert api.claim(worker, lease_seconds=5).status_code == 200
    threads = [threading.Thread(target=clock.advance, args=(3,)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {api.get(admin, job_id).json["status"] for job_id in ids} == {"pending"}
