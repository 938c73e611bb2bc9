"""Every route with every role, and with no key: who may do what (contract sections 2 and 6).

Each case first puts a job into the state the route needs to succeed (a pending job to
cancel, a running job held by the worker to complete, a failed one to retry …), so a refusal
is the role's doing and a success is the route's normal answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tests.conftest import Api, Key


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # "{id}" is the prepared job's id
    needs: str  # the job the route acts on: pending, running (held by worker-1) or failed
    body: dict[str, Any] | None  # None: no body at all


ROUTES = {
    "enqueue": Route("POST", "/jobs", "pending", {"type": "email", "payload": {"n": 1}}),
    "list": Route("GET", "/jobs", "running", None),
    "get": Route("GET", "/jobs/{id}", "running", None),
    "claim": Route("POST", "/jobs/claim", "pending", {}),
    "heartbeat": Route("POST", "/jobs/{id}/heartbeat", "running", {}),
    "complete": Route("POST", "/jobs/{id}/complete", "running", {"result": {"ok": True}}),
    "fail": Route("POST", "/jobs/{id}/fail", "running", {"error": "it broke"}),
    "cancel": Route("POST", "/jobs/{id}/cancel", "pending", None),
    "retry": Route("POST", "/jobs/{id}/retry", "failed", None),
    "batch": Route("POST", "/jobs/batch", "pending", {"jobs": [{"type": "email"}]}),
    "claim-many": Route("POST", "/jobs/claim-many", "pending", {"max_jobs": 5}),
    "complete-many": Route("POST", "/jobs/complete-many", "running",
                           {"items": [{"id": "{id}", "result": {"ok": True}}]}),
    "types": Route("GET", "/types", "pending", None),
    "type": Route("GET", "/types/pdf", "pending", None),
    "type-patch": Route("PATCH", "/types/pdf", "pending", {"max_running": 5}),
    "attempts": Route("GET", "/jobs/{id}/attempts", "running", None),
    "events": Route("GET", "/jobs/{id}/events", "running", None),
    "explain": Route("GET", "/jobs/{id}/explain", "running", None),
    "workers": Route("GET", "/workers", "running", None),
    "retry-many": Route("POST", "/jobs/retry-many", "failed", {"ids": ["{id}"]}),
    "cancel-many": Route("POST", "/jobs/cancel-many", "pending", {"ids": ["{id}"]}),
    "health-database": Route("GET", "/health/database", "running", None),
}

# route -> role -> (status, the job's status afterwards, as an admin sees it)
EXPECTED: dict[str, dict[str, tuple[int, str]]] = {
    "enqueue": {"producer": (201, "pending"), "worker": (403, "pending"),
                "admin": (201, "pending")},
    "list": {"producer": (200, "running"), "worker": (200, "running"),
             "admin": (200, "running")},
    "get": {"producer": (200, "running"), "worker": (200, "running"),
            "admin": (200, "running")},
    "claim": {"producer": (403, "pending"), "worker": (200, "running"),
              "admin": (403, "pending")},
    "heartbeat": {"producer": (403, "running"), "worker": (200, "running"),
                  "admin": (403, "running")},
    "complete": {"producer": (403, "running"), "worker": (200, "completed"),
                 "admin": (403, "running")},
    "fail": {"producer": (403, "running"), "worker": (200, "failed"),
             "admin": (403, "running")},
    # A producer cancels its own jobs (contract §17); another producer's is not found
    # (tests/jobs/test_running_jobs.py).
    "cancel": {"producer": (200, "cancelled"), "worker": (403, "pending"),
               "admin": (200, "cancelled")},
    "retry": {"producer": (403, "failed"), "worker": (403, "failed"),
              "admin": (200, "pending")},
    "batch": {"producer": (201, "pending"), "worker": (403, "pending"),
              "admin": (201, "pending")},
    "claim-many": {"producer": (403, "pending"), "worker": (200, "running"),
                   "admin": (403, "pending")},
    "complete-many": {"producer": (403, "running"), "worker": (200, "completed"),
                      "admin": (403, "running")},
    "types": {"producer": (403, "pending"), "worker": (403, "pending"),
              "admin": (200, "pending")},
    "type": {"producer": (403, "pending"), "worker": (403, "pending"),
             "admin": (200, "pending")},
    "type-patch": {"producer": (403, "pending"), "worker": (403, "pending"),
                   "admin": (200, "pending")},
    "attempts": {"producer": (200, "running"), "worker": (403, "running"),
                 "admin": (200, "running")},
    "events": {"producer": (403, "running"), "worker": (403, "running"),
               "admin": (200, "running")},
    "explain": {"producer": (200, "running"), "worker": (403, "running"),
                "admin": (200, "running")},
    "workers": {"producer": (403, "running"), "worker": (403, "running"),
                "admin": (200, "running")},
    "retry-many": {"producer": (403, "failed"), "worker": (403, "failed"),
                   "admin": (200, "pending")},
    "cancel-many": {"producer": (403, "pending"), "worker": (403, "pending"),
                    "admin": (200, "cancelled")},
    "health-database": {"producer": (403, "running"), "worker": (403, "running"),
                        "admin": (200, "running")},
}


def _with_id(body: Any, job_id: int) -> Any:
    """The body with the prepared job's id in place of "{id}"."""
    if body == "{id}":
        return job_id
    if isinstance(body, dict):
        return {key: _with_id(value, job_id) for key, value in body.items()}
    if isinstance(body, list):
        return [_with_id(value, job_id) for value in body]
    return body

