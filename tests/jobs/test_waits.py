"""Waits through the API, on both engines (docs/WAITS.md): a held job suspends on a sleep, an
event or a waitpoint token, holds no lease and no slot meanwhile, and resumes once, by its
moment, its event, its token or its timeout; its next claim says how, beside its checkpoint."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from app.core.clock import to_rfc3339
from tests.conftest import Api, Key


def suspend(api: Api, worker: Key, job_id: int, token: str, **body: Any) -> Any:
    return api.client.post(f"/jobs/{job_id}/suspend", json={"lease_token": token, **body},
                           headers=worker.headers)


def post_event(api: Api, who: Key, headers: dict[str, str] | None = None, **body: Any) -> Any:
    return api.client.post("/events", json=body, headers={**who.headers, **(headers or {})})


def running(api: Api, producer: Key, worker: Key, **body: Any) -> tuple[int, str]:
    job_id = api.enqueue(producer, **body).json["id"]
    claimed = api.claim(worker).json
    assert claimed["id"] == job_id
    return job_id, claimed["lease_token"]


def outcomes(api: Api, key: Key, job_id: int) -> list[str]:
    answer = api.client.get(f"/jobs/{job_id}/attempts", headers=key.headers)
    return [attempt["outcome"] for attempt in answer.json["attempts"]]


def event_names(api: Api, key: Key, job_id: int) -> list[str]:
    answer = api.client.get(f"/jobs/{job_id}/events", headers=key.headers)
    return [event["event"] for event in answer.json["events"]]


# -- a sleep ----------------------------------------------------------------------------------

def test_a_sleep_frees_the_worker_and_resumes_at_its_moment_with_the_checkpoint(
        api, producer, worker, admin, clock):
    job_id, token = running(api, producer, worker, max_retries=2)

    answer = suspend(api, worker, job_id, token, seconds=60, checkpoint={"step": 1})

    assert answer.status_code == 200, answer.json
    until = to_rfc3339(clock.now_us() + 60_000_000)
    assert answer.json["status"] == "suspended"
    assert answer.json["waiting_for"] == {"kind": "time", "until": until}
    assert (answer.json["worker_id"], answer.json["lease_expires_at"]) == (None, None)
    assert api.claim(worker).status_code == 204  # not claimable while it sleeps
    shown = api.get(producer, job_id).json
    assert (shown["status"], shown["waiting_for"]["until"]) == ("suspended", until)
    listed = api.list(admin, status="suspended").json["jobs"]
    assert [job["id"] for job in listed] == [job_id]
    assert listed[0]["waiting_for"]["kind"] == "time"

    clock.advance(59)
    assert api.get(admin, job_id).json["status"] == "suspended"
    clock.advance(1)
    assert api.get(admin, job_id).json["status"] == "pending"
    claimed = api.claim(worker).json
    assert claimed["id"] == job_id
    assert claimed["resumed"] == {"by": "time", "data": None, "at": until}
    assert claimed["checkpoint"] == {"step": 1}
    # Not a failure: the retry budget is whole, and the attempt says why it ended.
    assert claimed["retry_count"] == 0
    assert outcomes(api, admin, job_id) == ["suspended", "running"]
    assert event_names(api, admin, job_id) == ["enqueued", "claimed", "suspended", "resumed",
                                               "claimed"]
    assert api.complete(worker, job_id, lease_token=claimed["lease_token"]).status_code == 200


def test_a_sleep_until_a_moment(api, producer, worker, clock):
    job_id, token = running(api, producer, worker)
    moment = to_rfc3339(clock.now_us() + 3_600_000_000)

    answer = suspend(api, worker, job_id, token, until=moment)

    assert answer.json["waiting_for"] == {"kind": "time", "until": moment}
    clock.advance(3600)
    assert api.claim(worker).json["resumed"]["by"] == "time"


# -- events -----------------------------------------------------------------------------------

def test_an_event_of_the_jobs_producer_resumes_it_with_its_data(api, producer, worker, admin,
                                                                make_key, clock):
    job_id, token = running(api, producer, worker)
    other = make_key("producer-2", "producer")
    answer = suspend(api, worker, job_id, token,
                     wait_for={"event": "order.shipped", "key": "1001",
                               "timeout_seconds": 86400})
    assert answer.json["waiting_for"] == {
        "kind": "event", "event": "order.shipped", "key": "1001",
        "until": to_rfc3339(clock.now_us() + 86_400_000_000)}

    # Another producer's event, or another key, wakes nothing of this producer's.
    assert post_event(api, other, name="order.shipped", key="1001").json == {"woken": 0}
    assert post_event(api, producer, name="order.shipped", key="1002").json == {"woken": 0}
    assert api.get(admin, job_id).json["status"] == "suspended"

    posted = post_event(api, producer, name="order.shipped", key="1001",
                        data={"carrier": "DHL"})

    assert posted.status_code == 200
    assert posted.json == {"woken": 1}
    claimed = api.claim(worker).json
    assert claimed["id"] == job_id
    assert claimed["resumed"]["by"] == "event"
    assert claimed["resumed"]["data"] == {"carrier": "DHL"}
    # The other producer's event stays its own, kept for a wait of its own jobs.
    assert post_event(api, producer, name="order.shipped", key="1001").json == {"woken": 0}


def test_an_event_wakes_every_job_waiting_for_it_and_an_admin_names_the_producer(
        api, producer, worker, admin):
    ids = []
    for _ in range(3):
        job_id, token = running(api, producer, worker)
        suspend(api, worker, job_id, token,
                wait_for={"event": "batch.done", "timeout_seconds": 600})
        ids.append(job_id)

    posted = post_event(api, admin, name="batch.done", producer="producer-1")

    assert posted.json == {"woken": 3}
    assert sorted(api.claim(worker).json["id"] for _ in ids) == ids


def test_an_event_posted_before_the_wait_is_kept_and_resumes_it_at_once(api, producer,
                                                                        worker, admin):
    assert post_event(api, producer, name="invoice.paid", key="7",
                      data={"amount": 12}).json == {"woken": 0}
    job_id, token = running(api, producer, worker)

    answer = suspend(api, worker, job_id, token,
                     wait_for={"event": "invoice.paid", "key": "7", "timeout_seconds": 60})

    assert answer.status_code == 200
    assert answer.json["status"] == "pending"
    assert answer.json["resumed"]["data"] == {"amount": 12}
    assert "waiting_for" not in answer.json
    assert api.claim(worker).json["resumed"]["by"] == "event"
    # Taken: the next wait for it waits.
    second, token = running(api, producer, worker)
    assert suspend(api, worker, second, token, wait_for={
        "event": "invoice.paid", "key": "7", "timeout_seconds": 60}).json["status"] == \
        "suspended"


def test_an_idempotency_key_names_one_event_whatever_else_is_sent_with_it(api, producer,
                                                                          worker):
    key = {"Idempotency-Key": "one"}
    job_id, lease = running(api, producer, worker)
    suspend(api, worker, job_id, lease, wait_for={"event": "b", "timeout_seconds": 60})

    assert post_event(api, producer, key, name="a").json == {"woken": 0}
    again = post_event(api, producer, key, name="b")  # another name, the same key

    assert (again.status_code, again.json) == (200, {"woken": 0})
    assert again.headers["Idempotent-Replayed"] == "true"
    assert api.get(producer, job_id).json["status"] == "suspended"


def test_an_event_sent_again_with_its_idempotency_key_is_one_event(api, producer, worker):
    key = {"Idempotency-Key": "paid-7"}
    first = post_event(api, producer, key, name="invoice.paid", key="7")
    again = post_event(api, producer, key, name="invoice.paid", key="7")

    assert (first.json, again.json) == ({"woken": 0}, {"woken": 0})
    assert again.headers["Idempotent-Replayed"] == "true"
    # One event kept, for one wait.
    one, token = running(api, producer, worker)
    two, token_two = running(api, producer, worker)
    wait = {"wait_for": {"event": "invoice.paid", "key": "7", "timeout_seconds": 60}}
    assert suspend(api, worker, one, token, **wait).json["status"] == "pending"
    assert suspend(api, worker, two, token_two, **wait).json["status"] == "suspended"


# -- tokens -----------------------------------------------------------------------------------

def test_a_token_resumes_its_job_once_without_an_api_key(api, client, producer, worker, db_url,
                                                          app):
    job_id, lease = running(api, producer, worker)
    answer = suspend(api, worker, job_id, lease,
                     wait_for={"token": True, "timeout_seconds": 604800})
    waitpoint = answer.json["waitpoint"]
    assert waitpoint["url"] == f"/waitpoints/{waitpoint['token']}"
    assert len(waitpoint["token"]) >= 32
    # Shown once: reads never show it.
    assert "waitpoint" not in api.get(producer, job_id).json

    done = client.post(waitpoint["url"], json={"data": {"approved": True}})

    assert done.status_code == 200, done.json
    assert done.json["job_id"] == job_id
    again = client.post(waitpoint["url"], json={"data": {"approved": False}})
    assert again.status_code == 409
    assert again.json["type"].endswith("/wait-ended")
    assert (again.json["ended_at"], again.json["ended_by"]) == (done.json["completed_at"],
                                                                "token")
    claimed = api.claim(worker).json
    assert claimed["resumed"]["by"] == "token"
    assert claimed["resumed"]["data"] == {"approved": True}
    # Stored hashed: the token itself is nowhere in the database.
    engine = app.extensions["queuelog"].db.engine
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT token_hash FROM job_waits")).scalars().all()
    assert stored and waitpoint["token"] not in stored


def test_an_unknown_token_is_a_404(client):
    answer = client.post("/waitpoints/not-a-token", json={})
    assert answer.status_code == 404
    assert answer.headers["Content-Type"] == "application/problem+json"


# -- timeouts and cancel ----------------------------------------------------------------------

@pytest.mark.parametrize("wait_for", [
    {"event": "never", "timeout_seconds": 30},
    {"token": True, "timeout_seconds": 30},
])
def test_a_wait_ends_by_its_timeout_with_no_data(api, client, producer, worker, clock,
                                                 wait_for):
    job_id, lease = running(api, producer, worker)
    answer = suspend(api, worker, job_id, lease, wait_for=wait_for)

    clock.advance(30)

    claimed = api.claim(worker).json
    assert claimed["id"] == job_id
    assert claimed["resumed"]["by"] == "timeout"
    assert claimed["resumed"]["data"] is None
    # What came too late changes nothing.
    if "token" in wait_for:
        late = client.post(answer.json["waitpoint"]["url"], json={})
        assert late.status_code == 409
        assert late.json["ended_by"] == "timeout"
    else:
        assert post_event(api, producer, name="never").json == {"woken": 0}


def test_a_suspended_job_is_cancelled_at_once_and_its_token_is_spent(api, client, producer,
                                                                     worker):
    job_id, lease = running(api, producer, worker)
    answer = suspend(api, worker, job_id, lease, wait_for={"token": True, "timeout_seconds": 60})

    cancelled = api.cancel(producer, job_id)

    assert cancelled.status_code == 200
    assert cancelled.json["status"] == "cancelled"
    late = client.post(answer.json["waitpoint"]["url"], json={})
    assert late.status_code == 409
    assert late.json["ended_by"] == "cancel"


# -- what a suspended job holds ---------------------------------------------------------------

def test_a_suspended_job_holds_no_slot_of_its_types_cap(api, client, producer, worker, admin):
    assert client.patch("/types/email", json={"max_running": 1},
                        headers=admin.headers).status_code == 200
    first, lease = running(api, producer, worker)
    second = api.enqueue(producer).json["id"]
    assert api.claim(worker).status_code == 204  # the cap: one runs

    suspend(api, worker, first, lease, seconds=600)

    assert api.claim(worker).json["id"] == second


def test_a_suspended_job_keeps_its_ordered_keys_turn(api, client, producer, worker, admin):
    assert client.patch("/types/email", json={"ordering": "key"},
                        headers=admin.headers).status_code == 200
    first, lease = running(api, producer, worker, concurrency_key="acct-1")
    second = api.enqueue(producer, concurrency_key="acct-1").json["id"]
    suspend(api, worker, first, lease, wait_for={"event": "go", "timeout_seconds": 600})

    assert api.claim(worker).status_code == 204  # its key's next job waits behind it
    assert api.get(admin, second).json["status"] == "waiting"
    post_event(api, producer, name="go")
    resumed = api.claim(worker).json
    assert resumed["id"] == first
    api.complete(worker, first, lease_token=resumed["lease_token"])
    assert api.claim(worker).json["id"] == second


def test_a_repeat_of_a_suspend_that_landed_answers_the_job_again(api, producer, worker):
    job_id, lease = running(api, producer, worker)
    first = suspend(api, worker, job_id, lease, seconds=60)
    again = suspend(api, worker, job_id, lease, seconds=60)
    assert again.status_code == 200
    assert again.json["status"] == "suspended"
    assert again.json["waiting_for"] == first.json["waiting_for"]


# -- refusals ---------------------------------------------------------------------------------

def test_a_suspend_by_a_worker_not_holding_the_job_is_a_409(api, producer, worker, make_key):
    job_id, lease = running(api, producer, worker)
    other = make_key("worker-2", "worker")
    assert suspend(api, other, job_id, lease, seconds=60).status_code == 409
    pending = api.enqueue(producer).json["id"]
    refused = suspend(api, worker, pending, "t" * 10, seconds=60)
    assert refused.status_code == 409
    assert "pending, not running" in refused.json["detail"]


@pytest.mark.parametrize(("body", "field"), [
    ({}, "seconds"),
    ({"seconds": 60, "until": "2030-01-01T00:00:00Z"}, "until"),
    ({"seconds": 60, "wait_for": {"token": True, "timeout_seconds": 9}}, "wait_for"),
    ({"seconds": 0}, "seconds"),
    ({"seconds": 31_536_001}, "seconds"),
    ({"until": "2001-01-01T00:00:00Z"}, "until"),
    ({"until": "2099-01-01T00:00:00Z"}, "until"),
    ({"wait_for": {"event": "x", "token": True, "timeout_seconds": 9}}, "wait_for.token"),
    ({"wait_for": {"event": "x"}}, "wait_for.timeout_seconds"),
    ({"wait_for": {"event": "x" * 201, "timeout_seconds": 9}}, "wait_for.event"),
    ({"wait_for": {"event": "paid\n", "timeout_seconds": 9}}, "wait_for.event"),
    ({"wait_for": {"event": "x", "key": "k" * 256, "timeout_seconds": 9}}, "wait_for.key"),
    ({"wait_for": {"token": False, "timeout_seconds": 9}}, "wait_for.token"),
])
def test_a_suspend_with_a_bad_wait_is_a_422_naming_the_field(api, producer, worker, body,
                                                             field):
    job_id, lease = running(api, producer, worker)
    answer = suspend(api, worker, job_id, lease, **body)
    assert answer.status_code == 422, answer.json
    assert field in answer.json["errors"], answer.json["errors"]
    assert api.get(worker, job_id).json["status"] == "running"  # nothing changed


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "x" * 201}, "name"),
    ({"name": "order\x07"}, "name"),
    ({"name": ""}, "name"),
    ({"name": "x", "key": "k" * 256}, "key"),
    ({"name": "x", "data": {"blob": "x" * 70_000}}, "data"),
])
def test_a_bad_event_is_a_422_naming_the_field(api, producer, body, field):
    answer = post_event(api, producer, **body)
    assert answer.status_code == 422, answer.json
    assert field in answer.json["errors"]


def test_an_event_is_for_the_callers_jobs_or_an_admins_named_producers(api, producer,
                                                                        make_key, admin):
    other = make_key("producer-2", "producer")
    assert post_event(api, producer, name="x", producer="producer-1").status_code == 200
    refused = post_event(api, other, name="x", producer="producer-1")
    assert refused.status_code == 403
    assert post_event(api, admin, name="x").json == {"woken": 0}  # its own jobs'
    assert post_event(api, admin, name="x", producer="producer-1").status_code == 200


def test_a_suspended_job_is_never_purged_and_its_wait_goes_with_it_once_finished(
        api, producer, worker, app, clock):
    service = app.extensions["queuelog"].jobs
    engine = app.extensions["queuelog"].db.engine
    job_id, lease = running(api, producer, worker)
    suspend(api, worker, job_id, lease, wait_for={"token": True, "timeout_seconds": 600})
    clock.advance(60)

    assert service.purge(older_than_seconds=1) == 0  # suspended: not finished
    assert api.cancel(producer, job_id).json["status"] == "cancelled"
    clock.advance(60)
    assert service.purge(older_than_seconds=1) == 1

    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM job_waits")).scalar() == 0


def test_an_event_kept_is_forgotten_after_its_keeping(api, producer, worker, app, clock):
    assert post_event(api, producer, name="late", key="1").json == {"woken": 0}
    clock.advance(86_400 + 61)  # past QUEUELOG_EVENT_KEEP_SECONDS (and the next pass)
    engine = app.extensions["queuelog"].db.engine
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM posted_events")).scalar() == 0
    job_id, lease = running(api, producer, worker)
    assert suspend(api, worker, job_id, lease, wait_for={
        "event": "late", "key": "1", "timeout_seconds": 60}).json["status"] == "suspended"


def test_a_suspended_jobs_dependents_wait_until_it_ends(api, producer, worker, admin, clock):
    first, lease = running(api, producer, worker)
    dependent = api.enqueue(producer, depends_on=[first]).json["id"]
    suspend(api, worker, first, lease, seconds=60)
    assert api.get(admin, dependent).json["status"] == "waiting"

    clock.advance(60)  # resumed: pending, not finished
    assert api.get(admin, dependent).json["status"] == "waiting"
    claimed = api.claim(worker).json
    assert claimed["id"] == first
    api.complete(worker, first, lease_token=claimed["lease_token"])
    assert api.get(admin, dependent).json["status"] == "pending"


def test_a_tokens_data_over_the_payload_limit_is_a_422_and_spends_nothing(api, client,
                                                                           producer, worker):
    job_id, lease = running(api, producer, worker)
    url = suspend(api, worker, job_id, lease,
                  wait_for={"token": True, "timeout_seconds": 60}).json["waitpoint"]["url"]

    refused = client.post(url, json={"data": {"blob": "x" * 70_000}})

    assert refused.status_code == 422
    assert "data" in refused.json["errors"]
    assert client.post(url, json={"data": {"ok": True}}).status_code == 200


def _wait_ends(app: Any) -> list[tuple[Any, ...]]:
    with app.extensions["queuelog"].db.engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(
            "SELECT job_id, resolved_by FROM job_waits ORDER BY job_id"))]


def test_a_cancel_ends_the_wait_so_that_no_moment_of_it_stays_due(api, client, producer,
                                                                   worker, admin, app, clock):
    one, lease = running(api, producer, worker)
    suspend(api, worker, one, lease, wait_for={"event": "x", "timeout_seconds": 30})
    two, lease_two = running(api, producer, worker)
    suspend(api, worker, two, lease_two, seconds=30)

    api.cancel(producer, one)
    bulk = client.post("/jobs/cancel-many", json={"status": "suspended"},
                       headers=admin.headers)

    assert bulk.status_code == 200, bulk.json
    assert _wait_ends(app) == [(one, "cancel"), (two, "cancel")]
    clock.advance(31)  # their moments pass: nothing resumes a cancelled job
    assert {api.get(admin, job).json["status"] for job in (one, two)} == {"cancelled"}


def test_a_wait_its_job_left_otherwise_is_ended_once_its_moment_passes(api, producer, worker,
                                                                       app, clock):
    job_id, lease = running(api, producer, worker)
    suspend(api, worker, job_id, lease, seconds=30)
    with app.extensions["queuelog"].db.engine.begin() as conn:  # as no code path leaves it
        conn.execute(text("UPDATE jobs SET status = 'cancelled' WHERE id = :id"),
                     {"id": job_id})

    clock.advance(31)

    assert _wait_ends(app) == [(job_id, "orphaned")]


def test_a_fair_types_job_resumes_into_its_rounds_and_is_claimed_again(api, client, producer,
                                                                         worker, admin):
    assert client.patch("/types/email", json={"fairness": "key"},
                        headers=admin.headers).status_code == 200
    job_id, lease = running(api, producer, worker, concurrency_key="acct-1")
    other = api.enqueue(producer, concurrency_key="acct-2").json["id"]
    suspend(api, worker, job_id, lease, wait_for={"event": "go", "timeout_seconds": 60})
    post_event(api, producer, name="go")

    claimed = {api.claim(worker).json["id"] for _ in range(2)}

    assert claimed == {job_id, other}


def test_cancelling_a_suspended_job_passes_its_ordered_keys_turn_on(api, client, producer,
                                                                     worker, admin):
    assert client.patch("/types/email", json={"ordering": "key"},
                        headers=admin.headers).status_code == 200
    first, lease = running(api, producer, worker, concurrency_key="acct-1")
    second = api.enqueue(producer, concurrency_key="acct-1").json["id"]
    suspend(api, worker, first, lease, seconds=600)
    assert api.get(admin, second).json["status"] == "waiting"

    api.cancel(producer, first)

    assert api.get(admin, second).json["status"] == "pending"
    assert api.claim(worker).json["id"] == second


def test_a_job_resuming_into_a_unique_key_a_twin_took_resumes_without_it(api, producer, worker,
                                                                         admin):
    unique = {"key": "sync-7", "while": ["pending"]}
    job_id, lease = running(api, producer, worker, unique=unique)
    twin = api.enqueue(producer, unique=unique).json["id"]  # the key is free while it runs
    assert twin != job_id
    suspend(api, worker, job_id, lease, wait_for={"event": "go", "timeout_seconds": 60})

    assert post_event(api, producer, name="go").json == {"woken": 1}

    assert api.get(admin, job_id).json["status"] == "pending"
    assert api.get(admin, twin).json["status"] == "pending"  # still holding the key
