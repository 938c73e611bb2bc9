"""Workflows under ordered keys, on both engines: a job of one submission enters its key after
the jobs it depends on (docs/WORKFLOWS.md), so a graph whose request order puts a dependent
first under the same key still runs, every job in turn, rather than hold the key forever."""

from __future__ import annotations

from typing import Any

from tests.conftest import Api, Key


def _ordered(api: Api, admin: Key, job_type: str = "email") -> None:
    response = api.client.patch(f"/types/{job_type}", json={"ordering": "key"},
                                headers=admin.headers)
    assert response.status_code == 200, response.json


def _workflow(api: Api, producer: Key, jobs: list[dict[str, Any]]) -> dict[str, int]:
    response = api.client.post("/workflows", json={"jobs": jobs}, headers=producer.headers)
    assert response.status_code == 201, response.json
    return dict(response.json["jobs"])


def _run_all(api: Api, worker: Key, limit: int) -> list[int]:
    """Claim and complete until nothing is claimable; the ids in the order they ran."""
    ran: list[int] = []
    for _ in range(limit):
        response = api.claim(worker)
        if response.status_code == 204:
            break
        assert response.status_code == 200, response.json
        ran.append(response.json["id"])
        assert api.complete(worker, response.json["id"]).status_code == 200
    return ran


def test_a_dependent_listed_before_its_dependency_under_one_key_runs_after_it(
        api, producer, worker, admin):
    _ordered(api, admin)
    ids = _workflow(api, producer, [
        {"ref": "summary", "type": "email", "concurrency_key": "cust-7",
         "depends_on": ["figures"]},
        {"ref": "figures", "type": "email", "concurrency_key": "cust-7"},
        {"ref": "unrelated", "type": "email", "concurrency_key": "cust-7"},
    ])

    assert _run_all(api, worker, 10) == [ids["figures"], ids["summary"], ids["unrelated"]]
    assert {api.get(admin, i).json["status"] for i in ids.values()} == {"completed"}


def test_a_cycle_through_two_keys_and_request_order_still_runs_to_the_end(
        api, producer, worker, admin):
    """a (key K) waits for b (key L); c (key L) waits for d (key K). Stored in request order,
    a would hold K waiting for b, which waits for L's turn, held by c waiting for d, which
    waits for K: nothing would ever run."""
    _ordered(api, admin)
    ids = _workflow(api, producer, [
        {"ref": "a", "type": "email", "concurrency_key": "K", "depends_on": ["b"]},
        {"ref": "c", "type": "email", "concurrency_key": "L", "depends_on": ["d"]},
        {"ref": "b", "type": "email", "concurrency_key": "L"},
        {"ref": "d", "type": "email", "concurrency_key": "K"},
    ])

    ran = _run_all(api, worker, 10)

    assert sorted(ran) == sorted(ids.values())
    position = {job_id: n for n, job_id in enumerate(ran)}
    assert position[ids["b"]] < position[ids["a"]] and position[ids["d"]] < position[ids["c"]]


def test_a_chain_listed_backwards_runs_from_its_root(api, producer, worker, admin):
    _ordered(api, admin)
    length = 40
    jobs = [{"ref": f"n{n}", "type": "email", "concurrency_key": "chain",
             **({"depends_on": [f"n{n + 1}"]} if n + 1 < length else {})}
            for n in range(length)]
    ids = _workflow(api, producer, jobs)

    assert _run_all(api, worker, length + 1) == [ids[f"n{n}"] for n in reversed(range(length))]


def test_a_job_depending_on_a_reserved_job_of_its_key_lets_it_run_once_confirmed(
        api, producer, worker, admin):
    """A reserved job holds no turn until confirmed: a later job of its key that depends on it
    takes the turn meanwhile. Confirmed, the older job takes the turn back, so the dependent
    does not hold the turn its dependency waits for."""
    _ordered(api, admin)
    reserved = api.enqueue(producer, type="email", concurrency_key="cust-7",
                           reserve={"confirm_within_seconds": 600}).json["id"]
    dependent = api.enqueue(producer, type="email", concurrency_key="cust-7",
                            depends_on=[reserved]).json["id"]
    later = api.enqueue(producer, type="email", concurrency_key="cust-7").json["id"]
    confirmed = api.client.post(f"/jobs/{reserved}/confirm", headers=producer.headers)
    assert confirmed.status_code == 200, confirmed.json
    assert confirmed.json["status"] == "pending"

    assert _run_all(api, worker, 5) == [reserved, dependent, later]
