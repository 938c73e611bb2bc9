"""Running jobs under control (contract §17), through the API on both engines: a running job's
cancel, an attempt's deadline (timeout_seconds), a job's expiry (expires_at), progress and
checkpoints."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app import stop_maintenance
from app.core.clock import MICROS, parse_rfc3339, to_rfc3339
from tests.conftest import Api, Key


def events(client: Any, key: Key, job_id: int) -> list[dict[str, Any]]:
    answer = client.get(f"/jobs/{job_id}/events", headers=key.headers)
    assert answer.status_code == 200, answer.json
    return answer.json["events"]


def outcomes(client: Any, key: Key, job_id: int) -> list[tuple[str, str | None]]:
    answer = client.get(f"/jobs/{job_id}/attempts", headers=key.headers)
    assert answer.status_code == 200, answer.json
    return [(a["outcome"], a["error"]) for a in answer.json["attempts"]]


def running(api: Api, producer: Key, worker: Key, **body: Any) -> tuple[int, str]:
    """A job enqueued with `body` and claimed by `worker`: (its id, its lease token)."""
    job_id = api.enqueue(producer, **body).json["id"]
    claimed = api.claim(worker).json
    assert claimed["id"] == job_id
    return job_id, claimed["lease_token"]


def iso(moment_us: int) -> str:
    return to_rfc3339(moment_us)


# -- cancel a running job -----------------------------------------------------------------------

def test_a_running_jobs_cancel_is_a_request_its_heartbeat_answers(api, client, producer,
                                                                   worker, admin):
    job_id, token = running(api, producer, worker, max_retries=5, tags=["vip"])
    assert api.heartbeat(worker, job_id, lease_token=token).json["cancel_requested"] is False

    asked = api.cancel(admin, job_id)

    assert asked.status_code == 200
    assert (asked.json["status"], asked.json["cancel_requested"]) == ("running", True)
    # The whole job as GET /jobs/{id} shows it, its tags and trace included.
    assert (asked.json["tags"], asked.json["trace"]) == (["vip"], None)
    beat = api.heartbeat(worker, job_id, lease_token=token)
    assert beat.status_code == 200
    assert (beat.json["status"], beat.json["cancel_requested"]) == ("running", True)
    assert api.get(producer, job_id).json["cancel_requested"] is True
    # Asking again changes nothing and records nothing more.
    assert api.cancel(admin, job_id).json["cancel_requested"] is True
    requested = [e for e in events(client, admin, job_id) if e["event"] == "cancel_requested"]
    assert [(e["actor"], e["detail"]) for e in requested] == [("admin-1", {"worker": "worker-1"})]


@pytest.mark.parametrize("report", ["fail", "complete"])
def test_a_cancelled_running_job_ends_cancelled_whatever_its_worker_reports(
        api, client, producer, worker, admin, report):
    job_id, token = running(api, producer, worker, max_retries=5)
    api.cancel(admin, job_id)

    if report == "fail":
        answer = api.fail(worker, job_id, lease_token=token, error="stopped on request")
    else:
        answer = api.complete(worker, job_id, lease_token=token, result={"rows": 40})

    assert answer.status_code == 200, answer.json
    assert answer.json["status"] == "cancelled"
    job = api.get(admin, job_id).json
    assert (job["status"], job["retry_count"], job["cancel_requested"]) == ("cancelled", 0, False)
    assert outcomes(client, admin, job_id) == [
        ("cancelled", "stopped on request" if report == "fail" else None)]
    last = events(client, admin, job_id)[-1]
    assert (last["event"], last["actor"]) == ("cancelled", "worker-1")
    assert last["detail"]["cancel_requested_by"] == "admin-1"
    # Never retried: no claim takes it again.
    assert api.claim(worker).status_code == 204
    # The same report sent again (its answer lost) is answered the same.
    if report == "fail":
        again = api.fail(worker, job_id, lease_token=token, error="stopped on request")
    else:
        again = api.complete(worker, job_id, lease_token=token, result={"rows": 40})
    assert (again.status_code, again.json["status"]) == (200, "cancelled")


def test_a_cancelled_running_job_whose_worker_never_reports_ends_cancelled_at_lease_expiry(
        api, client, producer, worker, admin, clock):
    job_id, token = running(api, producer, worker, max_retries=5)
    api.cancel(admin, job_id)

    clock.advance(301)  # past the default lease
    assert api.claim(worker).status_code == 204  # maintenance ended it; not retried

    job = api.get(admin, job_id).json
    assert (job["status"], job["retry_count"]) == ("cancelled", 0)
    assert outcomes(client, admin, job_id) == [("cancelled", None)]
    last = events(client, admin, job_id)[-1]
    assert (last["event"], last["actor"]) == ("cancelled", "queuelog")
    assert last["detail"]["cancel_requested_by"] == "admin-1"
    late = api.complete(worker, job_id, lease_token=token)
    assert late.status_code == 409


def test_a_producer_cancels_its_own_running_job_and_no_one_elses(api, producer, worker,
                                                                 make_key):
    job_id, _token = running(api, producer, worker)
    stranger = make_key("producer-2", "producer")

    assert api.cancel(stranger, job_id).status_code == 404
    assert api.cancel(worker, job_id).status_code == 403
    asked = api.cancel(producer, job_id)
    assert (asked.status_code, asked.json["cancel_requested"]) == (200, True)


def test_a_producer_cannot_cancel_its_failed_job(api, producer, worker):
    job_id, token = running(api, producer, worker, max_retries=0)
    api.fail(worker, job_id, lease_token=token)
    refused = api.cancel(producer, job_id)
    assert refused.status_code == 409
    assert refused.content_type == "application/problem+json"


def test_an_admins_retry_of_a_job_cancelled_while_running_runs_it_afresh(api, producer,
                                                                         worker, admin):
    job_id, token = running(api, producer, worker)
    api.cancel(admin, job_id)
    api.fail(worker, job_id, lease_token=token, error="stopped")
    assert api.retry(admin, job_id).json["status"] == "pending"

    again = api.claim(worker).json
    beat = api.heartbeat(worker, job_id, lease_token=again["lease_token"])
    assert beat.json["cancel_requested"] is False
    done = api.complete(worker, job_id, lease_token=again["lease_token"])
    assert done.json["status"] == "completed"


# -- deadlines ------------------------------------------------------------------------------------

def test_no_lease_or_heartbeat_runs_past_the_attempts_deadline(api, producer, worker, clock):
    job_id = api.enqueue(producer, timeout_seconds=60).json["id"]
    claimed = api.claim(worker, lease_seconds=300).json
    deadline = parse_rfc3339(claimed["claimed_at"]) + 60 * MICROS
    assert claimed["timeout_seconds"] == 60
    assert claimed["lease_expires_at"] == iso(deadline)

    clock.advance(30)
    beat = api.heartbeat(worker, job_id, lease_token=claimed["lease_token"], lease_seconds=300)
    assert beat.json["lease_expires_at"] == iso(deadline)
    clock.advance(10)
    beat = api.heartbeat(worker, job_id, lease_token=claimed["lease_token"], lease_seconds=5)
    assert beat.json["lease_expires_at"] == iso(clock.now_us() + 5 * MICROS)  # shorter: as asked


def test_an_attempt_past_its_deadline_times_out_and_is_retried_with_backoff(
        app, api, client, producer, worker, admin, clock):
    job_id = api.enqueue(producer, timeout_seconds=60, max_retries=2).json["id"]
    claimed = api.claim(worker).json
    clock.advance(61)

    assert api.claim(worker).status_code == 204  # timed out, and retried after a backoff

    job = api.get(admin, job_id).json
    assert (job["status"], job["retry_count"], job["error"]) == ("pending", 1, "timed out")
    assert parse_rfc3339(job["run_at"]) > clock.now_us()  # the usual backoff, not at once
    assert outcomes(client, admin, job_id) == [("timed_out", "timed out")]
    assert events(client, admin, job_id)[-1]["event"] == "retry_scheduled"
    # The worker that ran past it is refused, and the refusal is recorded.
    late = api.complete(worker, job_id, lease_token=claimed["lease_token"])
    assert late.status_code == 409
    refused = events(client, admin, job_id)[-1]
    assert (refused["event"], refused["detail"]["report"]) == ("report_refused", "complete")
    metrics = client.get("/metrics", headers=admin.headers).get_data(as_text=True)
    assert "queuelog_jobs_timed_out_total 1" in metrics


def test_a_late_complete_before_maintenance_noticed_the_deadline_is_refused(
        app, api, client, producer, worker, admin, clock):
    job_id, token = running(api, producer, worker, timeout_seconds=10)
    stop_maintenance(app)  # the deadline passes, and no maintenance has timed it out yet
    clock.advance(11)
    late = api.complete(worker, job_id, lease_token=token)
    assert late.status_code == 409
    assert late.json["detail"] == "The attempt ran past the job's timeout_seconds."
    assert events(client, admin, job_id)[-1]["event"] == "report_refused"


def test_an_attempt_that_times_out_with_no_retries_left_fails(api, client, producer, worker,
                                                              admin, clock):
    job_id, _token = running(api, producer, worker, timeout_seconds=10, max_retries=0)
    clock.advance(11)
    api.claim(worker)
    job = api.get(admin, job_id).json
    assert (job["status"], job["error"]) == ("failed", "timed out")


# -- expiry ---------------------------------------------------------------------------------------

def test_an_expired_job_is_never_claimed_and_ends_cancelled_as_expired(api, client, producer,
                                                                       worker, admin, clock):
    job_id = api.enqueue(producer, expires_in_seconds=60).json["id"]
    expires_at = api.get(admin, job_id).json["expires_at"]
    assert expires_at == iso(clock.now_us() + 60 * MICROS)
    clock.advance(60)  # expires_at == now: no longer claimable

    assert api.claim(worker).status_code == 204

    assert api.get(admin, job_id).json["status"] == "cancelled"
    last = events(client, admin, job_id)[-1]
    assert (last["event"], last["actor"]) == ("cancelled", "queuelog")
    assert last["detail"] == {"reason": "expired", "expires_at": expires_at}
    metrics = client.get("/metrics", headers=admin.headers).get_data(as_text=True)
    assert "queuelog_jobs_expired_total 1" in metrics


@pytest.mark.parametrize("path,body", [
    ("/jobs/claim", {}),
    ("/jobs/claim", {"types": ["email"]}),
    ("/jobs/claim-many", {"max_jobs": 100}),
    ("/jobs/claim-many", {"max_jobs": 100, "types": ["email", "pdf"]}),
    ("/jobs/claim", {"wait_seconds": 0.2}),
])
def test_no_claim_path_hands_out_an_expired_job_before_maintenance_cancels_it(
        app, client, api, producer, worker, admin, clock, path, body):
    # Expired jobs no maintenance has cancelled yet (its leader stopped): the claim's own
    # candidates leave them out, more urgent than the one job still claimable.
    doomed = [{"type": "email", "priority": "high", "expires_in_seconds": 30}] * 150
    assert client.post("/jobs/batch", json={"jobs": doomed},
                       headers=admin.headers).status_code == 201
    keeper = api.enqueue(producer, priority="low").json["id"]
    stop_maintenance(app)
    clock.advance(31)

    taken = client.post(path, json=body, headers=worker.headers)

    claimed = taken.json["jobs"] if path.endswith("many") else [taken.json]
    assert [job["id"] for job in claimed] == [keeper]
    assert api.list(admin, status="cancelled", limit=500).json["jobs"] == []
    assert len(api.list(admin, status="pending", limit=500).json["jobs"]) == 150


def test_a_waiting_job_that_expires_is_cancelled_and_cancels_its_dependents(
        api, client, producer, worker, admin, clock):
    first = api.enqueue(producer).json["id"]
    waiting = api.enqueue(producer, depends_on=[first], expires_in_seconds=60).json["id"]
    after = api.enqueue(producer, depends_on=[waiting]).json["id"]
    clock.advance(61)
    taken = api.claim(worker).json
    assert taken["id"] == first
    assert api.get(admin, waiting).json["status"] == "cancelled"
    assert api.get(admin, after).json["status"] == "cancelled"


def test_an_expired_turn_of_an_ordered_key_passes_the_turn_on(client, api, producer, worker,
                                                              admin, clock):
    client.patch("/types/email", json={"ordering": "key"}, headers=admin.headers)
    first = api.enqueue(producer, concurrency_key="acct", expires_in_seconds=10).json["id"]
    second = api.enqueue(producer, concurrency_key="acct").json["id"]
    assert api.get(admin, second).json["status"] == "waiting"
    clock.advance(11)
    assert api.claim(worker).json["id"] == second
    assert api.get(admin, first).json["status"] == "cancelled"


@pytest.mark.parametrize("body,field", [
    ({"expires_in_seconds": 60, "expires_at": "2027-01-15T09:00:00Z"}, "expires_in_seconds"),
    ({"expires_at": "2027-01-15T07:00:00Z"}, "expires_at"),  # in the past
    ({"expires_at": "2028-02-15T08:00:00Z"}, "expires_at"),  # beyond a year
    ({"expires_in_seconds": 60, "delay_seconds": 60}, "expires_in_seconds"),  # never due
    ({"expires_in_seconds": 0}, "expires_in_seconds"),
    ({"expires_in_seconds": True}, "expires_in_seconds"),
    ({"timeout_seconds": 0}, "timeout_seconds"),
    ({"timeout_seconds": 604_801}, "timeout_seconds"),
    ({"timeout_seconds": "60"}, "timeout_seconds"),
])
def test_bad_deadlines_and_expiries_are_422s_naming_the_field(api, producer, admin, body,
                                                              field):
    refused = api.enqueue(producer, **body)
    assert refused.status_code == 422, refused.json
    assert field in refused.json["errors"]
    assert api.list(admin).json["jobs"] == []


def test_a_batch_and_an_idempotent_replay_keep_the_timeout_and_expiry(client, api, producer,
                                                                      clock):
    expires_at = datetime.fromtimestamp(clock.now_us() / MICROS, UTC) + timedelta(hours=1)
    stamp = expires_at.isoformat().replace("+00:00", "Z")
    made = client.post("/jobs/batch", json={"jobs": [
        {"type": "email", "timeout_seconds": 30, "expires_at": stamp},
        {"type": "email", "timeout_seconds": 45}]}, headers=producer.headers).json["jobs"]
    assert [(j["timeout_seconds"], j["expires_at"]) for j in made] == [
        (30, iso(clock.now_us() + 3600 * MICROS)), (45, None)]

    headers = {"Idempotency-Key": "order-7"}
    first = api.enqueue(producer, headers=headers, timeout_seconds=30)
    assert api.enqueue(producer, headers=headers, timeout_seconds=30).status_code == 200
    changed = api.enqueue(producer, headers=headers, timeout_seconds=31)
    assert changed.status_code == 422 and first.status_code == 201


# -- progress and checkpoints -----------------------------------------------------------------

def test_progress_is_shown_on_the_job_and_is_not_an_event(api, client, producer, worker,
                                                           admin, clock):
    job_id, token = running(api, producer, worker)
    assert api.get(producer, job_id).json["progress"] is None
    before = len(events(client, admin, job_id))

    beat = api.heartbeat(worker, job_id, lease_token=token,
                         progress={"done": 420, "total": 1000},
                         message="importing rows for password=hunter2")

    shown = {"done": 420, "total": 1000, "message": "importing rows for password=***",
             "at": iso(clock.now_us())}
    assert beat.json["progress"] == shown
    assert api.get(producer, job_id).json["progress"] == shown
    assert api.list(admin).json["jobs"][0]["progress"] == shown
    assert len(events(client, admin, job_id)) == before
    # A later heartbeat without a message keeps the message; without progress, the progress.
    clock.advance(1)
    api.heartbeat(worker, job_id, lease_token=token, progress={"done": 500, "total": 1000})
    api.heartbeat(worker, job_id, lease_token=token)
    assert api.get(producer, job_id).json["progress"] == {**shown, "done": 500,
                                                           "at": iso(clock.now_us())}


def test_a_watcher_sees_the_progress_when_it_returns(api, producer, worker, client):
    job_id, token = running(api, producer, worker)
    api.heartbeat(worker, job_id, lease_token=token, progress={"done": 1, "total": 2})
    watched = client.get(f"/jobs/{job_id}", query_string={"wait_seconds": "0.1"},
                         headers=producer.headers)
    assert watched.json["progress"]["done"] == 1


def test_only_the_holder_writes_progress_or_a_checkpoint(api, producer, worker, make_key):
    job_id, token = running(api, producer, worker)
    other = make_key("worker-2", "worker")

    refused = api.heartbeat(other, job_id, progress={"done": 9, "total": 9},
                            checkpoint={"at": 9})
    assert refused.status_code == 409
    stale = api.heartbeat(worker, job_id, lease_token="0" * 32 + f".{job_id}",
                          progress={"done": 9, "total": 9})
    assert stale.status_code == 409
    assert api.get(producer, job_id).json["progress"] is None
    api.fail(worker, job_id, lease_token=token, retry_in_seconds=0)
    assert api.claim(worker).json["checkpoint"] is None


def test_a_checkpoint_saved_in_one_attempt_arrives_in_the_next_claim(api, client, producer,
                                                                     worker):
    job_id, token = running(api, producer, worker, max_retries=3)
    assert api.claim(worker).status_code == 204
    api.heartbeat(worker, job_id, lease_token=token, checkpoint={"next_row": 420})
    api.fail(worker, job_id, lease_token=token, error="crashed", retry_in_seconds=0)

    second = api.claim(worker).json
    assert (second["id"], second["checkpoint"]) == (job_id, {"next_row": 420})
    # A fail may save one too; claim-many carries it as well.
    api.fail(worker, job_id, lease_token=second["lease_token"], retry_in_seconds=0,
             checkpoint={"next_row": 900})
    third = client.post("/jobs/claim-many", json={"max_jobs": 5},
                        headers=worker.headers).json["jobs"]
    assert [(j["id"], j["checkpoint"]) for j in third] == [(job_id, {"next_row": 900})]


@pytest.mark.parametrize("body,field", [
    ({"progress": {"done": 5, "total": 4}}, "progress"),
    ({"progress": {"done": -1, "total": 4}}, "progress"),
    ({"progress": {"done": 1}}, "progress"),
    ({"progress": {"done": 1.5, "total": 4}}, "progress"),
    ({"progress": [1, 4]}, "progress"),
    ({"message": "x" * 201}, "message"),
    ({"message": 7}, "message"),
    ({"message": "-\x00"}, "message"),  # PostgreSQL text cannot hold it: a 422, never a 500
    ({"checkpoint": [1, 2]}, "checkpoint"),
    ({"checkpoint": "resume"}, "checkpoint"),
])
def test_bad_progress_and_checkpoints_are_422s_naming_the_field(api, producer, worker, body,
                                                                field):
    job_id, token = running(api, producer, worker)
    refused = api.heartbeat(worker, job_id, lease_token=token, **body)
    assert refused.status_code == 422, refused.json
    assert any(name.split(".")[0] == field for name in refused.json["errors"])
    assert api.get(producer, job_id).json["progress"] is None


def test_a_checkpoint_past_the_payload_limit_is_a_422_naming_it(app, api, producer, worker):
    limit = app.extensions["queuelog"].jobs.max_payload_bytes
    job_id, token = running(api, producer, worker)
    refused = api.heartbeat(worker, job_id, lease_token=token,
                            checkpoint={"blob": "x" * limit})
    assert refused.status_code == 422
    assert "checkpoint" in refused.json["errors"]
    failed = api.fail(worker, job_id, lease_token=token, checkpoint={"blob": "x" * limit})
    assert failed.status_code == 422 and "checkpoint" in failed.json["errors"]
    assert api.get(producer, job_id).json["status"] == "running"
