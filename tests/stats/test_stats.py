"""GET /stats (contract §20): per type and minute, counted in the job transactions, with the
pending depth the ticker's chore counts; both engines. How the counts are written:
test_stats_written.py."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import func, select

from app import create_app
from app.core.callers import Role
from app.core.clock import MICROS, ManualClock, to_rfc3339
from app.storage.schema import job_depth, job_stats
from tests.conftest import Api, Key

START = 1_800_000_000_000_000  # the clock fixture's start: a minute's first microsecond
MINUTE = 60 * MICROS


def stats(client: FlaskClient, admin: Key, **query: Any) -> Any:
    return client.get("/stats", query_string=query, headers=admin.headers)


def at(offset_minutes: float) -> str:
    return to_rfc3339(START + round(offset_minutes * MINUTE)) or ""


def counts(bucket: dict[str, Any]) -> tuple[int, int, int, int]:
    return bucket["enqueued"], bucket["claimed"], bucket["completed"], bucket["failed"]


def run_chore(app: Flask) -> int:
    return int(app.extensions["queuelog"].stats.chore()())


def test_each_minute_counts_what_its_transactions_did(client, api: Api, producer, worker,
                                                      admin, clock: ManualClock) -> None:
    # Minute 0: 5 emails and 2 pdfs enqueued; 3 emails claimed, 1 completed, 1 failed with a
    # retry left (the attempt counts as failed, the job goes back to pending).
    ids = [api.enqueue(producer, max_retries=1).json["id"] for _ in range(5)]
    for _ in range(2):
        api.enqueue(producer, type="pdf")
    claimed = [api.claim(worker, types=["email"]).json for _ in range(3)]
    api.complete(worker, claimed[0]["id"], lease_token=claimed[0]["lease_token"])
    api.fail(worker, claimed[1]["id"], lease_token=claimed[1]["lease_token"], retry_in_seconds=0)
    # Minute 2: the failed one claimed again and failed for good; another completed.
    clock.advance(125)
    again = api.claim(worker, types=["email"]).json
    assert again["id"] in ids
    api.fail(worker, again["id"], lease_token=again["lease_token"])
    api.complete(worker, claimed[2]["id"], lease_token=claimed[2]["lease_token"])

    email = stats(client, admin, type="email", **{"from": at(0), "to": at(3)}).json
    assert email["type"] == "email" and email["step"] == "minute"
    assert [b["at"] for b in email["buckets"]] == [at(0), at(1), at(2)]
    assert [counts(b) for b in email["buckets"]] == [(5, 3, 1, 1), (0, 0, 0, 0), (0, 1, 1, 1)]
    everything = stats(client, admin, **{"from": at(0), "to": at(3)}).json
    assert everything["type"] is None
    assert [counts(b) for b in everything["buckets"]] == [(7, 3, 1, 1), (0, 0, 0, 0),
                                                          (0, 1, 1, 1)]
    hourly = stats(client, admin, type="email", step="hour",
                   **{"from": at(0), "to": at(60)}).json
    assert [counts(b) for b in hourly["buckets"]] == [(5, 4, 2, 2)]


def test_the_default_is_the_last_hour_by_minute_with_its_empty_buckets(
        client, api: Api, producer, admin, clock: ManualClock) -> None:
    clock.advance(30)
    api.enqueue(producer)
    answer = stats(client, admin).json
    buckets = answer["buckets"]
    assert len(buckets) == 61  # the minute an hour ago through the current one
    assert buckets[-1]["at"] == at(0) and counts(buckets[-1]) == (1, 0, 0, 0)
    assert all(counts(b) == (0, 0, 0, 0) for b in buckets[:-1])


def test_the_depth_is_the_pending_count_of_each_minute_carried_until_the_next(
        app: Flask, client, api: Api, producer, worker, admin, clock: ManualClock) -> None:
    for _ in range(3):
        api.enqueue(producer)
    assert run_chore(app) > 0
    assert run_chore(app) == 0  # once a minute per process
    clock.advance(120)
    api.claim(worker, types=["email"])
    run_chore(app)
    clock.advance(60)
    run_chore(app)

    email = stats(client, admin, type="email", **{"from": at(-1), "to": at(5)}).json
    # None before the first count; minute 1 had no count of its own: minute 0's stands.
    # Minutes ahead of now: null.
    assert [b["pending"] for b in email["buckets"]] == [None, 3, 3, 2, 2, None]
    pdf = stats(client, admin, type="pdf", **{"from": at(0), "to": at(1)}).json
    assert pdf["buckets"][0]["pending"] == 0  # a configured type without jobs: 0, not null


def test_a_process_that_takes_the_lead_within_a_minute_still_counts_its_depth(
        app: Flask, client, api: Api, producer, admin) -> None:
    """Where one process samples for the database (the maintenance leader), a process's
    first tick may come before it leads: the minute's depth is counted once it does."""
    stats_service = app.extensions["queuelog"].stats
    leading = False
    stats_service.samples_database = lambda: leading
    for _ in range(2):
        api.enqueue(producer)
    run_chore(app)  # not leading yet: only its own counts
    assert stats(client, admin, type="email", **{"from": at(0), "to": at(1)}
                 ).json["buckets"][0]["pending"] is None
    leading = True
    assert run_chore(app) > 0
    assert run_chore(app) == 0  # still once a minute
    assert stats(client, admin, type="email", **{"from": at(0), "to": at(1)}
                 ).json["buckets"][0]["pending"] == 2


