"""A type's retry budget (docs/FLOW-CONTROL.md, "Retry budget"): its rule as numbers, then
through the API on both engines with the clock moved by hand."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.clock import MICROS, parse_rfc3339
from app.types.protection.budget import RetryBudgetSettings, slot
from tests.conftest import Api, Key

WINDOW = 60 * MICROS


def _runs(settings: RetryBudgetSettings, firsts: int, backoffs: list[int],
          now: int = 0) -> list[int]:
    scheduled = None
    runs = []
    for backoff in backoffs:
        taken = slot(settings, firsts, scheduled, backoff, now)
        scheduled = taken.next_at
        runs.append(taken.run_at)
    return runs


def _most_in_a_window(runs: list[int]) -> int:
    return max(sum(1 for other in runs if start <= other < start + WINDOW) for start in runs)


def test_a_budget_spaces_its_retries_so_that_no_window_holds_more_than_it_allows():
    budget = RetryBudgetSettings(ratio=0.5, window_seconds=60, minimum=1)
    runs = _runs(budget, firsts=6, backoffs=[0] * 20)  # 0.5 x 6 + 1 = 4 per window
    assert runs[:4] == [0, 15 * MICROS, 30 * MICROS, 45 * MICROS]
    assert _most_in_a_window(runs) == 4
    assert runs == sorted(runs) and runs[-1] == 19 * 15 * MICROS  # none dropped


def test_a_retry_runs_at_its_backoff_when_the_budget_has_room():
    budget = RetryBudgetSettings(ratio=0.0, window_seconds=60, minimum=10)
    assert _runs(budget, 0, [5 * MICROS, 30 * MICROS]) == [5 * MICROS, 30 * MICROS]
    # A backoff over a window away runs at it and takes no slot from the nearer ones.
    far = slot(budget, 0, 10 * MICROS, 3600 * MICROS, 0)
    assert far.run_at == 3600 * MICROS and far.next_at == 10 * MICROS


def test_a_budget_of_no_retry_still_runs_one_a_window():
    budget = RetryBudgetSettings(ratio=0.0, window_seconds=60, minimum=0)
    assert _runs(budget, 100, [0, 0, 0]) == [0, WINDOW, 2 * WINDOW]


# -- through the API ------------------------------------------------------------------------


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    return {**app_config, "TYPE_COUNTS_MAX_AGE_SECONDS": 0}


def _fail_all(api: Api, worker: Key, count: int) -> list[int]:
    ids = []
    claimed = api.client.post("/jobs/claim-many", json={"types": ["email"], "max_jobs": count},
                              headers=worker.headers).json["jobs"]
    assert len(claimed) == count
    for job in claimed:  # all held first: a retry due at once is not claimed among them
        failed = api.fail(worker, job["id"], error="503 upstream", retry_in_seconds=0)
        assert failed.status_code == 200, failed.json
        assert failed.json["status"] == "pending"
        ids.append(job["id"])
    return ids


def test_retries_beyond_the_budget_run_later_never_dropped_and_explain_says_when(
        app, api, producer, worker, admin, clock):
    answer = api.client.patch("/types/email", headers=admin.headers, json={
        "retry_budget": {"ratio": 0, "window_seconds": 60, "minimum": 3}})
    assert answer.status_code == 200, answer.json
    assert answer.json["retry_budget"] == {"ratio": 0.0, "window_seconds": 60, "minimum": 3}
    for _ in range(7):
        api.enqueue(producer, max_retries=5)
    now = clock.now_us()
    ids = _fail_all(api, worker, 7)

    runs = {job_id: parse_rfc3339(api.get(admin, job_id).json["run_at"]) for job_id in ids}
    assert sorted(runs.values()) == [now + n * 20 * MICROS for n in range(7)]  # 3 a minute
    held = ids[1]
    reasons = api.explain(admin, held)["reasons"]
    assert [r["code"] for r in reasons[:2]] == ["scheduled", "retry_budget"]
    assert parse_rfc3339(reasons[1]["backoff_until"]) == now
    assert parse_rfc3339(reasons[1]["run_at"]) == runs[held]

    claimed_at: list[int] = []
    for _ in range(9):  # the retries come due on the budget's pace, each claimed once
        while (job := api.claim(worker, types=["email"])).status_code == 200:
            claimed_at.append(clock.now_us())
            assert api.complete(worker, job.json["id"]).status_code == 200
        clock.advance(20)
    assert len(claimed_at) == 7
    assert _most_in_a_window(claimed_at) <= 3


def test_first_attempts_raise_the_budget(app, api, producer, worker, admin, clock):
    api.client.patch("/types/email", headers=admin.headers, json={
        "retry_budget": {"ratio": 1, "window_seconds": 60, "minimum": 0}})
    for _ in range(4):
        api.enqueue(producer, max_retries=5)
    now = clock.now_us()
    ids = _fail_all(api, worker, 4)  # 4 first attempts in the window: 4 retries a minute
    runs = sorted(parse_rfc3339(api.get(admin, job_id).json["run_at"]) for job_id in ids)
    assert runs == [now + n * 15 * MICROS for n in range(4)]


def test_a_type_without_a_budget_retries_at_its_backoff(api, producer, worker, admin, clock):
    for _ in range(5):
        api.enqueue(producer, max_retries=5)
    now = clock.now_us()
    ids = _fail_all(api, worker, 5)
    assert {parse_rfc3339(api.get(admin, job_id).json["run_at"]) for job_id in ids} == {now}
    removed = api.client.patch("/types/email", headers=admin.headers,
                               json={"retry_budget": None})
    assert removed.json["retry_budget"] is None
    refused = api.client.patch("/types/email", headers=admin.headers,
                               json={"retry_budget": {"ratio": -1}})
    assert refused.status_code == 422 and "retry_budget.ratio" in refused.json["errors"]


def test_after_an_outage_of_a_thousand_failing_jobs_the_retries_drain_within_the_budget(
        app, api, producer, worker, admin, clock):
    budget = {"ratio": 0.2, "window_seconds": 60, "minimum": 10}
    api.client.patch("/types/email", headers=admin.headers, json={"retry_budget": budget})
    batch = api.client.post("/jobs/batch", headers=producer.headers, json={
        "jobs": [{"type": "email", "max_retries": 3} for _ in range(1000)]})
    assert batch.status_code == 201
    held = [job for _ in range(10) for job in api.client.post(
        "/jobs/claim-many", json={"types": ["email"], "max_jobs": 100},
        headers=worker.headers).json["jobs"]]
    assert len(held) == 1000
    for job in held:  # the outage: every first attempt fails
        assert api.fail(worker, job["id"], error="503", retry_in_seconds=0).status_code == 200
    ids = [job["id"] for job in held]
    allowed = int(0.2 * 1000 + 10)  # the window's 1,000 first attempts
    runs = sorted(parse_rfc3339(api.get(admin, job_id).json["run_at"]) for job_id in ids)
    assert _most_in_a_window(runs) <= allowed < len(runs)

    claimed_at: list[int] = []
    while len(claimed_at) < len(ids):  # the recovery: every retry completes, in its turn
        due = api.client.post("/jobs/claim-many", json={"types": ["email"], "max_jobs": 100},
                              headers=worker.headers).json["jobs"]
        for job in due:
            assert job["retry_count"] == 1
            claimed_at.append(clock.now_us())
            api.complete(worker, job["id"])
        if len(due) < 100:
            clock.advance(1)
    assert _most_in_a_window(claimed_at) <= allowed
    counts = api.client.get("/types/email", headers=admin.headers).json["counts"]
    assert counts["completed"] == 1000 and counts["failed"] == 0
