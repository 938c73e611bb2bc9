"""A key revoked elsewhere (another gunicorn worker, another host, the CLI) fails on its very
next request here too, although this process remembers having seen it live."""

from __future__ import annotations

import pytest

from app import create_app


@pytest.fixture
def revoke_elsewhere(app_config):
    """Revoke a key through a second app: this process's cache is not told."""

    def revoke(name: str) -> None:
        other = create_app(app_config)
        other.extensions["queuelog"].keys.revoke_key(name)
        other.extensions["queuelog"].db.engine.dispose()

    return revoke


REQUESTS = {
    "enqueue": lambda c, k: c.post("/jobs", json={"type": "email"}, headers=k.headers),
    "enqueue with a bad body": lambda c, k: c.post("/jobs", json={"type": 5},
                                                   headers=k.headers),
    "list": lambda c, k: c.get("/jobs", headers=k.headers),
    "get": lambda c, k: c.get("/jobs/1", headers=k.headers),
    "batch": lambda c, k: c.post("/jobs/batch", json={"jobs": [{"type": "email"}]},
                                 headers=k.headers),
    "claim for another role": lambda c, k: c.post("/jobs/claim", headers=k.headers),
    "workflow": lambda c, k: c.post("/workflows", json={"jobs": [
        {"ref": "a", "type": "email"}, {"ref": "b", "type": "pdf", "depends_on": ["a"]}]},
        headers=k.headers),
    "list workflows": lambda c, k: c.get("/workflows", headers=k.headers),
    "get a workflow": lambda c, k: c.get("/workflows/1", headers=k.headers),
    "cancel a workflow": lambda c, k: c.post("/workflows/1/cancel", headers=k.headers),
    "dependencies": lambda c, k: c.get("/jobs/1/dependencies", headers=k.headers),
}


@pytest.mark.parametrize("request_name", REQUESTS)
def test_a_cached_key_revoked_elsewhere_gets_401_and_changes_nothing(
        client, api, make_key, admin, revoke_elsewhere, request_name):
    producer = make_key("soon-revoked", "producer")
    assert api.enqueue(producer).status_code == 201  # now cached in this process
    revoke_elsewhere("soon-revoked")

    response = REQUESTS[request_name](client, producer)

    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert len(api.list(admin).json["jobs"]) == 1


@pytest.mark.parametrize("body", [{}, {"types": []}])
def test_a_revoked_worker_can_neither_claim_nor_report(client, api, producer, make_key,
                                                       revoke_elsewhere, admin, body):
    worker = make_key("w-revoked", "worker")
    job_id = api.enqueue(producer).json["id"]
    claimed = api.claim(worker).json
    api.enqueue(producer)
    revoke_elsewhere("w-revoked")

    assert client.post("/jobs/claim", json=body, headers=worker.headers).status_code == 401
    assert api.complete(worker, job_id, lease_token=claimed["lease_token"]).status_code == 401
    assert api.get(admin, job_id).json["status"] == "running"
    assert api.list(admin, status="pending").json["jobs"] != []
