"""A job's row tells an uneventful life (enqueued, claimed, completed: when and by whom);
job_attempts and job_events hold what the row cannot (docs/API.md, a job's history). The
answers of GET /jobs/{id}/events and /attempts are the same either way, and for the rows an
earlier release wrote with their full history."""

from __future__ import annotations

import json
from typing import Any

from alembic import command
from flask import Flask
from sqlalchemy import column, table, text

from app import create_app
from app.core.callers import Role
from app.core.clock import MICROS, ManualClock, to_rfc3339
from app.storage.engine import make_engine
from app.storage.migrations import alembic_config, upgrade
from tests.conftest import Key


def stored(app: Flask, query: str, **params: Any) -> list[tuple[Any, ...]]:
    with app.extensions["queuelog"].db.read() as conn:
        return [tuple(row) for row in conn.execute(text(query), params)]


def history(client: Any, admin: Any, job_id: int) -> tuple[list[Any], list[Any]]:
    events = client.get(f"/jobs/{job_id}/events", headers=admin.headers)
    attempts = client.get(f"/jobs/{job_id}/attempts", headers=admin.headers)
    assert events.status_code == attempts.status_code == 200
    return ([(e["event"], e["actor"], e["at"], e["detail"]) for e in events.json["events"]],
            [(a["number"], a["worker_id"], a["claimed_at"], a["ended_at"], a["outcome"],
              a["error"]) for a in attempts.json["attempts"]])


def test_a_plain_job_writes_no_history_and_its_row_tells_it(app, api, client, producer,
                                                            worker, admin, clock):
    enqueued_at = clock.now_us()
    job_id = api.enqueue(producer).json["id"]
    clock.advance(1)
    claimed = api.claim(worker, lease_seconds=30).json
    clock.advance(10)
    # A heartbeat moves the lease on; the claim's event still tells the lease it granted.
    assert api.heartbeat(worker, job_id).status_code == 200
    clock.advance(2)
    assert api.complete(worker, job_id, lease_token=claimed["lease_token"]).status_code == 200

    assert stored(app, "SELECT count(*) FROM job_events") == [(0,)]
    assert stored(app, "SELECT count(*) FROM job_attempts") == [(0,)]
    events, attempts = history(client, admin, job_id)
    at = to_rfc3339
    assert events == [
        ("enqueued", "producer-1", at(enqueued_at), None),
        ("claimed", "worker-1", at(enqueued_at + MICROS),
         {"lease_expires_at": at(enqueued_at + 31 * MICROS)}),
        ("completed", "worker-1", at(enqueued_at + 13 * MICROS), None),
    ]
    assert attempts == [(1, "worker-1", at(enqueued_at + MICROS),
                         at(enqueued_at + 13 * MICROS), "completed", None)]


def test_a_failed_then_retried_then_completed_job_is_told_whole_and_in_order(
        app, api, client, producer, make_key, admin, clock):
    first, second = make_key("worker-a", "worker"), make_key("worker-b", "worker")
    start = clock.now_us()
    job_id = api.enqueue(producer, max_retries=2).json["id"]
    api.claim(first, lease_seconds=60)
    clock.advance(1)
    api.fail(first, job_id, error="boom", retry_in_seconds=0)
    clock.advance(1)
    api.claim(second, lease_seconds=60)
    clock.advance(1)
    api.complete(second, job_id)

    at = to_rfc3339
    events, attempts = history(client, admin, job_id)
    assert events == [
        ("enqueued", "producer-1", at(start), None),
        ("claimed", "worker-a", at(start), {"lease_expires_at": at(start + 60 * MICROS)}),
        ("retry_scheduled", "worker-a", at(start + MICROS),
         {"error": "boom", "run_at": at(start + MICROS)}),
        ("claimed", "worker-b", at(start + 2 * MICROS),
         {"lease_expires_at": at(start + 62 * MICROS)}),
        ("completed", "worker-b", at(start + 3 * MICROS), None),
    ]
    assert attempts == [
        (1, "worker-a", at(start), at(start + MICROS), "failed", "boom"),
        (2, "worker-b", at(start + 2 * MICROS), at(start + 3 * MICROS), "completed", None),
    ]
    # Written: the failed attempt, with the claim the retry cleared from the row.
    assert stored(app, "SELECT number, worker_id, outcome FROM job_attempts") == [
        (1, "worker-a", "failed")]
    assert stored(app, "SELECT event FROM job_events ORDER BY id") == [
        ("claimed",), ("retry_scheduled",)]


