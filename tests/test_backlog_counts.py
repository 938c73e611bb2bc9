"""Counting the backlog never costs a request what the backlog holds:
explain's jobs ahead are read up to QUEUELOG_EXPLAIN_AHEAD_LIMIT and say when they stopped;
GET /types, the dashboard and /metrics share one per-process snapshot of the counts; the
reads that count take a budget of their own (QUEUELOG_COUNTING_READS), so that a flood of
them answers 503 while enqueues and claims keep their connections; and a producer's explain
names no worker key. Both engines, through the test client (a small limit, not a million)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from app import create_app
from app.core.callers import Role
from tests.conftest import Api, Key

LIMIT = 5


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    return {**app_config, "EXPLAIN_AHEAD_LIMIT": LIMIT, "COUNTING_READS": 1,
            "TYPE_COUNTS_MAX_AGE_SECONDS": 0}


def explain(client: Any, key: Key, job_id: int) -> dict[str, Any]:
    return Api(client).explain(key, job_id)


def jobs_ahead(client: Any, key: Key, job_id: int) -> dict[str, Any]:
    [reason] = [r for r in explain(client, key, job_id)["reasons"] if r["code"] == "jobs_ahead"]
    return reason


def test_jobs_ahead_is_exact_up_to_the_limit_and_says_capped_past_it(api, client, producer,
                                                                     worker, admin):
    api.claim(worker)  # a live worker, so that jobs_ahead stands alone
    for _ in range(4):
        api.enqueue(producer, type="email", priority="medium")
    job_id = api.enqueue(producer, type="email", priority="medium").json["id"]
    api.enqueue(admin, type="pdf", priority="critical")
    api.enqueue(producer, type="email", priority="low")  # behind: never counted
    api.enqueue(admin, type="email", priority="high", delay_seconds=60)  # not due

    # Five due ahead (one of another type), one scheduled: six pending rows read, past the
    # limit of five, so the count stopped there and says so.
    reason = jobs_ahead(client, admin, job_id)
    assert (reason["count"], reason["count_capped"]) == (5, True)
    assert (reason["of_its_type"], reason["of_its_type_capped"]) == (4, False)
    assert reason["message"].startswith("at least 5 claimable job(s) come before it")
    assert "(4 of type email)" in reason["message"]

    cancelled = client.post("/jobs/cancel-many", headers=admin.headers,
                            json={"ids": [job_id + 3]})
    assert cancelled.json["count"] == 1, cancelled.json
    # Without the scheduled one: five ahead, exactly the limit, counted exactly.
    reason = jobs_ahead(client, admin, job_id)
    assert (reason["count"], reason["count_capped"]) == (5, False)
    assert reason["message"].startswith("5 claimable job(s) come before it")

    for _ in range(2):
        api.enqueue(admin, type="email", priority="high")
    reason = jobs_ahead(client, producer, job_id)
    assert (reason["count"], reason["count_capped"]) == (5, True)
    assert (reason["of_its_type"], reason["of_its_type_capped"]) == (5, True)


def test_a_producers_explain_names_no_worker_key(api, client, app, clock, producer, worker,
                                                 make_key, admin):
    make_key("billing-box-7", "worker", types=["email"])
    make_key("pdf-renderer", "worker", types=["pdf"])
    api.claim(worker)
    clock.advance(301)  # idle for five minutes: no_worker_for_type, which names the keys
    email = api.enqueue(producer, type="email").json["id"]
    names = ["worker-1", "billing-box-7", "pdf-renderer"]

    shown = explain(client, producer, email)
    assert [r["code"] for r in shown["reasons"]] == ["no_worker_for_type"]
    assert "last_claim_at" in shown["reasons"][0]
    assert not any(name in json.dumps(shown) for name in names), shown
    # An admin is still told which keys may claim the type.
    [reason] = explain(client, admin, email)["reasons"]
    assert reason["workers"] == ["billing-box-7", "worker-1"]

    # No live key for the type at all: the same, without names.
    app.extensions["queuelog"].keys.revoke_key("worker-1")
    app.extensions["queuelog"].keys.revoke_key("billing-box-7")
    shown = explain(client, producer, email)
    assert shown["reasons"][0]["code"] == "no_worker_for_type"
    assert not any(name in json.dumps(shown) for name in names), shown
    assert explain(client, admin, email)["reasons"][0]["workers"] == []


def test_a_full_counting_budget_answers_503_while_enqueues_and_claims_go_on(
        api, client, app, producer, worker, admin):
    job_id = api.enqueue(producer).json["id"]
    services = app.extensions["queuelog"]
    with services.db.counting_read():  # the one slot, held as a slow count would hold it
        for path, key in ((f"/jobs/{job_id}/explain", producer), ("/types", admin),
                          ("/types/email", admin), ("/metrics", admin)):
            answer = client.get(path, headers=key.headers)
            assert answer.status_code == 503, (path, answer.data[:300])
            assert answer.headers["Retry-After"] == "1"
            assert answer.mimetype == "application/problem+json"
            assert answer.json["status"] == 503
        assert api.enqueue(producer).status_code == 201
        assert api.claim(worker).status_code == 200
        assert api.get(producer, job_id).status_code == 200
        assert client.get("/healthz").status_code == 200
    # The slot given back, the same reads answer again.
    assert client.get(f"/jobs/{job_id}/explain", headers=producer.headers).status_code == 200
    assert client.get("/types", headers=admin.headers).status_code == 200


@pytest.fixture
def served(app_config: dict[str, Any], request: pytest.FixtureRequest) -> Any:
    """An app whose counts may be `request.param` seconds old, and an admin's and a
    producer's headers on it."""
    app = create_app({**app_config, "TYPE_COUNTS_MAX_AGE_SECONDS": request.param})
    keys = app.extensions["queuelog"].keys
    admin = {"Authorization": f"Bearer {keys.create_key('admin-1', Role.ADMIN)}"}
    producer = {"Authorization": f"Bearer {keys.create_key('producer-1', Role.PRODUCER)}"}
    yield app.test_client(), admin, producer
    app.extensions["queuelog"].db.engine.dispose()


