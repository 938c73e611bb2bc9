"""GET/PATCH /types and the limits each claim applies (contract section 9), through the test
client on both engines."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Api, Key


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    # Counted on every request here, so that a test sees what it just did.
    return {**app_config, "TYPE_COUNTS_MAX_AGE_SECONDS": 0}


def patch(client: Any, key: Key, job_type: str, **body: Any) -> Any:
    return client.patch(f"/types/{job_type}", json=body, headers=key.headers)


def claimed_ids(api: Api, key: Key, **body: Any) -> list[int]:
    response = api.client.post("/jobs/claim-many", json=body, headers=key.headers)
    assert response.status_code == 200, response.json
    return [job["id"] for job in response.json["jobs"]]


def test_a_type_never_changed_shows_the_defaults_and_its_counts(client, api, producer, worker,
                                                               admin, clock):
    first = api.enqueue(producer, type="email").json["id"]
    api.enqueue(producer, type="email", delay_seconds=60)
    api.enqueue(producer, type="email")
    clock.advance(2.5)
    claimed = api.claim(worker).json
    assert claimed["id"] == first
    api.complete(worker, first)
    api.enqueue(producer, type="pdf")

    response = client.get("/types/email", headers=admin.headers)

    assert response.status_code == 200
    assert response.json == {
        "type": "email", "paused": False, "max_running": None, "max_running_per_key": None,
        "rate_per_second": None, "burst": 1, "push": None,
        "fairness": None, "ordering": None, "on_failure": "skip", "key_scope": "producer",
        "circuit": None, "circuit_state": None, "retry_budget": None, "aging_seconds": None,
        "blocked_keys": 0,
        # Retention: the QUEUELOG_RETENTION_… defaults (7, 30 and 7 days).
        "retention": {"completed_seconds": 604_800, "failed_seconds": 2_592_000,
                      "cancelled_seconds": 604_800},
        "counts": {"reserved": 0, "waiting": 0, "pending": 2, "suspended": 0, "scheduled": 1,
                   "running": 0,
                   "completed": 1, "failed": 0, "cancelled": 0},
        "oldest_claimable_age_seconds": 2.5,
        "last_claim_at": claimed["claimed_at"],
    }
    listing = client.get("/types", headers=admin.headers).json["types"]
    assert [t["type"] for t in listing] == ["email", "pdf", "sync"]
    assert listing[1]["counts"]["pending"] == 1 and listing[1]["last_claim_at"] is None


def test_patch_changes_only_the_fields_it_names_and_null_clears_a_limit(client, admin):
    assert patch(client, admin, "email", max_running=5, rate_per_second=2.5).json[
        "burst"] == 3  # ceil(rate)
    changed = patch(client, admin, "email", paused=True, burst=10).json
    assert (changed["paused"], changed["max_running"], changed["rate_per_second"],
            changed["burst"]) == (True, 5, 2.5, 10)
    cleared = patch(client, admin, "email", max_running=None, paused=False).json
    assert (cleared["paused"], cleared["max_running"], cleared["burst"]) == (False, None, 10)
    assert client.get("/types/email", headers=admin.headers).json == cleared


@pytest.mark.parametrize("body,field", [
    ({"max_running": 0}, "max_running"),
    ({"max_running": 100_001}, "max_running"),
    ({"max_running_per_key": True}, "max_running_per_key"),
    ({"rate_per_second": 0.0001}, "rate_per_second"),
    ({"rate_per_second": "5"}, "rate_per_second"),
    ({"burst": 0}, "burst"),
    ({"paused": 1}, "paused"),
    ({"paused": "yes"}, "paused"),
    ({"push": {"url": "ftp://svc.internal/jobs"}}, "push.url"),
    ({"push": {"url": "https://svc.internal/jobs", "timeout_seconds": 901}},
     "push.timeout_seconds"),
    ({"colour": "blue"}, "colour"),
])
def test_patch_refuses_out_of_range_and_unknown_fields_naming_them(client, admin, body, field):
    response = patch(client, admin, "email", **body)

    assert response.status_code == 422
    assert response.content_type == "application/problem+json"
    assert field in response.json["errors"]
    assert client.get("/types/email", headers=admin.headers).json["max_running"] is None


def test_an_unknown_type_is_404_on_each_route(client, admin):
    for method in ("GET", "PATCH"):
        response = client.open("/types/fax", method=method, json={} if method == "PATCH"
                               else None, headers=admin.headers)
        assert response.status_code == 404
        assert response.content_type == "application/problem+json"


def test_push_null_is_accepted_and_shown_as_null(client, admin):
    response = patch(client, admin, "email", push=None)
    assert response.status_code == 200 and response.json["push"] is None


def test_a_paused_type_is_not_claimed_while_others_flow_and_resumes(client, api, producer,
                                                                   worker, admin):
    patch(client, admin, "email", paused=True)
    email = api.enqueue(producer, type="email")
    assert email.status_code == 201  # enqueues are still accepted
    pdf = api.enqueue(producer, type="pdf", priority="low").json["id"]

    assert api.claim(worker).json["id"] == pdf  # behind the paused one in claim order
    assert api.claim(worker).status_code == 204
    assert api.claim(worker, types=["email"]).status_code == 204

    patch(client, admin, "email", paused=False)
    assert api.claim(worker).json["id"] == email.json["id"]


def test_max_running_caps_running_jobs_and_frees_a_slot_on_completion(client, api, producer,
                                                                      worker, admin):
    patch(client, admin, "email", max_running=2)
    ids = [api.enqueue(producer, type="email").json["id"] for _ in range(4)]
    pdf = api.enqueue(producer, type="pdf", priority="low").json["id"]

    assert claimed_ids(api, worker, max_jobs=10) == [*ids[:2], pdf]
    assert api.claim(worker).status_code == 204
    api.complete(worker, ids[0])
    assert claimed_ids(api, worker, max_jobs=10) == [ids[2]]
    assert client.get("/types/email", headers=admin.headers).json["counts"]["running"] == 2


def test_max_running_per_key_passes_over_a_full_key_to_the_next_allowed_job(
        client, api, producer, worker, admin):
    patch(client, admin, "sync", max_running_per_key=1)
    a1 = api.enqueue(producer, type="sync", concurrency_key="customer-a").json["id"]
    a2 = api.enqueue(producer, type="sync", concurrency_key="customer-a").json["id"]
    b1 = api.enqueue(producer, type="sync", concurrency_key="customer-b").json["id"]
    free = api.enqueue(producer, type="sync").json["id"]  # no key: only max_running applies

    assert api.claim(worker).json["id"] == a1
    assert api.claim(worker).json["id"] == b1  # a2 waits: customer-a is at its cap
    assert api.claim(worker).json["id"] == free
    assert api.claim(worker).status_code == 204
    api.complete(worker, a1)
    assert api.claim(worker).json["id"] == a2


def test_claim_many_takes_one_job_per_key_at_cap_one(client, api, producer, worker, admin):
    patch(client, admin, "sync", max_running_per_key=1)
    jobs = [api.enqueue(producer, type="sync", concurrency_key=key).json
            for key in ["a", "a", "a", "b", "a", "c"]]

    taken = claimed_ids(api, worker, max_jobs=10)

    assert taken == [jobs[0]["id"], jobs[3]["id"], jobs[5]["id"]]
    assert jobs[0]["concurrency_key"] == "a"


def test_the_rate_allows_a_burst_then_one_claim_per_token(client, api, producer, worker, admin,
                                                         clock):
    patch(client, admin, "email", rate_per_second=2, burst=3)
    for _ in range(10):
        api.enqueue(producer, type="email")

    assert len(claimed_ids(api, worker, max_jobs=10)) == 3
    assert api.claim(worker).status_code == 204
    clock.advance(0.5)
    assert len(claimed_ids(api, worker, max_jobs=10)) == 1
    clock.advance(10)  # the bucket holds no more than the burst
    assert len(claimed_ids(api, worker, max_jobs=10)) == 3


def test_concurrency_key_is_validated_and_part_of_an_idempotent_request(api, producer):
    assert api.enqueue(producer, concurrency_key="").status_code == 422
    assert api.enqueue(producer, concurrency_key="x" * 256).status_code == 422
    assert api.enqueue(producer, concurrency_key="caf\u00e9").status_code == 422
    first = api.enqueue(producer, concurrency_key="k", idempotency_key="i-1")
    assert first.status_code == 201 and first.json["concurrency_key"] == "k"
    assert api.enqueue(producer, concurrency_key="k", idempotency_key="i-1").status_code == 200
    assert api.enqueue(producer, concurrency_key="j", idempotency_key="i-1").status_code == 422


def test_batch_items_carry_their_concurrency_key(client, producer):
    response = client.post("/jobs/batch", headers=producer.headers, json={"jobs": [
        {"type": "sync", "concurrency_key": "a"}, {"type": "sync"}]})

    assert response.status_code == 201
    assert [job["concurrency_key"] for job in response.json["jobs"]] == ["a", None]


def test_a_waiting_claim_is_not_woken_into_taking_a_paused_types_job(client, api, producer,
                                                                    worker, admin):
    patch(client, admin, "email", paused=True)
    api.enqueue(producer, type="email")

    response = api.claim(worker, wait_seconds=0.3)

    assert response.status_code == 204