def test_a_reserved_job_counts_as_enqueued_once_confirmed(client, api: Api, producer,
                                                          admin, clock: ManualClock) -> None:
    reserved = api.enqueue(producer, reserve={"confirm_within_seconds": 600}).json
    window = {"from": at(0), "to": at(2)}
    assert counts(stats(client, admin, type="email", **window).json["buckets"][0]) == (
        0, 0, 0, 0)
    clock.advance(60)
    confirmed = client.post(f"/jobs/{reserved['id']}/confirm", headers=producer.headers)
    assert confirmed.status_code == 200, confirmed.json
    assert [counts(b) for b in stats(client, admin, type="email", **window).json["buckets"]] \
        == [(0, 0, 0, 0), (1, 0, 0, 0)]


def test_counts_older_than_14_days_are_forgotten_by_the_chore(
        app: Flask, client, api: Api, producer, admin, clock: ManualClock) -> None:
    api.enqueue(producer)
    run_chore(app)
    clock.advance(14 * 86_400 + 120)
    api.enqueue(producer)
    run_chore(app)
    db = app.extensions["queuelog"].db
    with db.read() as conn:
        minutes = set(conn.execute(select(job_stats.c.minute)).scalars())
        depth_minutes = set(conn.execute(select(job_depth.c.minute)).scalars())
    now_minute = START + (14 * 86_400 + 120) * MICROS
    assert minutes == {now_minute} and depth_minutes == {now_minute}


def test_with_stats_off_nothing_is_counted(app_config: dict[str, Any]) -> None:
    application = create_app({**app_config, "STATS": False})
    keys = application.extensions["queuelog"].keys
    producer = {"Authorization": f"Bearer {keys.create_key('producer-1', Role.PRODUCER)}"}
    admin = {"Authorization": f"Bearer {keys.create_key('admin-1', Role.ADMIN)}"}
    client = application.test_client()
    assert client.post("/jobs", json={"type": "email"}, headers=producer).status_code == 201
    answer = client.get("/stats", query_string={"from": at(0), "to": at(1)}, headers=admin)
    application.extensions["queuelog"].db.engine.dispose()
    assert counts(answer.json["buckets"][0]) == (0, 0, 0, 0)


@pytest.mark.parametrize("query,field", [
    ({"step": "day"}, "step"),
    ({"from": at(10), "to": at(5)}, "to"),
    ({"from": at(0), "to": at(2000)}, "from"),
    ({"from": "yesterday"}, "from"),
    ({"type": "em\x00ail"}, "type"),
    ({"type": "x" * 101}, "type"),
    ({"colour": "red"}, "colour"),
    # Hostile: other scripts' digits, a year out of range, a huge offset, a NUL step.
    ({"from": "\uff12\uff10\uff12\uff17-01-15T08:00:00Z"}, "from"),
    ({"to": "9999999-01-01T00:00:00Z"}, "to"),
    ({"from": "2027-01-15T08:00:00+99999:00"}, "from"),
    ({"step": "min\x00ute"}, "step"),
    ({"from": "0001-01-01T00:00:00Z", "to": at(0)}, "from"),
])
def test_bad_queries_are_422s_naming_the_field(client, admin, query, field) -> None:
    refused = stats(client, admin, **query)
    assert refused.status_code == 422, refused.json
    assert field in refused.json["errors"]


def test_only_admins_read_stats(client, producer, worker) -> None:
    for key in (producer, worker):
        assert client.get("/stats", headers=key.headers).status_code == 403
    assert client.get("/stats").status_code == 401


def test_concurrent_transactions_all_count_in_the_process_slot(
        app: Flask, api: Api, producer, client, admin) -> None:
    """Concurrent writers hand their counts to the process, which adds them to one row of
    its own slot: none is lost, and the reads sum the slots."""
    import threading

    def enqueue_many() -> None:
        for _ in range(10):
            assert api.enqueue(producer).status_code == 201

    threads = [threading.Thread(target=enqueue_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    bucket = stats(client, admin, type="email", **{"from": at(0), "to": at(1)}).json
    assert bucket["buckets"][0]["enqueued"] == 40
    with app.extensions["queuelog"].db.read() as conn:
        total = conn.execute(select(func.sum(job_stats.c.enqueued))).scalar()
        slots = conn.execute(select(func.count(job_stats.c.slot.distinct()))).scalar()
    assert total == 40
    assert slots == 1  # one process: one slot


def test_the_depth_count_leaves_the_pages_snapshot_alone(app: Flask, client, api: Api,
                                                         producer, admin) -> None:
    """The chore counts on a timer: a page read just after it must not be shown the count
    the chore took before the page's jobs were enqueued."""
    run_chore(app)
    api.enqueue(producer)
    shown = client.get("/types/email", headers=admin.headers).json
    assert shown["counts"]["pending"] == 1
