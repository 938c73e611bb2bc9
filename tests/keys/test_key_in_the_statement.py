"""A cached key's liveness is checked by the step's own statement (the enqueue's INSERT, the
claim's UPDATE, a report's UPDATE or locking read), not by a read of its own: a key revoked
elsewhere still changes nothing on any of them, and a statement that found nothing for a
live key answers as it always did."""

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


@pytest.fixture
def held(api, producer, make_key):
    """A worker key holding a running job, seen live by this process: (key, job id, its
    lease token)."""
    worker = make_key("w-soon-revoked", "worker")
    job_id = api.enqueue(producer).json["id"]
    claimed = api.claim(worker).json
    assert claimed["id"] == job_id
    return worker, job_id, claimed["lease_token"]


@pytest.mark.parametrize("report", ["heartbeat", "fail", "complete"])
def test_a_revoked_worker_s_report_changes_nothing(api, admin, held, revoke_elsewhere, report):
    worker, job_id, token = held

    def story() -> list[object]:
        """The job, its attempts and its events (a plain fail writes all three in its one
        statement on PostgreSQL), and the failure groups."""
        answers = [api.client.get(path, headers=admin.headers) for path in
                   (f"/jobs/{job_id}", f"/jobs/{job_id}/attempts", f"/jobs/{job_id}/events",
                    "/failures")]
        assert [answer.status_code for answer in answers] == [200] * 4
        return [answer.json for answer in answers]

    before = story()
    revoke_elsewhere(worker.name)

    response = getattr(api, report)(worker, job_id, lease_token=token)

    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert story() == before


@pytest.mark.parametrize("report", ["heartbeat", "fail", "complete"])
def test_a_revoked_worker_s_report_on_no_job_is_refused_as_revoked(api, held,
                                                                   revoke_elsewhere, report):
    worker, _job_id, token = held
    revoke_elsewhere(worker.name)

    assert getattr(api, report)(worker, 999_999, lease_token=token).status_code == 401


@pytest.mark.parametrize("body", [{"types": ["email"]}, {"types": ["email", "pdf"], "limit": 2},
                                  {"limit": 2}])
def test_a_revoked_worker_claims_nothing_whichever_claim_it_makes(
        client, api, admin, producer, held, revoke_elsewhere, body):
    worker, _job_id, _token = held
    pending = [api.enqueue(producer, type=job_type).json["id"] for job_type in ("email", "pdf")]
    revoke_elsewhere(worker.name)

    assert client.post("/jobs/claim", json=body, headers=worker.headers).status_code == 401
    assert [api.get(admin, job_id).json["status"] for job_id in pending] == ["pending"] * 2


def test_a_revoked_producer_s_replay_and_enqueue_store_nothing(api, admin, make_key,
                                                               revoke_elsewhere):
    producer = make_key("p-soon-revoked", "producer")
    headers = {"Idempotency-Key": "once"}
    assert api.enqueue(producer, headers=headers).status_code == 201
    revoke_elsewhere(producer.name)

    assert api.enqueue(producer, headers=headers).status_code == 401
    assert api.enqueue(producer, unique={"key": "u"}).status_code == 401
    assert len(api.list(admin).json["jobs"]) == 1


def test_a_live_worker_s_report_with_a_stale_token_is_refused_as_before(api, admin, held):
    worker, job_id, token = held

    response = api.complete(worker, job_id, lease_token=token + "x")

    assert response.status_code == 409
    assert api.get(admin, job_id).json["status"] == "running"
    assert api.heartbeat(worker, 999_999, lease_token=token).status_code == 404
