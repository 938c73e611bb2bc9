"""Claims while a snapshot holds PostgreSQL's horizon (docs/SCALING.md, "A held snapshot"): a
claim of any type reads each priority level from where the process's last claims left off, so
that it does not step over every job claimed since the snapshot began; what comes claimable
behind the positions is claimed at the next read from the front, and at once when nothing is
ahead of them. The rules on a clock alone, the claims on both engines (the statement is the
same), and on PostgreSQL, under a real held snapshot, what the claim's index scans read."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app.core.clock import MICROS, ManualClock
from app.core.priorities import Priority
from app.database_wakes import look_at_the_horizon, start_database_wakes
from app.jobs.domain.claim_positions import (
    FRONT_COST_TIMES,
    FRONT_SECONDS,
    HELD_FOR_SECONDS,
    LEVELS,
    MARGIN_SECONDS,
    ClaimPositions,
)
from app.jobs.domain.models import Job
from app.jobs.usecases.horizon_watch import HorizonWatch
from app.storage.listener import CHANNEL
from tests.conftest import Api, Key

SECOND = MICROS


def _job(job_id: int, created_at: int, priority: int = Priority.MEDIUM) -> Job:
    return Job(id=job_id, type="email", payload="{}", priority=priority, status="running",
               retry_count=0, max_retries=3, producer="p", idempotency_key=None,
               request_fingerprint=None, run_at=created_at, claimed_at=None, worker_id=None,
               lease_expires_at=None, lease_token=None, result=None, error=None,
               created_at=created_at, updated_at=created_at)


# -- the rules -------------------------------------------------------------------------------

def test_without_a_notice_every_claim_reads_from_the_front() -> None:
    positions = ClaimPositions(ManualClock(start_us=1_000 * SECOND))
    positions.claimed([_job(1, 10 * SECOND)])
    assert positions.where_to_start() is None
    assert not positions.in_use


def test_after_a_notice_a_level_starts_at_its_last_claim_and_the_front_comes_back_each_second(
        ) -> None:
    clock = ManualClock(start_us=1_000 * SECOND)
    positions = ClaimPositions(clock)
    positions.horizon_held()
    assert positions.where_to_start() is None  # the first read is from the front
    positions.claimed([_job(7, 10 * SECOND), _job(9, 10 * SECOND),
                       _job(3, 20 * SECOND, Priority.HIGH)])
    where = positions.where_to_start()
    assert where is not None
    assert where[Priority.MEDIUM] == (10 * SECOND, 9)
    assert where[Priority.HIGH] == (20 * SECOND, 3)
    assert where[Priority.LOW] == where[Priority.CRITICAL] == (0, 0)
    assert set(where) == set(LEVELS)
    clock.advance(FRONT_SECONDS)
    assert positions.where_to_start() is None
    assert positions.where_to_start() is not None


def test_a_read_from_the_front_that_took_long_puts_off_the_next_by_as_many_times() -> None:
    clock = ManualClock(start_us=1_000 * SECOND)
    positions = ClaimPositions(clock)
    positions.horizon_held()
    assert positions.where_to_start() is None  # from the front: it steps over what is held
    took = 0.5
    clock.advance(took)
    positions.claimed([_job(7, 10 * SECOND)], from_the_front_us=round(took * MICROS))
    clock.advance(FRONT_SECONDS)
    assert positions.where_to_start() is not None  # a second on: still from the positions
    clock.advance(FRONT_COST_TIMES * took - FRONT_SECONDS - took - 1e-3)
    assert positions.where_to_start() is not None
    clock.advance(2e-3)
    assert positions.where_to_start() is None  # FRONT_COST_TIMES its time after it began
    # A quick one brings the pace back to each FRONT_SECONDS.
    positions.claimed([], from_the_front_us=1_000)
    clock.advance(FRONT_SECONDS)
    assert positions.where_to_start() is None


def test_a_position_stays_behind_now_by_the_margin() -> None:
    clock = ManualClock(start_us=1_000 * SECOND)
    positions = ClaimPositions(clock)
    positions.horizon_held()
    positions.where_to_start()
    positions.claimed([_job(5, clock.now_us() - SECOND)])  # enqueued a second ago
    where = positions.where_to_start()
    assert where is not None
    assert where[Priority.MEDIUM] == (clock.now_us() - round(MARGIN_SECONDS * MICROS), 0)


def test_the_positions_lapse_without_a_new_notice_and_start_afresh_after_one() -> None:
    clock = ManualClock(start_us=1_000 * SECOND)
    positions = ClaimPositions(clock)
    positions.horizon_held()
    positions.where_to_start()
    positions.claimed([_job(5, 10 * SECOND)])
    clock.advance(HELD_FOR_SECONDS - 1e-6)
    positions.horizon_held()  # told again while held: kept
    clock.advance(2e-6)
    where = positions.where_to_start()
    assert where is None or where[Priority.MEDIUM] == (10 * SECOND, 5)
    assert positions.where_to_start() == {**dict.fromkeys(LEVELS, (0, 0)),
                                          Priority.MEDIUM: (10 * SECOND, 5)}
    clock.advance(HELD_FOR_SECONDS)
    assert not positions.in_use
    assert positions.where_to_start() is None
    positions.horizon_held()  # a new hold: nothing of the last one is kept
    positions.where_to_start()
    assert positions.where_to_start() == dict.fromkeys(LEVELS, (0, 0))


# -- the claims, on both engines ---------------------------------------------------------------

def _positions(app: Any) -> ClaimPositions:
    positions: ClaimPositions = app.extensions["queuelog"].jobs.claim_positions
    return positions


def _claimed_ids(api: Api, worker: Key, count: int) -> list[int]:
    ids = []
    for _ in range(count):
        answer = api.claim(worker)
        assert answer.status_code == 200, answer.data
        ids.append(answer.json["id"])
    return ids


def test_claims_from_positions_keep_the_claim_order(app, api, admin, worker, clock):
    order = {}
    for label in ("low", "medium", "critical", "medium", "high", "high", "medium", "low"):
        order[api.enqueue(admin, priority=label).json["id"]] = label
        clock.advance(1e-6)
    clock.advance(60)
    _positions(app).horizon_held()

    claimed = _claimed_ids(api, worker, 3)  # the first from the front, then from positions
    claimed += _claimed_ids(api, worker, 5)

    rank = {"critical": 0, "high": 1, "medium": 2, "low": 3}
    assert claimed == sorted(order, key=lambda job_id: (rank[order[job_id]], job_id))
    assert api.claim(worker).status_code == 204


def _failed_then_newer(app: Any, api: Api, admin: Key, worker: Key, clock: ManualClock,
                       count: int) -> tuple[int, list[int]]:
    """A job failed for good (its retry will put it behind the positions), then `count` newer
    ones, a minute old when the horizon's notice puts the claims on positions."""
    first = api.enqueue(admin, max_retries=0).json["id"]
    assert api.claim(worker).json["id"] == first
    assert api.fail(worker, first).json["status"] == "failed"
    clock.advance(1)
    newer = [api.enqueue(admin).json["id"] for _ in range(count)]
    clock.advance(60)
    _positions(app).horizon_held()
    return first, newer