def test_a_rescued_leases_attempt_survives_the_next_claim(app, api, client, producer,
                                                          make_key, admin, clock):
    dead, alive = make_key("dead-worker", "worker"), make_key("alive-worker", "worker")
    start = clock.now_us()
    job_id = api.enqueue(producer, max_retries=1).json["id"]
    api.claim(dead, lease_seconds=5)
    clock.advance(6)
    assert api.claim(alive).json["id"] == job_id  # rescues the lease, then takes the job

    at = to_rfc3339
    events, attempts = history(client, admin, job_id)
    assert [(name, actor) for name, actor, _at, _detail in events] == [
        ("enqueued", "producer-1"), ("claimed", "dead-worker"),
        ("lease_expired", "queuelog"), ("claimed", "alive-worker")]
    assert events[1][2] == at(start)
    assert attempts == [
        (1, "dead-worker", at(start), at(start + 6 * MICROS), "lease_expired",
         "lease expired"),
        (2, "alive-worker", at(start + 6 * MICROS), None, "running", None),
    ]
    assert stored(app, "SELECT number, worker_id, claimed_at, outcome FROM job_attempts") == [
        (1, "dead-worker", start, "lease_expired")]


def test_what_follows_a_claim_is_written_after_it(app, api, client, producer, make_key,
                                                  admin, clock):
    """A refusal and a cancel request during an attempt are stored, and the claim before
    them: the timeline keeps the order things happened in, whatever the clock says."""
    holder, stale = make_key("holder", "worker"), make_key("stale", "worker")
    job_id = api.enqueue(producer).json["id"]
    api.claim(holder)
    assert api.complete(stale, job_id).status_code == 409
    assert api.cancel(admin, job_id).status_code == 200  # running: a request
    assert api.complete(holder, job_id).status_code == 200  # ends it cancelled

    events, attempts = history(client, admin, job_id)
    assert [(name, actor) for name, actor, _at, _detail in events] == [
        ("enqueued", "producer-1"), ("claimed", "holder"), ("report_refused", "stale"),
        ("cancel_requested", "admin-1"), ("cancelled", "holder")]
    assert [(number, worker, outcome) for number, worker, _c, _e, outcome, _err in attempts
            ] == [(1, "holder", "cancelled")]


def test_a_refusal_after_the_completion_follows_it(app, api, client, producer, make_key,
                                                   admin):
    holder, stale = make_key("holder", "worker"), make_key("stale", "worker")
    job_id = api.enqueue(producer).json["id"]
    api.claim(holder)
    api.complete(holder, job_id)
    assert api.fail(stale, job_id).status_code == 409

    events, attempts = history(client, admin, job_id)
    assert [(name, actor) for name, actor, _at, _detail in events] == [
        ("enqueued", "producer-1"), ("claimed", "holder"), ("completed", "holder"),
        ("report_refused", "stale")]
    assert [(number, outcome) for number, _w, _c, _e, outcome, _err in attempts] == [
        (1, "completed")]


