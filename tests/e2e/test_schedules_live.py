"""Schedules fired by real gunicorn servers: 4 worker processes each running a ticker, two
servers on one PostgreSQL, and a server killed with SIGKILL across slots. A schedule firing
every second (six-field cron, QUEUELOG_SCHEDULE_SECONDS=1) makes many slots in a short run:
at minute resolution the same proof would take an hour.

The tests count jobs per slot in the database; the lateness (created_at - scheduled_for) is
printed (run with -s), not asserted."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
import requests
from sqlalchemy import create_engine, select

from app.storage.schema import jobs
from tests.e2e.conftest import StartServer
from tests.servers import LiveServer, create_api_key

pytestmark = pytest.mark.slow

EVERY_SECOND = "* * * * * *"
SECOND = 1_000_000
# How long the every-second schedule runs in the exactly-once proofs: every slot is raced
# for by every ticker (each process ticks each 0.5 s), so a dozen slots are a dozen such
# races; a longer run repeats the same race (30 s runs took half a minute more per engine).
RUN_SECONDS = 12


def _create(server: LiveServer, token: str, **body: Any) -> None:
    body = {"name": "every-second", "cron": EVERY_SECOND, "job": {"type": "sync"}, **body}
    response = requests.post(f"{server.url}/schedules", json=body, timeout=30,
                             headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 201, response.text


def _pause(server: LiveServer, token: str) -> None:
    response = requests.patch(f"{server.url}/schedules/every-second", json={"paused": True},
                              timeout=30, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text


def _slots(database_url: str) -> list[tuple[int, int]]:
    """(scheduled_for, created_at) of every schedule job, in slot order."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(jobs.c.scheduled_for, jobs.c.created_at)
                                .where(jobs.c.schedule == "every-second")
                                .order_by(jobs.c.scheduled_for)).all()
    finally:
        engine.dispose()
    return [(row[0], row[1]) for row in rows]


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _report(what: str, slots: list[tuple[int, int]]) -> None:
    lateness = [(created - slot) / SECOND for slot, created in slots]
    print(f"\n{what}: {len(slots)} jobs for {len({s for s, _ in slots})} slots, lateness "
          f"p50 {sorted(lateness)[len(lateness) // 2]:.3f} s, p99 {_p99(lateness):.3f} s, "
          f"max {max(lateness):.3f} s")


def _assert_one_job_per_slot_none_missing(slots: list[tuple[int, int]]) -> None:
    counts = Counter(slot for slot, _ in slots)
    assert [slot for slot, n in counts.items() if n > 1] == []
    first, last = slots[0][0], slots[-1][0]
    assert sorted(counts) == list(range(first, last + SECOND, SECOND))


def test_four_workers_enqueue_each_second_once(start_server: StartServer,
                                               server_database_url: str) -> None:
    url = server_database_url
    server = start_server(url, workers=4, settings={"SCHEDULE_SECONDS": "1"})
    token = create_api_key(url, "admin-1", "admin")
    _create(server, token)
    time.sleep(RUN_SECONDS)
    _pause(server, token)
    time.sleep(1)
    slots = _slots(url)
    _report(f"4 workers ({url.split(':')[0]})", slots)
    assert len(slots) >= RUN_SECONDS - 3  # about RUN_SECONDS of slots
    _assert_one_job_per_slot_none_missing(slots)
    assert "Traceback" not in server.stderr()


def test_two_servers_on_one_postgresql_enqueue_each_second_once(
        start_server: StartServer, postgres_server: Any) -> None:
    url = postgres_server.create_database()
    servers = [start_server(url, workers=2, settings={"SCHEDULE_SECONDS": "1"})
               for _ in range(2)]
    token = create_api_key(url, "admin-1", "admin")
    _create(servers[0], token)
    time.sleep(RUN_SECONDS)
    _pause(servers[1], token)
    time.sleep(1)
    slots = _slots(url)
    _report("2 servers x 2 workers (postgresql)", slots)
    assert len(slots) >= RUN_SECONDS - 3
    _assert_one_job_per_slot_none_missing(slots)
    for server in servers:
        assert "Traceback" not in server.stderr()


@pytest.mark.parametrize("catch_up", ["latest", "none"])
def test_a_server_killed_across_slots_catches_up_as_told_and_never_twice(
        start_server: StartServer, server_database_url: str, catch_up: str) -> None:
    url = server_database_url
    grace = 3  # seconds: a slot older than this when fired counts as missed
    server = start_server(url, workers=2, settings={"SCHEDULE_SECONDS": "1",
                                                    "SCHEDULE_GRACE_SECONDS": str(grace)})
    token = create_api_key(url, "admin-1", "admin")
    _create(server, token, catch_up=catch_up)
    time.sleep(4)
    server.kill()  # SIGKILL to the master and every worker at once
    before = _slots(url)
    time.sleep(grace + 3)  # slots pass with no server: more than the grace
    server.start()
    time.sleep(4)
    _pause(server, token)
    time.sleep(1)
    slots = _slots(url)
    _report(f"kill -9, catch_up {catch_up}", slots)
    assert slots[:len(before)] == before
    counts = Counter(slot for slot, _ in slots)
    assert [slot for slot, n in counts.items() if n > 1] == []
    after = [slot for slot, _ in slots[len(before):]]
    made = [created for _, created in slots[len(before):]]
    # Slots passed while no server ran: some have no job.
    assert after[0] - before[-1][0] > SECOND
    if catch_up == "latest":
        # The first firing after the restart: one job for the newest missed slot and one for
        # the slot on time, enqueued together; none for the slots before them.
        assert made[0] == made[1] and after[1] == after[0] + SECOND
        assert made[2] != made[1]
    else:
        # Only the slot on time: nothing enqueued for a missed one.
        assert made[0] != made[1]
        assert made[0] - after[0] <= grace * SECOND
    # From the first slot after the restart on, every slot.
    assert after == list(range(after[0], after[-1] + SECOND, SECOND))