def test_a_job_come_back_behind_the_positions_waits_at_most_for_the_next_front_read(
        app, api, admin, worker, clock):
    first, newer = _failed_then_newer(app, api, admin, worker, clock, 3)
    assert _claimed_ids(api, worker, 1) == newer[:1]  # from the front

    assert api.retry(admin, first).status_code == 200  # pending again, behind the position
    assert _claimed_ids(api, worker, 1) == newer[1:2]  # read from the position: passed over
    clock.advance(FRONT_SECONDS)
    assert _claimed_ids(api, worker, 1) == [first]  # the front's turn
    assert _claimed_ids(api, worker, 1) == newer[2:]


def test_a_job_behind_the_positions_is_claimed_at_once_when_nothing_is_ahead_of_them(
        app, api, admin, worker, clock):
    first, newer = _failed_then_newer(app, api, admin, worker, clock, 2)
    assert _claimed_ids(api, worker, 2) == newer
    assert api.retry(admin, first).status_code == 200

    assert _claimed_ids(api, worker, 1) == [first]  # the same statement's front part
    assert api.claim(worker).status_code == 204


# -- under a real held snapshot (PostgreSQL) ---------------------------------------------------

@contextlib.contextmanager
def _held_snapshot(url: str, first_read: str = "SELECT count(*) FROM jobs") -> Iterator[None]:
    """A REPEATABLE READ transaction that has taken its snapshot (by `first_read`), idle
    while the block runs."""
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True, application_name=_HOLDER) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute(first_read)
        try:
            yield
        finally:
            conn.execute("ROLLBACK")


_HOLDER = "queuelog-test-snapshot"


def _index_entries_read(app: Any, url: str) -> int:
    """Entries the indexes of `jobs` have handed out so far, by the server's statistics: the
    app's sessions are closed first (a session sends the statistics it holds as it ends), and
    their ends waited for."""
    app.extensions["queuelog"].db.engine.dispose()
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            for _ in range(500):
                others = conn.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND application_name <> :holder "
                    "AND backend_type = 'client backend'"), {"holder": _HOLDER}).scalar_one()
                if others == 0:
                    break
                time.sleep(0.01)
            conn.execute(text("SELECT pg_stat_clear_snapshot()"))
            return int(conn.execute(text(
                "SELECT sum(idx_tup_read) FROM pg_stat_user_indexes WHERE relname = 'jobs'"
                )).scalar_one())
    finally:
        engine.dispose()


