"""Ordered and fair keys are each producer's own, as idempotency and unique keys are, on both
engines: another producer's jobs under the same key string neither hold, delay nor block
yours, a producer with thousands of keys takes one turn among the producers, explain names
no other producer's job, and an admin's "key_scope": "shared" makes a type's keys one key
for every producer again (docs/FLOW-CONTROL.md)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from tests.conftest import Api, Key

YEAR = 365 * 24 * 3600


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    return {**app_config, "TYPE_COUNTS_MAX_AGE_SECONDS": 0}


@pytest.fixture
def mine(make_key: Any) -> Key:
    return make_key("shop-a", "producer")


@pytest.fixture
def theirs(make_key: Any) -> Key:
    return make_key("shop-b", "producer")


def patch(api: Api, admin: Key, **body: Any) -> dict[str, Any]:
    response = api.client.patch("/types/email", json=body, headers=admin.headers)
    assert response.status_code == 200, response.json
    return dict(response.json)


def enqueue(api: Api, producer: Key, **body: Any) -> int:
    response = api.enqueue(producer, type="email", **body)
    assert response.status_code == 201, response.json
    return int(response.json["id"])


def batch(api: Api, producer: Key, jobs: list[dict[str, Any]]) -> list[int]:
    ids: list[int] = []
    for start in range(0, len(jobs), 1000):
        response = api.client.post("/jobs/batch", json={"jobs": jobs[start:start + 1000]},
                                   headers=producer.headers)
        assert response.status_code in (200, 201), response.json
        ids += [job["id"] for job in response.json["jobs"]]
    return ids


def past_small_ids(api: Api, producer: Key) -> None:
    """Jobs of another type first: the ids under test are then no small numbers that any
    count or round in an answer could spell."""
    batch(api, producer, [{"type": "pdf"}] * 1000)


def claimed(api: Api, worker: Key) -> int | None:
    response = api.claim(worker, types=["email"])
    if response.status_code == 204:
        return None
    assert response.status_code == 200, response.json
    return int(response.json["id"])


def status(api: Api, admin: Key, job_id: int) -> str:
    return str(api.get(admin, job_id).json["status"])


# -- ordered keys ---------------------------------------------------------------------------


def test_another_producers_delayed_job_under_my_key_does_not_hold_mine(
        api, mine, theirs, worker, admin):
    patch(api, admin, ordering="key")
    held_a_year = enqueue(api, theirs, concurrency_key="cust-1", delay_seconds=YEAR)
    their_next = enqueue(api, theirs, concurrency_key="cust-1")
    first, second = (enqueue(api, mine, concurrency_key="cust-1") for _ in range(2))

    assert status(api, admin, first) == "pending" and status(api, admin, second) == "waiting"
    assert claimed(api, worker) == first
    assert api.complete(worker, first).status_code == 200
    assert claimed(api, worker) == second
    # Theirs still waits for their own delayed job, whose turn their key keeps.
    assert status(api, admin, their_next) == "waiting"
    assert status(api, admin, held_a_year) == "pending"
    assert claimed(api, worker) is None


def test_another_producers_blocking_failure_under_my_key_does_not_block_mine(
        api, mine, theirs, worker, admin):
    patch(api, admin, ordering="key", on_failure="block")
    failing = enqueue(api, theirs, concurrency_key="cust-1", max_retries=0)
    assert claimed(api, worker) == failing
    assert api.fail(worker, failing).status_code == 200
    blocked_behind = enqueue(api, theirs, concurrency_key="cust-1")
    own = enqueue(api, mine, concurrency_key="cust-1")

    assert claimed(api, worker) == own
    assert status(api, admin, blocked_behind) == "waiting"
    assert patch(api, admin)["blocked_keys"] == 1
    # Their failure is an admin's to lift; it lifts their key alone.
    assert api.retry(admin, failing).status_code == 200
    assert claimed(api, worker) == failing


def test_a_producer_cannot_cancel_or_see_another_producers_job_of_its_key(
        api, mine, theirs, admin):
    patch(api, admin, ordering="key")
    their_job = enqueue(api, theirs, concurrency_key="cust-1", delay_seconds=YEAR)
    own = enqueue(api, mine, concurrency_key="cust-1")
    assert api.cancel(mine, their_job).status_code == 404
    assert api.get(mine, their_job).status_code == 404
    assert status(api, admin, own) == "pending"


def test_a_workflow_of_another_producer_cannot_wedge_my_key(api, mine, theirs, worker, admin):
    patch(api, admin, ordering="key")
    response = api.client.post("/workflows", json={"jobs": [
        {"ref": "report", "type": "email", "concurrency_key": "cust-1",
         "depends_on": ["data"], "delay_seconds": YEAR},
        {"ref": "data", "type": "email", "concurrency_key": "cust-1", "delay_seconds": YEAR}]},
        headers=theirs.headers)
    assert response.status_code == 201, response.json
    own = enqueue(api, mine, concurrency_key="cust-1")
    assert claimed(api, worker) == own


# -- fair share -----------------------------------------------------------------------------


def test_a_producer_with_thousands_of_keys_does_not_push_my_jobs_behind_them(
        api, mine, theirs, worker, admin):
    patch(api, admin, fairness="key")
    theirs_ids = set(batch(api, theirs, [{"type": "email", "concurrency_key": f"t-{n}"}
                                         for n in range(5000)]))
    own = batch(api, mine, [{"type": "email", "concurrency_key": "mine"}] * 7
                + [{"type": "email", "concurrency_key": "also-mine"}] * 3)

    order = [claimed(api, worker) for _ in range(20)]

    assert set(own) <= set(order)
    # One producer's turn, then the other's: never two of theirs in a row.
    assert all(not (a in theirs_ids and b in theirs_ids)
               for a, b in itertools.pairwise(order))
    # Within my turns, my two keys take turns too: also-mine's 3 run among my first 6.
    mine_in_order = [job_id for job_id in order if job_id in set(own)]
    assert set(own[7:]) <= set(mine_in_order[:6])


def test_a_new_key_of_a_producer_waits_for_one_job_of_its_other_keys_not_their_backlog(
        api, mine, theirs, worker, admin):
    patch(api, admin, fairness="key")
    batch(api, mine, [{"type": "email", "concurrency_key": "big"}] * 300)
    batch(api, theirs, [{"type": "email", "concurrency_key": "big"}] * 300)
    late = enqueue(api, mine, concurrency_key="small")

    order = [claimed(api, worker) for _ in range(6)]

    assert late in order


def test_fair_share_explains_another_producers_jobs_without_naming_them(
        api, mine, theirs, admin):
    patch(api, admin, fairness="key")
    past_small_ids(api, theirs)
    their_ids = batch(api, theirs, [{"type": "email", "concurrency_key": f"secret-{n}"}
                                    for n in range(5)])
    batch(api, mine, [{"type": "email", "concurrency_key": "mine"}] * 5)
    last = enqueue(api, mine, concurrency_key="mine")

    reason = next(r for r in api.explain(mine, last)["reasons"] if r["code"] == "fair_share")
    told = json.dumps(reason)
    assert "secret" not in told and reason["keys_ahead"] == ["mine"]
    assert reason["of_other_producers"] >= 1
    assert not any(str(job_id) in told for job_id in their_ids)
    # An admin sees every key.
    seen = next(r for r in api.explain(admin, last)["reasons"] if r["code"] == "fair_share")
    assert "secret-0" in seen["keys_ahead"]


# -- shared keys ----------------------------------------------------------------------------


def test_shared_keys_hold_every_producers_jobs_in_one_order_and_explain_names_none(
        api, mine, theirs, worker, admin):
    shown = patch(api, admin, ordering="key", key_scope="shared")
    assert shown["key_scope"] == "shared"
    past_small_ids(api, theirs)
    their_job = enqueue(api, theirs, concurrency_key="cust-1", delay_seconds=YEAR)
    own = enqueue(api, mine, concurrency_key="cust-1")

    assert status(api, admin, own) == "waiting"
    assert claimed(api, worker) is None
    answer = api.explain(mine, own)
    reason = answer["reasons"][0]
    assert reason["code"] == "key_turn" and reason["job_id"] is None
    assert str(their_job) not in json.dumps(answer)
    # The admin is told which job holds the key.
    assert api.explain(admin, own)["reasons"][0]["job_id"] == their_job


def test_turning_shared_keys_on_and_off_moves_the_stored_jobs(api, mine, theirs, worker, admin):
    patch(api, admin, ordering="key", on_failure="block")
    their_job = enqueue(api, theirs, concurrency_key="cust-1", delay_seconds=YEAR)
    own = enqueue(api, mine, concurrency_key="cust-1")
    assert status(api, admin, own) == "pending"

    patch(api, admin, key_scope="shared")
    assert status(api, admin, own) == "waiting"  # behind the older job of the one key
    assert claimed(api, worker) is None

    assert patch(api, admin, key_scope="producer")["key_scope"] == "producer"
    assert status(api, admin, own) == "pending"
    assert status(api, admin, their_job) == "pending"
    assert claimed(api, worker) == own


def test_shared_fair_keys_are_one_key_across_producers(api, mine, theirs, worker, admin):
    patch(api, admin, fairness="key", key_scope="shared")
    theirs_ids = batch(api, theirs, [{"type": "email", "concurrency_key": f"t-{n}"}
                                     for n in range(50)])
    own = batch(api, mine, [{"type": "email", "concurrency_key": "t-0"}] * 2)

    order = [claimed(api, worker) for _ in range(52)]

    # As every earlier release did: t-0 is one key, so my jobs follow theirs of t-0.
    assert order[:50] == theirs_ids and order[50:] == own


def test_patch_refuses_an_unknown_key_scope(api, admin):
    response = api.client.patch("/types/email", json={"key_scope": "everyone"},
                                headers=admin.headers)
    assert response.status_code == 422
    assert response.headers["Content-Type"].startswith("application/problem+json")
    assert api.client.get("/types", headers=admin.headers).json["types"][0]["key_scope"] \
        == "producer"


def test_the_cli_sets_and_shows_the_key_scope(runner, client, admin):
    result = runner.invoke(args=["types", "set", "email", "--ordering", "key",
                                 "--key-scope", "shared"])
    assert result.exit_code == 0, result.output
    assert "key_scope=shared" in result.output
    assert client.get("/types/email", headers=admin.headers).json["key_scope"] == "shared"
    result = runner.invoke(args=["types", "set", "email", "--key-scope", "producer"])
    assert "key_scope=producer" in result.output
    bad = runner.invoke(args=["types", "set", "email", "--key-scope", "everyone"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
