"""Bulk retry and cancel work in bounded batches, each its own short write transaction
(QUEUELOG_BULK_BATCH_SIZE), and settle unique-key conflicts set-wise: which jobs change, which
are skipped, and the events written are those of one transaction taking the jobs in id order."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import event

from tests.conftest import Api, Key

KEEPS_FAILED = ["pending", "running", "failed"]


@pytest.fixture(params=[1, 3, 10_000], ids=lambda size: f"batch{size}")
def app_config(app_config: dict[str, Any], request: pytest.FixtureRequest) -> dict[str, Any]:
    return {**app_config, "BULK_BATCH_SIZE": request.param}


def bulk(client: Any, key: Key, action: str, **body: Any) -> Any:
    return client.post(f"/jobs/{action}-many", json=body, headers=key.headers)


def failed(api: Api, producer: Key, worker: Key, **enqueue: Any) -> int:
    """A job of type pdf (the only one pending when this runs) claimed and failed for good."""
    job_id = api.enqueue(producer, type="pdf", max_retries=0, **enqueue).json["id"]
    assert api.claim(worker, types=["pdf"]).json["id"] == job_id
    assert api.fail(worker, job_id).json["status"] == "failed"
    return job_id


def cancelled(api: Api, producer: Key, admin: Key, **enqueue: Any) -> int:
    job_id = api.enqueue(producer, **enqueue).json["id"]
    assert api.cancel(admin, job_id).json["status"] == "cancelled"
    return job_id


def unique(key: str, statuses: list[str] | None = None) -> dict[str, Any]:
    return {"key": key} if statuses is None else {"key": key, "while": statuses}


def events_of(client: Any, admin: Key, job_id: int) -> list[Any]:
    return client.get(f"/jobs/{job_id}/events", headers=admin.headers).json["events"]


def test_a_bulk_retry_takes_the_jobs_whose_keys_are_free_in_id_order_and_skips_the_others(
        api, client, producer, worker, admin, make_key):
    other_producer = make_key("producer-2", "producer")
    jobs: dict[str, int] = {}
    jobs["plain_failed"] = failed(api, producer, worker)
    # An older cancelled twin of a failed job that holds its key while failed: the failed
    # one is retried (it keeps its key), the cancelled one skipped, though its id is lower.
    jobs["stale_twin"] = cancelled(api, producer, admin, type="pdf",
                                   unique=unique("own", KEEPS_FAILED))
    jobs["key_keeper"] = failed(api, producer, worker, unique=unique("own", KEEPS_FAILED))
    # A failed job whose key a pending twin took since: skipped.
    jobs["failed_held"] = failed(api, producer, worker, unique=unique("late"))
    jobs["failed_held_twin"] = api.enqueue(producer, type="pdf", unique=unique("late")).json["id"]
    # A cancelled job whose key a pending twin holds: skipped.
    jobs["cancelled_held"] = cancelled(api, producer, admin, unique=unique("held"))
    jobs["cancelled_held_twin"] = api.enqueue(producer, unique=unique("held")).json["id"]
    # Two cancelled twins, no holder: the first retried takes the key, the second skipped.
    jobs["pair_first"] = cancelled(api, producer, admin, unique=unique("pair"))
    jobs["plain_cancelled"] = cancelled(api, producer, admin)
    jobs["pair_second"] = cancelled(api, producer, admin, unique=unique("pair"))
    # The same key under another producer is another key: retried.
    jobs["other_producers"] = cancelled(api, other_producer, admin, unique=unique("held"))
    jobs["pending"] = api.enqueue(producer).json["id"]
    jobs["pair_third"] = cancelled(api, producer, admin, unique=unique("pair"))
    jobs["last_plain"] = cancelled(api, producer, admin)
    before = {name: (api.get(admin, job_id).json, events_of(client, admin, job_id))
              for name, job_id in jobs.items()}

    answer = bulk(client, admin, "retry", limit=10_000)

    retried = ["plain_failed", "key_keeper", "pair_first", "plain_cancelled", "other_producers",
               "last_plain"]
    assert answer.status_code == 200, answer.json
    assert answer.json == {"count": len(retried), "ids": sorted(jobs[name] for name in retried)}
    for name, job_id in jobs.items():
        job, events = api.get(admin, job_id).json, events_of(client, admin, job_id)
        if name in retried:
            assert (job["status"], job["retry_count"]) == ("pending", 0), name
            assert events[:-1] == before[name][1], name
            assert (events[-1]["event"], events[-1]["actor"]) == ("retried", "admin-1"), name
        else:
            assert (job, events) == before[name], name


def test_the_limit_counts_the_jobs_skipped_for_their_keys_as_before(
        api, client, producer, admin):
    held = cancelled(api, producer, admin, unique=unique("held"))
    api.enqueue(producer, unique=unique("held"))
    first, second, third = (cancelled(api, producer, admin) for _ in range(3))

    assert bulk(client, admin, "retry", limit=3).json == {"count": 2, "ids": [first, second]}
    assert api.get(admin, held).json["status"] == "cancelled"
    assert api.get(admin, third).json["status"] == "cancelled"


def test_a_bulk_cancel_of_jobs_holding_keys_frees_them_as_before(api, client, producer, admin):
    kept = api.enqueue(producer, unique=unique("kept", ["pending", "cancelled"])).json["id"]
    freed = api.enqueue(producer, unique=unique("freed")).json["id"]
    plain = api.enqueue(producer).json["id"]

    assert bulk(client, admin, "cancel").json == {"count": 3, "ids": [kept, freed, plain]}
    assert api.enqueue(producer, unique=unique("kept", ["pending", "cancelled"])).json["id"] == kept
    assert api.enqueue(producer, unique=unique("freed")).json["id"] > plain


@pytest.fixture
def pending_at_each_commit(app: Flask) -> Iterator[list[int]]:
    yield from counted_at_each_commit(app, "SELECT count(*) FROM jobs WHERE status = 'pending'")


@pytest.fixture
def jobs_at_each_commit(app: Flask) -> Iterator[list[int]]:
    yield from counted_at_each_commit(app, "SELECT count(*) FROM jobs")


def counted_at_each_commit(app: Flask, query: str) -> Iterator[list[int]]:
    """What `query` counts as each transaction on the service's engine commits, read inside
    that transaction just before its COMMIT."""
    counts: list[int] = []
    engine = app.extensions["queuelog"].db.engine

    def on_commit(conn: Any) -> None:
        cursor = conn.connection.driver_connection.cursor()
        cursor.execute(query)
        counts.append(cursor.fetchone()[0])
        cursor.close()

    event.listen(engine, "commit", on_commit)
    yield counts
    event.remove(engine, "commit", on_commit)


def steps_since(counts: list[int], start: int) -> list[int]:
    """How each commit from the `start`th on changed the count (commits changing nothing left
    out)."""
    seen = counts[start - 1:]
    return [after - before for before, after in itertools.pairwise(seen) if after != before]


@pytest.mark.parametrize("app_config", [10], indirect=True, ids=["batch10"])
def test_a_bulk_retry_commits_in_batches_of_the_configured_size(
        api, client, producer, admin, pending_at_each_commit):
    ids = [api.enqueue(producer, unique=unique(f"k{n}")).json["id"] for n in range(45)]
    assert bulk(client, admin, "cancel", ids=ids).json["count"] == 45
    # Twins hold the keys of every third job: those are skipped without a savepoint each.
    held = ids[::3]
    for n in range(0, 45, 3):
        api.enqueue(producer, unique=unique(f"k{n}"))
    commits_before = len(pending_at_each_commit)

    answer = bulk(client, admin, "retry", ids=ids)

    assert answer.json["ids"] == [job_id for job_id in ids if job_id not in held]
    # 45 jobs in batches of 10: five transactions, each retrying the free jobs of its ten.
    assert steps_since(pending_at_each_commit, commits_before) == [6, 7, 7, 6, 4]


@pytest.mark.parametrize("app_config", [10], indirect=True, ids=["batch10"])
def test_a_bulk_cancel_commits_in_batches_of_the_configured_size(
        api, client, producer, admin, pending_at_each_commit):
    ids = [api.enqueue(producer).json["id"] for _ in range(25)]
    # The count before the bulk, as a commit would have read it: a plain enqueue is one
    # statement, committed on PostgreSQL without a COMMIT of its own.
    pending_at_each_commit.append(len(ids))
    commits_before = len(pending_at_each_commit)

    assert bulk(client, admin, "cancel", limit=25).json["ids"] == ids

    assert steps_since(pending_at_each_commit, commits_before) == [-10, -10, -5]


@pytest.mark.parametrize("app_config", [10], indirect=True, ids=["batch10"])
def test_a_purge_deletes_in_batches_of_the_configured_size(
        app, api, client, producer, admin, clock, jobs_at_each_commit):
    for _ in range(25):
        cancelled(api, producer, admin)
    clock.advance(3 * 86_400)
    commits_before = len(jobs_at_each_commit)

    assert app.extensions["queuelog"].jobs.purge(older_than_seconds=86_400) == 25

    assert steps_since(jobs_at_each_commit, commits_before) == [-10, -10, -5]