def _claim_and_complete(api: Api, worker: Key, count: int) -> None:
    for _ in range(count):
        job = api.claim(worker).json
        answer = api.complete(worker, job["id"], lease_token=job["lease_token"])
        assert answer.status_code == 200, answer.data


@pytest.mark.parametrize("engine_name", ["postgresql"], indirect=True)
def test_under_a_held_snapshot_claims_and_completes_do_not_step_over_the_jobs_done(
        app, api, admin, producer, worker, clock, db_url):
    """The claims from positions, and the completes, which find their job by id: a
    complete's statement is written so that no plan walks the index of running jobs instead
    (app/jobs/sql/statuses.py, status_is_by_id), which here, on a database never analyzed,
    PostgreSQL did for every complete."""
    claims = 300
    for _ in range(3):
        batch = api.client.post("/jobs/batch", headers=producer.headers, json={
            "jobs": [{"type": "email", "payload": {"n": n}} for n in range(500)]})
        assert batch.status_code == 201, batch.data
        clock.advance(1e-6)
    clock.advance(60)

    with _held_snapshot(db_url):
        start = _index_entries_read(app, db_url)
        _claim_and_complete(api, worker, claims)  # from the front, as without a notice
        from_the_front = _index_entries_read(app, db_url) - start
        _positions(app).horizon_held()
        _claim_and_complete(api, worker, claims)
        from_positions = _index_entries_read(app, db_url) - start - from_the_front

    print(f"index entries read for {claims} claims and completes under a held snapshot: "
          f"from the front {from_the_front:,}, from positions {from_positions:,}")
    # From the front, the n-th claim steps over the n - 1 jobs claimed before it; from
    # positions, a claim and its complete read a few entries of their own job (the first
    # claim reads from the front).
    assert from_the_front >= claims * (claims - 1) // 2
    assert from_positions <= 8 * claims
    assert from_positions * 10 < from_the_front


@pytest.mark.parametrize("engine_name", ["postgresql"], indirect=True)
def test_the_leader_tells_every_listener_while_a_holder_has_held_the_horizon(app, db_url,
                                                                            clock):
    services = app.extensions["queuelog"]
    dsn = make_url(db_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        other_database = make_url(db_url).set(database="postgres").render_as_string(
            hide_password=False)
        with _held_snapshot(other_database, "SELECT count(*) FROM pg_class"):
            time.sleep(0.6)
            # Another database's snapshot holds back none of this one's dead rows.
            watch = HorizonWatch(services.db, clock, threshold_seconds=300,
                                 tell_after_seconds=0.5)
            watch.look()
            assert [n.payload for n in listener.notifies(timeout=0.5, stop_after=1)] == []
            assert not watch.held_long()
        with _held_snapshot(db_url):
            time.sleep(0.6)
            # Not yet held for long enough to tell.
            HorizonWatch(services.db, clock, threshold_seconds=300,
                         tell_after_seconds=3600).look()
            assert [n.payload for n in listener.notifies(timeout=0.5, stop_after=1)] == []
            HorizonWatch(services.db, clock, threshold_seconds=300,
                         tell_after_seconds=0.5).look()
            told = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert told == ["horizon"]


@pytest.mark.parametrize("engine_name", ["postgresql"], indirect=True)
def test_a_process_that_starts_during_a_hold_takes_its_positions_at_once(app, db_url, clock):
    """A process that starts while a snapshot holds the horizon (a worker gunicorn recycled)
    looks once itself rather than wait up to half a minute for the leader's next notice."""
    services = app.extensions["queuelog"]
    positions = _positions(app)
    watch = HorizonWatch(services.db, clock, threshold_seconds=300, tell_after_seconds=0.5)
    look_at_the_horizon(watch, positions)
    assert not positions.in_use
    with _held_snapshot(db_url):
        time.sleep(0.6)
        look_at_the_horizon(watch, positions)
    assert positions.in_use


@pytest.mark.parametrize("engine_name", ["postgresql"], indirect=True)
def test_a_served_process_takes_its_positions_from_the_horizons_notice_alone(app, db_url):
    """Served (app/database_wakes.py), a process puts its claims on positions when the
    database tells it the horizon is held: not when its listener (re)connects and every
    other kind is told to catch up on what it missed."""
    positions = _positions(app)
    start_database_wakes(app)
    listener = app.extensions["queuelog_listener"]
    dsn = make_url(db_url).set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        deadline = time.monotonic() + 30
        while not listener.listening:
            assert time.monotonic() < deadline, "the listener never listened"
            time.sleep(0.05)
        time.sleep(0.2)  # the catch-up delivery runs right after LISTEN
        assert not positions.in_use
        with psycopg.connect(dsn, autocommit=True) as other:
            other.execute(f"NOTIFY {CHANNEL}, 'horizon'")
        while not positions.in_use:
            assert time.monotonic() < deadline, "the notice never reached the claims"
            time.sleep(0.05)
    finally:
        listener.stop()