def test_history_an_earlier_release_stored_is_told_once(empty_db_url):
    """0023 on a database 0022 filled, its jobs' histories written whole (enqueued, claimed,
    completed, and every attempt): each is told once, and the jobs go on under the new rule;
    the way down drops the column and keeps the jobs."""
    upgrade(empty_db_url, "0022")
    t = 1_800_000_000_000_000
    lease = t + 3_600 * MICROS
    job = {"type": "email", "payload": "{}", "priority": 10, "max_retries": 3,
           "producer": "producer-1", "run_at": t, "created_at": t, "retry_count": 0}
    rows = [
        {**job, "status": "completed", "claimed_at": t + 1, "worker_id": "worker-1",
         "lease_expires_at": None, "lease_token": "a.1", "updated_at": t + 2},
        {**job, "status": "running", "claimed_at": t + 1, "worker_id": "worker-1",
         "lease_expires_at": lease, "lease_token": "b.2", "updated_at": t + 1},
        {**job, "status": "pending", "claimed_at": None, "worker_id": None,
         "lease_expires_at": None, "lease_token": "c.3", "updated_at": t + 2,
         "retry_count": 1, "error": "boom"},
    ]
    claimed_detail = json.dumps({"lease_expires_at": to_rfc3339(t + 31 * MICROS)},
                                separators=(",", ":"))
    attempts = [
        {"job_id": 1, "number": 1, "worker_id": "worker-1", "claimed_at": t + 1,
         "ended_at": t + 2, "outcome": "completed", "error": None},
        {"job_id": 2, "number": 1, "worker_id": "worker-1", "claimed_at": t + 1,
         "ended_at": None, "outcome": "running", "error": None},
        {"job_id": 3, "number": 1, "worker_id": "worker-1", "claimed_at": t + 1,
         "ended_at": t + 2, "outcome": "failed", "error": "boom"},
    ]
    events = [
        *({"job_id": n, "at": t, "event": "enqueued", "actor": "producer-1", "detail": None}
          for n in (1, 2, 3)),
        *({"job_id": n, "at": t + 1, "event": "claimed", "actor": "worker-1",
           "detail": claimed_detail} for n in (1, 2, 3)),
        {"job_id": 1, "at": t + 2, "event": "completed", "actor": "worker-1", "detail": None},
        {"job_id": 3, "at": t + 2, "event": "retry_scheduled", "actor": "worker-1",
         "detail": json.dumps({"error": "boom"})},
    ]
    engine = make_engine(empty_db_url, pooled=False)
    with engine.begin() as conn:  # the tables as 0022 left them, written as it wrote them
        for name, values in (("jobs", rows), ("job_attempts", attempts),
                             ("job_events", events)):
            columns = sorted({key for row in values for key in row})
            conn.execute(table(name, *map(column, columns)).insert(),
                         [{key: row.get(key) for key in columns} for row in values])

    upgrade(empty_db_url)

    application = create_app({"TESTING": True, "DATABASE_URL": empty_db_url,
                              "JOB_TYPES": frozenset({"email"}), "DB_POOL_SIZE": 2,
                              "CLOCK": ManualClock(start_us=t + 10)})
    services = application.extensions["queuelog"]
    admin = Key("admin-1", services.keys.create_key("admin-1", Role.ADMIN))
    worker = {"Authorization": f"Bearer {services.keys.create_key('worker-1', Role.WORKER)}"}
    client = application.test_client()

    def told(job_id: int) -> tuple[list[Any], list[Any]]:
        shown, tried = history(client, admin, job_id)
        return ([(name, at) for name, _actor, at, _detail in shown],
                [(number, outcome, ended) for number, _w, _c, ended, outcome, _e in tried])

    at = to_rfc3339
    assert told(1) == ([("enqueued", at(t)), ("claimed", at(t + 1)), ("completed", at(t + 2))],
                       [(1, "completed", at(t + 2))])
    assert told(2) == ([("enqueued", at(t)), ("claimed", at(t + 1))], [(1, "running", None)])
    assert told(3) == ([("enqueued", at(t)), ("claimed", at(t + 1)),
                        ("retry_scheduled", at(t + 2))], [(1, "failed", at(t + 2))])

    # They go on: the running job completes, the pending one runs again and completes.
    assert client.post("/jobs/2/complete", json={}, headers=worker).status_code == 200
    assert client.post("/jobs/claim", json={}, headers=worker).json["id"] == 3
    assert client.post("/jobs/3/complete", json={}, headers=worker).status_code == 200
    now = at(t + 10)
    assert told(2) == ([("enqueued", at(t)), ("claimed", at(t + 1)), ("completed", now)],
                       [(1, "completed", now)])
    assert told(3) == ([("enqueued", at(t)), ("claimed", at(t + 1)),
                        ("retry_scheduled", at(t + 2)), ("claimed", now), ("completed", now)],
                       [(1, "failed", at(t + 2)), (2, "completed", now)])
    services.db.engine.dispose()

    command.downgrade(alembic_config(empty_db_url), "0022")

    with engine.connect() as conn:
        assert [tuple(row) for row in conn.execute(text(
            "SELECT id, status FROM jobs ORDER BY id"))] == [
            (1, "completed"), (2, "completed"), (3, "completed")]
        assert "claimed_until" not in {
            name for name, in conn.execute(text(
                "SELECT name FROM pragma_table_info('jobs')" if engine.dialect.name == "sqlite"
                else "SELECT column_name FROM information_schema.columns "
                     "WHERE table_name = 'jobs'"))}
    engine.dispose()