def pending(client: Any, admin: dict[str, str]) -> tuple[int, float]:
    """(email's pending count in GET /types, and in /metrics' queuelog_jobs)."""
    types = client.get("/types/email", headers=admin)
    assert types.status_code == 200, types.json
    metrics = client.get("/metrics", headers=admin).get_data(as_text=True)
    [line] = [line for line in metrics.splitlines()
              if line.startswith('queuelog_jobs{status="pending",type="email"}')]
    return types.json["counts"]["pending"], float(line.split()[-1])


@pytest.mark.parametrize("served", [3600], indirect=True)
def test_types_and_metrics_read_one_snapshot_of_the_counts(served):
    client, admin, producer = served
    client.post("/jobs", json={"type": "email"}, headers=producer)
    assert pending(client, admin) == (1, 1.0)
    client.post("/jobs", json={"type": "email"}, headers=producer)
    # Within the max age neither counts again: both show the one snapshot.
    assert pending(client, admin) == (1, 1.0)


@pytest.mark.parametrize("served", [0.05], indirect=True)
def test_a_stale_snapshot_is_counted_again_in_the_background(served):
    client, admin, producer = served
    assert pending(client, admin) == (0, 0.0)
    for _ in range(3):
        assert client.post("/jobs", json={"type": "email"}, headers=producer).status_code == 201
    deadline = time.monotonic() + 10
    while pending(client, admin) != (3, 3.0):
        assert time.monotonic() < deadline, "the counts were never refreshed"
        time.sleep(0.02)


def test_a_counting_budget_not_below_the_pool_is_warned_of():
    from app.config import configuration_warnings, load_settings

    settings = load_settings({"QUEUELOG_JOB_TYPES": "email"})
    assert configuration_warnings(settings) == []  # the defaults leave connections free
    settings = load_settings({"QUEUELOG_JOB_TYPES": "email", "QUEUELOG_COUNTING_READS": "5",
                              "QUEUELOG_DB_POOL_SIZE": "5"})
    [warning] = configuration_warnings(settings)
    assert "QUEUELOG_COUNTING_READS (5) is not below QUEUELOG_DB_POOL_SIZE (5)" in warning