CASES = [
    pytest.param(route, role, *EXPECTED[route][role] if role != "none" else (401, None),
                 id=f"{ROUTES[route].method} {ROUTES[route].path} "
                    + (f"as {role}" if role != "none" else "without a key"))
    for route in ROUTES
    for role in ("producer", "worker", "admin", "none")
]


def _prepare(api: Api, producer: Key, worker: Key, needs: str) -> int:
    """A job enqueued by producer-1 in the state `needs`; failed jobs were held by worker-1."""
    job_id = api.enqueue(producer, type="pdf", max_retries=0).json["id"]
    if needs == "pending":
        return job_id
    claim = api.claim(worker)
    assert claim.json["id"] == job_id
    if needs == "failed":
        assert api.fail(worker, job_id).json["status"] == "failed"
    return job_id


@pytest.mark.parametrize("route_name,role,status,job_status_after", CASES)
def test_each_role_gets_the_contracts_answer_on_each_route(
        client, api, producer, worker, admin, route_name, role, status, job_status_after):
    route = ROUTES[route_name]
    job_id = _prepare(api, producer, worker, route.needs)
    before = api.get(admin, job_id).json
    key = {"producer": producer, "worker": worker, "admin": admin}.get(role)

    response = client.open(route.path.format(id=job_id), method=route.method,
                           json=_with_id(route.body, job_id),
                           headers=key.headers if key else {})

    assert response.status_code == status, response.get_data(as_text=True)
    if status >= 400:
        assert response.content_type == "application/problem+json"
        assert response.json["status"] == status
        if status == 401:
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
        # A refused request leaves the job exactly as it was, and creates none.
        assert api.get(admin, job_id).json == before
        assert [job["id"] for job in api.list(admin).json["jobs"]] == [job_id]
        # … and the type's settings as they were.
        assert client.get("/types/pdf", headers=admin.headers).json["max_running"] is None
        return

    after = api.get(admin, job_id).json
    assert after["status"] == job_status_after
    body = response.json
    if route_name == "enqueue":
        assert body["id"] != job_id
        assert body["status"] == "pending"
        assert response.headers["Location"].endswith(f"/jobs/{body['id']}")
        assert api.get(admin, body["id"]).json["type"] == "email"
    elif route_name == "batch":
        assert len(body["jobs"]) == 1 and body["jobs"][0]["id"] != job_id
        assert body["jobs"][0]["replayed"] is False
    elif route_name == "claim-many":
        assert [job["id"] for job in body["jobs"]] == [job_id]
        assert body["jobs"][0]["lease_token"]
    elif route_name == "complete-many":
        assert body["results"][0]["status"] == 200
        assert body["results"][0]["job"]["result"] == {"ok": True}
    elif route_name == "types":
        assert [t["type"] for t in body["types"]] == ["email", "pdf", "sync"]
    elif route_name in ("type", "type-patch"):
        assert body["type"] == "pdf" and body["counts"]["pending"] == 1
        assert body["max_running"] == (5 if route_name == "type-patch" else None)
    elif route_name == "attempts":
        assert [a["worker_id"] for a in body["attempts"]] == [worker.name]
        assert all(("error" in a) == (role == "admin") for a in body["attempts"])
    elif route_name == "events":
        assert [e["event"] for e in body["events"]] == ["enqueued", "claimed"]
    elif route_name == "explain":
        assert (body["job_id"], body["reasons"][0]["code"]) == (job_id, "running")
    elif route_name == "workers":
        assert [(w["name"], w["running"]) for w in body["workers"]] == [(worker.name, 1)]
    elif route_name == "health-database":
        assert body["engine"] in ("sqlite", "postgresql")
        assert body["horizon"] is (body["engine"] == "postgresql")
    elif route_name in ("retry-many", "cancel-many"):
        assert body == {"count": 1, "ids": [job_id]}
    elif route_name == "list":
        assert [job["id"] for job in body["jobs"]] == [job_id]
        assert body["next_cursor"] is None
        assert all(("error" in job) == (role == "admin") for job in body["jobs"])
    else:
        assert body["id"] == job_id
        assert body["status"] == job_status_after
        assert ("error" in body) == (role == "admin")
    if route_name == "claim":
        assert body["worker_id"] == worker.name
        assert body["lease_token"]
    if route_name == "complete":
        assert body["result"] == {"ok": True}


@pytest.mark.parametrize("role", ["producer", "worker"])
def test_a_job_outside_the_callers_view_is_a_404_for_producers_and_workers(
        api, make_key, producer, worker, admin, role):
    job_id = _prepare(api, producer, worker, "running")
    stranger = make_key(f"other-{role}", role)

    response = api.get(stranger, job_id)

    assert response.status_code == 404
    assert response.content_type == "application/problem+json"
    assert api.list(stranger).json["jobs"] == []
    assert api.get(admin, job_id).status_code == 200


@pytest.mark.parametrize("action", ["heartbeat", "complete", "fail"])
def test_a_worker_acting_on_a_job_it_does_not_hold_gets_409_not_403(
        api, make_key, producer, worker, admin, action):
    job_id = _prepare(api, producer, worker, "running")
    before = api.get(admin, job_id).json
    other = make_key("worker-2", "worker")

    response = getattr(api, action)(other, job_id)

    assert response.status_code == 409
    assert api.get(admin, job_id).json == before
