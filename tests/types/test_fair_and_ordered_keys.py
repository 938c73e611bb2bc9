"""Fair share and ordered keys (contract §16) through the API, on both engines: the claim order
fairness gives, the one-at-a-time order of an ordered key through retries, delays, blocks,
cancels and mode changes, and what explain says."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest

from tests.conftest import Api, Key
from tests.ops.test_metrics import scrape


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    return {**app_config, "TYPE_COUNTS_MAX_AGE_SECONDS": 0}


@pytest.fixture
def producer(make_key: Any) -> Key:
    return make_key("producer-1", "producer", max_priority=20)


def patch(api: Api, admin: Key, job_type: str = "email", **body: Any) -> Any:
    response = api.client.patch(f"/types/{job_type}", json=body, headers=admin.headers)
    assert response.status_code == 200, response.json
    return response.json


def batch(api: Api, producer: Key, jobs: list[dict[str, Any]]) -> list[int]:
    ids: list[int] = []
    for start in range(0, len(jobs), 1000):
        response = api.client.post("/jobs/batch", json={"jobs": jobs[start:start + 1000]},
                                   headers=producer.headers)
        assert response.status_code in (200, 201), response.json
        ids += [job["id"] for job in response.json["jobs"]]
    return ids


def claim_key(api: Api, worker: Key, **body: Any) -> tuple[int, str | None] | None:
    response = api.claim(worker, **body)
    if response.status_code == 204:
        return None
    assert response.status_code == 200, response.json
    return response.json["id"], response.json.get("concurrency_key")


def explain(api: Api, admin: Key, job_id: int) -> dict[str, Any]:
    return api.explain(admin, job_id)


# -- fair share --------------------------------------------------------------------------------

KEYS_AFTER = [chr(c) for c in range(ord("B"), ord("K") + 1)]  # B … K


def _noisy_then_quiet(api: Api, producer: Key, noisy: int) -> None:
    batch(api, producer, [{"type": "email", "concurrency_key": "A"}] * noisy)
    batch(api, producer, [{"type": "email", "concurrency_key": key}
                          for _ in range(10) for key in KEYS_AFTER])


def test_with_fairness_every_key_takes_turns_however_large_the_first_keys_backlog(
        api, producer, worker, admin):
    patch(api, admin, fairness="key")
    # A backlog two hundred times the claims made: the turns do not depend on its size
    # (a claim's cost at larger ones is bench/keys.py's to measure).
    _noisy_then_quiet(api, producer, noisy=20_000)

    served = [claim_key(api, worker) for _ in range(110)]
    keys = [claimed[1] for claimed in served if claimed is not None]

    # Keys one producer adds behind its own backlog start one round apart (FLOW-CONTROL.md):
    # K, the tenth, waits for ten of A's jobs and one of each of B to J; all in 66 claims.
    assert set(keys[:66]) == {"A", *KEYS_AFTER}
    assert all(count >= 7 for count in Counter(keys).values())
    # Between two turns of a key, every other key has at most one job.
    for key in ["A", *KEYS_AFTER]:
        turns = [n for n, k in enumerate(keys) if k == key]
        for before, after in itertools.pairwise(turns):
            assert all(count <= 1 for count in Counter(keys[before + 1:after]).values())


def test_without_fairness_the_claim_order_is_exactly_claim_order(api, producer, worker):
    _noisy_then_quiet(api, producer, noisy=200)
    keys = [claim_key(api, worker)[1] for _ in range(110)]  # type: ignore[index]
    assert keys == ["A"] * 110


def test_fairness_keeps_priorities_first_and_jobs_without_a_key_are_one_key(
        api, producer, worker, admin):
    patch(api, admin, fairness="key")
    batch(api, producer, [{"type": "email", "concurrency_key": "A"}] * 3
          + [{"type": "email"}] * 3 + [{"type": "email", "concurrency_key": "B",
                                        "priority": "high"}])
    keys = [claim_key(api, worker)[1] for _ in range(7)]  # type: ignore[index]
    assert keys == ["B", "A", None, "A", None, "A", None]


def test_turning_fairness_on_numbers_the_backlog_already_stored(api, producer, worker, admin):
    _noisy_then_quiet(api, producer, noisy=300)
    patch(api, admin, fairness="key")
    keys = [claim_key(api, worker)[1] for _ in range(11)]  # type: ignore[index]
    assert sorted(keys) == sorted(["A", *KEYS_AFTER])
    # And off again: claim order, A's backlog first.
    patch(api, admin, fairness=None)
    assert claim_key(api, worker)[1] == "A"  # type: ignore[index]


def test_a_job_waiting_for_its_fair_turn_is_explained_with_the_keys_ahead(
        api, producer, admin):
    patch(api, admin, fairness="key")
    batch(api, producer, [{"type": "email", "concurrency_key": "A"}] * 5)
    late = api.enqueue(producer, type="email", concurrency_key="B").json["id"]
    behind = batch(api, producer, [{"type": "email", "concurrency_key": "B"}])[0]

    assert [r["code"] for r in explain(api, admin, late)["reasons"]][:1] != ["fair_share"] or \
        explain(api, admin, late)["reasons"][0]["keys_ahead"] == ["A"]
    reason = next(r for r in explain(api, admin, behind)["reasons"] if r["code"] == "fair_share")
    assert set(reason["keys_ahead"]) == {"A", "B"} and reason["count"] == 3


def test_fairness_combines_with_a_per_key_cap_without_blocking_other_keys(
        api, producer, worker, admin):
    patch(api, admin, fairness="key", max_running_per_key=1)
    batch(api, producer, [{"type": "email", "concurrency_key": "A"}] * 5
          + [{"type": "email", "concurrency_key": "B"}] * 5)
    first = [claim_key(api, worker) for _ in range(3)]
    assert [c[1] for c in first if c] == ["A", "B"] and first[2] is None


# -- ordered keys ------------------------------------------------------------------------------

def test_an_ordered_key_runs_one_job_at_a_time_in_enqueue_order(api, producer, worker, admin):
    patch(api, admin, ordering="key")
    ids = [api.enqueue(producer, type="email", concurrency_key="acct-1",
                       priority="low" if n == 0 else "high").json["id"] for n in range(3)]
    other = api.enqueue(producer, type="email", concurrency_key="acct-2").json["id"]
    assert [api.get(admin, i).json["status"] for i in ids] == ["pending", "waiting", "waiting"]

    # Priority does not reorder a key (ids[1] and ids[2] are high); another key (medium, so
    # claimed first) is not held back.
    assert claim_key(api, worker) == (other, "acct-2")
    assert claim_key(api, worker) == (ids[0], "acct-1")
    assert claim_key(api, worker) is None
    reason = explain(api, admin, ids[1])["reasons"][0]
    assert (reason["code"], reason["job_id"]) == ("key_turn", ids[0])

    api.complete(worker, ids[0])
    assert claim_key(api, worker) == (ids[1], "acct-1")
    api.complete(worker, ids[1])
    assert claim_key(api, worker) == (ids[2], "acct-1")


def test_a_retry_and_its_backoff_hold_the_key_back(api, producer, worker, admin, clock):
    patch(api, admin, ordering="key")
    first = api.enqueue(producer, type="email", concurrency_key="k", max_retries=2).json["id"]
    second = api.enqueue(producer, type="email", concurrency_key="k").json["id"]
    assert claim_key(api, worker) == (first, "k")
    api.fail(worker, first, retry_in_seconds=30)
    assert claim_key(api, worker) is None  # first waits out its backoff; second waits for it
    clock.advance(31)
    assert claim_key(api, worker) == (first, "k")
    api.complete(worker, first)
    assert claim_key(api, worker) == (second, "k")


def test_a_delayed_job_holds_its_key_back_until_it_is_due(api, producer, worker, admin, clock):
    patch(api, admin, ordering="key")
    first = api.enqueue(producer, type="email", concurrency_key="k", delay_seconds=60).json["id"]
    api.enqueue(producer, type="email", concurrency_key="k")
    assert claim_key(api, worker) is None
    clock.advance(61)
    assert claim_key(api, worker) == (first, "k")


def test_skip_runs_the_next_job_after_a_failure(api, producer, worker, admin):
    patch(api, admin, ordering="key")
    first = api.enqueue(producer, type="email", concurrency_key="k", max_retries=0).json["id"]
    second = api.enqueue(producer, type="email", concurrency_key="k").json["id"]
    claim_key(api, worker)
    api.fail(worker, first)
    assert claim_key(api, worker) == (second, "k")


def test_block_stops_the_key_until_the_failure_is_retried(api, producer, worker, admin):
    patch(api, admin, ordering="key", on_failure="block")
    first = api.enqueue(producer, type="email", concurrency_key="k", max_retries=0).json["id"]
    second = api.enqueue(producer, type="email", concurrency_key="k").json["id"]
    other = api.enqueue(producer, type="email", concurrency_key="other").json["id"]
    claim_key(api, worker)
    api.fail(worker, first)

    assert claim_key(api, worker) == (other, "other")  # the other key goes on
    assert claim_key(api, worker) is None
    reason = explain(api, admin, second)["reasons"][0]
    assert (reason["code"], reason["job_id"]) == ("key_blocked", first)
    assert explain(api, admin, first)["reasons"][1]["code"] == "key_blocked"
    assert patch(api, admin)["blocked_keys"] == 1
    metrics = scrape(api.client, admin)
    assert metrics.value("queuelog_type_blocked_keys", type="email") == 1
    assert metrics.value("queuelog_type_blocked_keys", type="pdf") == 0

    assert api.retry(admin, first).status_code == 200
    assert claim_key(api, worker) == (first, "k")
    api.complete(worker, first)
    assert claim_key(api, worker) == (second, "k")
    assert scrape(api.client, admin).value("queuelog_type_blocked_keys", type="email") == 0


def test_block_stops_the_key_until_the_failure_is_cancelled(api, producer, worker, admin):
    patch(api, admin, ordering="key", on_failure="block")
    first = api.enqueue(producer, type="email", concurrency_key="k", max_retries=0).json["id"]
    second = api.enqueue(producer, type="email", concurrency_key="k").json["id"]
    claim_key(api, worker)
    api.fail(worker, first)
    assert claim_key(api, worker) is None

    cancelled = api.cancel(admin, first)
    assert cancelled.status_code == 200 and cancelled.json["status"] == "cancelled"
    assert claim_key(api, worker) == (second, "k")
    # A failed job that blocks no key still cannot be cancelled.
    loose = api.enqueue(producer, type="pdf", concurrency_key="k", max_retries=0).json["id"]
    assert claim_key(api, worker, types=["pdf"]) == (loose, "k")
    api.fail(worker, loose)
    assert api.cancel(admin, loose).status_code == 409


def test_cancelling_the_job_whose_turn_it_is_passes_the_turn(api, producer, worker, admin):
    patch(api, admin, ordering="key")
    first = api.enqueue(producer, type="email", concurrency_key="k").json["id"]
    second = api.enqueue(producer, type="email", concurrency_key="k").json["id"]
    third = api.enqueue(producer, type="email", concurrency_key="k").json["id"]
    assert api.cancel(admin, second).status_code == 200  # a held job: nothing moves
    assert api.cancel(admin, first).status_code == 200
    assert claim_key(api, worker) == (third, "k")


def test_a_lease_rescue_keeps_the_turn(api, producer, worker, admin, clock):
    patch(api, admin, ordering="key")
    first = api.enqueue(producer, type="email", concurrency_key="k").json["id"]
    api.enqueue(producer, type="email", concurrency_key="k")
    assert claim_key(api, worker, lease_seconds=10) == (first, "k")
    clock.advance(11)
    assert claim_key(api, worker) == (first, "k")


def test_turning_ordering_on_and_off_holds_and_releases_the_backlog(
        api, producer, worker, admin):
    ids = [api.enqueue(producer, type="email", concurrency_key="k").json["id"]
           for _ in range(3)]
    patch(api, admin, ordering="key")
    assert [api.get(admin, i).json["status"] for i in ids] == ["pending", "waiting", "waiting"]
    patch(api, admin, ordering=None)
    assert [api.get(admin, i).json["status"] for i in ids] == ["pending"] * 3
    claimed = api.client.post("/jobs/claim-many", json={"max_jobs": 3}, headers=worker.headers)
    assert len(claimed.json["jobs"]) == 3, claimed.json


def test_switching_block_to_skip_lets_blocked_keys_go_on(api, producer, worker, admin):
    patch(api, admin, ordering="key", on_failure="block")
    first = api.enqueue(producer, type="email", concurrency_key="k", max_retries=0).json["id"]
    second = api.enqueue(producer, type="email", concurrency_key="k").json["id"]
    claim_key(api, worker)
    api.fail(worker, first)
    patch(api, admin, on_failure="skip")
    assert claim_key(api, worker) == (second, "k")


def test_ordering_and_fairness_together(api, producer, worker, admin):
    patch(api, admin, ordering="key", fairness="key")
    batch(api, producer, [{"type": "email", "concurrency_key": "A"}] * 50
          + [{"type": "email", "concurrency_key": "B"}] * 2)
    first = claim_key(api, worker)
    second = claim_key(api, worker)
    assert {first[1], second[1]} == {"A", "B"}  # type: ignore[index]
    assert claim_key(api, worker) is None  # each key runs one at a time


def test_a_dependency_and_the_key_order_both_hold_a_job(api, producer, worker, admin):
    patch(api, admin, ordering="key")
    gate = api.enqueue(producer, type="pdf").json["id"]
    first = api.enqueue(producer, type="email", concurrency_key="k",
                        depends_on=[gate]).json["id"]
    second = api.enqueue(producer, type="email", concurrency_key="k").json["id"]
    assert claim_key(api, worker, types=["email"]) is None
    assert claim_key(api, worker, types=["pdf"]) == (gate, None)
    api.complete(worker, gate)
    assert claim_key(api, worker, types=["email"]) == (first, "k")
    api.complete(worker, first)
    assert claim_key(api, worker, types=["email"]) == (second, "k")


def test_patch_refuses_unknown_modes(api, admin):
    for body in ({"fairness": "tenant"}, {"ordering": True}, {"on_failure": "stop"}):
        response = api.client.patch("/types/email", json=body, headers=admin.headers)
        assert response.status_code == 422
        assert next(iter(body)) in response.json["errors"]


def test_a_retried_failure_whose_key_went_on_waits_for_the_turn_again(
        api, producer, worker, admin):
    patch(api, admin, ordering="key")  # on_failure skip: the key went on without it
    first = api.enqueue(producer, type="email", concurrency_key="k", max_retries=0).json["id"]
    second = api.enqueue(producer, type="email", concurrency_key="k").json["id"]
    claim_key(api, worker)
    api.fail(worker, first)
    assert claim_key(api, worker) == (second, "k")

    retried = api.retry(admin, first)
    assert retried.status_code == 200 and retried.json["status"] == "waiting"
    assert claim_key(api, worker) is None  # never two jobs of one key at once
    api.complete(worker, second)
    assert claim_key(api, worker) == (first, "k")


def test_a_keys_delayed_jobs_take_turns_when_they_come_due_not_when_enqueued(
        api, producer, worker, admin, clock):
    patch(api, admin, fairness="key")
    batch(api, producer, [{"type": "email", "concurrency_key": "A"}] * 60)
    batch(api, producer, [{"type": "email", "concurrency_key": "B", "delay_seconds": 60}] * 20)
    assert [claim_key(api, worker)[1] for _ in range(30)] == ["A"] * 30  # type: ignore[index]

    clock.advance(61)
    keys = [claim_key(api, worker)[1] for _ in range(20)]  # type: ignore[index]
    # B's twenty did not jump A's queue in one burst: they alternate from the round served.
    assert keys == ["A", "B"] * 10 or keys == ["B", "A"] * 10, keys


def test_a_bulk_cancel_of_the_turns_job_passes_the_turn(api, producer, worker, admin):
    patch(api, admin, ordering="key")
    first = api.enqueue(producer, type="email", concurrency_key="k").json["id"]
    second = api.enqueue(producer, type="email", concurrency_key="k").json["id"]
    response = api.client.post("/jobs/cancel-many", json={"ids": [first]},
                               headers=admin.headers)
    assert response.status_code == 200 and response.json["ids"] == [first]
    assert claim_key(api, worker) == (second, "k")


def test_a_dependencys_failure_cancelling_the_turns_job_passes_the_turn(
        api, producer, worker, admin):
    patch(api, admin, ordering="key")
    gate = api.enqueue(producer, type="pdf", max_retries=0).json["id"]
    first = api.enqueue(producer, type="email", concurrency_key="k",
                        depends_on=[gate]).json["id"]
    second = api.enqueue(producer, type="email", concurrency_key="k").json["id"]
    assert claim_key(api, worker, types=["pdf"]) == (gate, None)
    api.fail(worker, gate)
    assert api.get(admin, first).json["status"] == "cancelled"
    assert claim_key(api, worker, types=["email"]) == (second, "k")


def test_a_schedules_jobs_of_an_ordered_key_wait_for_their_turn(api, admin, worker, clock):
    patch(api, admin, ordering="key")
    created = api.client.post("/schedules", json={
        "name": "tick", "cron": "* * * * *", "catch_up": "all",
        "job": {"type": "email", "concurrency_key": "k"}}, headers=admin.headers)
    assert created.status_code == 201, created.json
    clock.advance(180)
    assert api.client.application.extensions["queuelog"].schedules.fire_due() >= 2
    made = sorted(job["id"] for job in api.list(admin, type="email").json["jobs"])
    assert [api.get(admin, i).json["status"] for i in made][:2] == ["pending", "waiting"]
    assert claim_key(api, worker) == (made[0], "k")
    assert claim_key(api, worker) is None


def _nested(depth: int) -> Any:
    value: Any = {}
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("body", [
    {"fairness": "\uff4b\uff45\uff59"},  # "key" in fullwidth letters
    {"ordering": "KEY"},
    {"on_failure": "\u0660"},  # an Arabic-Indic digit zero
    {"fairness": 10 ** 400},
    {"ordering": _nested(100)},
    {"fairness": "key", "tenant_field": 1},
])
def test_hostile_mode_bodies_are_422s_that_change_nothing(api, admin, body):
    response = api.client.patch("/types/email", json=body, headers=admin.headers)
    assert response.status_code == 422, response.json
    shown = api.client.get("/types/email", headers=admin.headers).json
    assert (shown["fairness"], shown["ordering"], shown["on_failure"]) == (None, None, "skip")


def test_a_revoked_key_changes_no_mode(api, make_key, producer, worker):
    doomed = make_key("admin-2", "admin")
    api.client.application.extensions["queuelog"].keys.revoke_key("admin-2")
    response = api.client.patch("/types/email", json={"ordering": "key"},
                                headers=doomed.headers)
    assert response.status_code == 401
    first = api.enqueue(producer, type="email", concurrency_key="k").json["id"]
    second = api.enqueue(producer, type="email", concurrency_key="k").json["id"]
    claimed = {claim_key(api, worker), claim_key(api, worker)}  # unordered: both at once
    assert claimed == {(first, "k"), (second, "k")}
