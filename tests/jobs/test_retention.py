"""Retention inside queuelog (contract §19) on both engines: each type's finished jobs past
their window are removed with their history by maintenance's chore, in short batches, and
nothing else is: never an unfinished job, never a job a waiting job depends on, never a job
with an idempotency key younger than 24 hours; two processes on one database remove each
job once."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import text

from app import create_app, stop_maintenance
from app.jobs.usecases.retention import RetentionWindows
from tests.conftest import Api, Key

DAY = 86_400


@pytest.fixture(autouse=True)
def retention_by_hand(request: pytest.FixtureRequest) -> None:
    """These tests run retention by hand, to see what each pass removes: the maintenance
    loop, whose rounds moving the clock runs (retention among them), is stopped."""
    if "app" in request.fixturenames:
        stop_maintenance(request.getfixturevalue("app"))


def remove_expired(app: Any, **options: Any) -> int:
    """Run the retention chore until its pass ends; the jobs it removed."""
    services = app.extensions["queuelog"]
    removed = 0
    while True:
        removed += services.jobs.retention.remove_expired(services.types.retention_windows,
                                                          **options)
        if not services.jobs.retention.pass_under_way:
            return removed


def stored(app: Any, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    with app.extensions["queuelog"].db.engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(sql), params)]


def finish(api: Api, producer: Key, worker: Key, outcome: str, **body: Any) -> int:
    """A job enqueued and taken to `outcome` now; its id."""
    job_id = api.enqueue(producer, max_retries=0, **body).json["id"]
    if outcome == "cancelled":
        return int(api.client.post(f"/jobs/{job_id}/cancel",
                                   headers=producer.headers).json["id"])
    claimed = api.claim(worker).json
    assert claimed["id"] == job_id
    if outcome == "completed":
        api.complete(worker, job_id, lease_token=claimed["lease_token"])
    else:
        api.fail(worker, job_id, lease_token=claimed["lease_token"], error="smtp 421 busy")
    return int(job_id)


def test_finished_jobs_past_their_window_go_with_their_history(app, api, client, clock,
                                                               producer, worker, admin):
    # email keeps completed jobs one hour, failed ones for ever; sync has the defaults
    # (7 days completed, 30 failed, 7 cancelled).
    patched = client.patch("/types/email", headers=admin.headers, json={
        "retention": {"completed_seconds": 3600, "failed_seconds": None}})
    assert patched.status_code == 200, patched.json
    assert patched.json["retention"] == {"completed_seconds": 3600, "failed_seconds": None,
                                         "cancelled_seconds": 7 * DAY}
    old = {(kind, outcome): finish(api, producer, worker, outcome, type=kind)
           for kind in ("email", "sync") for outcome in ("completed", "failed", "cancelled")}
    clock.advance(2 * 3600)
    young_email = finish(api, producer, worker, "completed", type="email")
    running = api.enqueue(producer, type="email").json["id"]
    assert api.claim(worker).json["id"] == running
    pending = api.enqueue(producer, type="sync").json["id"]

    assert remove_expired(app) == 1  # email's old completed job only
    ids = {row[0] for row in stored(app, "SELECT id FROM jobs")}
    assert old[("email", "completed")] not in ids
    assert ids == {*old.values(), young_email, running, pending} - {old[("email", "completed")]}

    clock.advance(8 * DAY)
    removed = remove_expired(app)
    ids = {row[0] for row in stored(app, "SELECT id FROM jobs")}
    # 8 days on: email's cancelled (7 days), sync's completed and cancelled, email's young
    # completed; kept: email's failed (for ever), sync's failed (30 days), the unfinished.
    assert ids == {old[("email", "failed")], old[("sync", "failed")], running, pending}
    assert removed == 4
    gone = [job_id for job_id in old.values() if job_id not in ids] + [young_email]
    for job_id in gone:
        assert stored(app, "SELECT job_id FROM job_attempts WHERE job_id = :id", id=job_id) == []
        assert stored(app, "SELECT job_id FROM job_events WHERE job_id = :id", id=job_id) == []
    assert api.get(admin, old[("sync", "completed")]).status_code == 404

    metrics = client.get("/metrics", headers=admin.headers).get_data(as_text=True)
    assert "queuelog_jobs_removed_total 5.0" in metrics


def test_a_job_an_unfinished_job_depends_on_stays_until_that_job_ends(app, api, client, clock,
                                                                  producer, worker, admin):
    client.patch("/types/email", headers=admin.headers,
                 json={"retention": {"completed_seconds": 60}})
    parent = finish(api, producer, worker, "completed")
    blocker = api.enqueue(producer, type="sync").json["id"]
    child = api.enqueue(producer, depends_on=[parent, blocker]).json["id"]
    assert api.get(producer, child).json["status"] == "waiting"
    clock.advance(120)

    assert remove_expired(app) == 0
    assert api.get(admin, parent).status_code == 200

    claimed = api.claim(worker, types=["sync"]).json
    api.complete(worker, blocker, lease_token=claimed["lease_token"])
    assert api.get(producer, child).json["status"] == "pending"
    clock.advance(DAY)  # past the idle wait
    # Still kept while the child may run (it reads its dependencies' results)...
    assert remove_expired(app) == 0
    claimed = api.claim(worker, types=["email"]).json
    assert claimed["id"] == child
    api.complete(worker, child, lease_token=claimed["lease_token"])
    clock.advance(DAY)
    # ...and removed once it ended: the parent and the child itself (email keeps 60 s).
    assert remove_expired(app) == 2
    assert api.get(admin, parent).status_code == 404


def test_the_idempotency_floor_keeps_a_keyed_job_for_24_hours(app, api, client, clock,
                                                              producer, worker, admin):
    client.patch("/types/email", headers=admin.headers,
                 json={"retention": {"completed_seconds": 60}})
    keyed = finish(api, producer, worker, "completed", idempotency_key="order-1001")
    plain = finish(api, producer, worker, "completed")
    clock.advance(3600)

    assert remove_expired(app) == 1
    assert api.get(admin, plain).status_code == 404
    replay = api.enqueue(producer, idempotency_key="order-1001", max_retries=0)
    assert (replay.status_code, replay.json["id"]) == (200, keyed)

    clock.advance(DAY)
    assert remove_expired(app) == 1
    assert api.get(admin, keyed).status_code == 404


def test_many_expired_jobs_are_removed_a_batch_at_a_time(app, api, client, clock, producer,
                                                         admin):
    client.patch("/types/email", headers=admin.headers,
                 json={"retention": {"cancelled_seconds": 60}})
    made = [api.enqueue(producer).json["id"] for _ in range(25)]
    assert client.post("/jobs/cancel-many", headers=admin.headers,
                       json={"type": "email"}).json["count"] == 25
    clock.advance(120)
    services = app.extensions["queuelog"]

    # Batches of 10, 4 per tick: email's completed and failed jobs (none) take one batch
    # each, then two full batches of its cancelled ones; the next tick goes on from there.
    first = services.jobs.retention.remove_expired(services.types.retention_windows,
                                                   max_batches=4, batch_jobs=10,
                                                   max_seconds=None)
    assert first == 20
    assert len(stored(app, "SELECT id FROM jobs")) == 5
    assert remove_expired(app, batch_jobs=10) == 5
    assert stored(app, "SELECT id FROM jobs") == []
    assert len(made) == 25


def test_a_window_shortened_is_kept_at_once_not_after_the_pause(app, api, client, clock,
                                                                 producer, admin):
    # Between passes retention pauses (a minute where the database tells every host); told
    # that a type's settings changed, the next round starts a pass with the new windows.
    services = app.extensions["queuelog"]
    retention = services.jobs.retention
    retention.idle_seconds = 3600
    job_id = api.enqueue(producer).json["id"]
    assert client.post(f"/jobs/{job_id}/cancel", headers=producer.headers).status_code == 200
    clock.advance(120)
    assert remove_expired(app) == 0  # kept 7 days; the next pass in an hour
    assert client.patch("/types/email", headers=admin.headers,
                        json={"retention": {"cancelled_seconds": 60}}).status_code == 200
    assert remove_expired(app) == 0  # not told: the pause holds
    retention.windows_changed()
    assert remove_expired(app) == 1
    assert api.get(admin, job_id).status_code == 404


def test_retention_settings_are_validated_and_null_restores_the_defaults(client, admin):
    for bad in ({"completed_seconds": 59}, {"failed_seconds": 315_360_001},
                {"cancelled_seconds": "7d"}, {"completed_seconds": 1.5}, {"kept": 60},
                {"completed_seconds": True}):
        refused = client.patch("/types/email", headers=admin.headers, json={"retention": bad})
        assert refused.status_code == 422, bad
        assert refused.json["errors"], refused.json
    assert client.patch("/types/email", headers=admin.headers,
                        json={"retention": {"completed_seconds": 60}}).json["retention"] == {
        "completed_seconds": 60, "failed_seconds": 30 * DAY, "cancelled_seconds": 7 * DAY}
    reset = client.patch("/types/email", headers=admin.headers, json={"retention": None})
    assert reset.json["retention"] == {"completed_seconds": 7 * DAY,
                                       "failed_seconds": 30 * DAY,
                                       "cancelled_seconds": 7 * DAY}


def test_the_defaults_come_from_the_environment_and_zero_keeps(app_config):
    app = create_app({**app_config, "RETENTION_COMPLETED_SECONDS": 0,
                      "RETENTION_FAILED_SECONDS": 600})
    try:
        windows = app.extensions["queuelog"].types.retention_windows()
    finally:
        app.extensions["queuelog"].db.engine.dispose()
    assert windows["email"] == RetentionWindows(completed=None, failed=600,
                                                cancelled=7 * DAY)


def test_two_processes_remove_each_expired_job_once(app_config, app, client, clock, producer,
                                                    admin):
    """Two apps (two processes' services) on one database run their retention at once:
    together they remove every expired job, each once, whichever took which batch."""
    client.patch("/types/email", headers=admin.headers,
                 json={"retention": {"cancelled_seconds": 60}})
    for _ in range(6):
        client.post("/jobs/batch", headers=producer.headers,
                    json={"jobs": [{"type": "email"} for _ in range(100)]})
    assert client.post("/jobs/cancel-many", headers=admin.headers,
                       json={"type": "email"}).json["count"] == 600
    clock.advance(120)
    other = create_app(app_config)
    counts: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def run(application: Any) -> None:
        try:
            start.wait(timeout=10)
            counts.append(remove_expired(application, batch_jobs=50))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(a,)) for a in (app, other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    other.extensions["queuelog"].db.engine.dispose()

    assert errors == []
    assert sum(counts) == 600
    assert stored(app, "SELECT id FROM jobs") == []
    assert stored(app, "SELECT count(*) FROM job_events")[0][0] == 0


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_unfinished_jobs_are_never_removed(app, api, client, clock, producer, worker, admin,
                                           status):
    client.patch("/types/email", headers=admin.headers,
                 json={"retention": {f"{status}_seconds": 60}})
    pending = api.enqueue(producer).json["id"]
    running = api.enqueue(producer).json["id"]
    api.claim(worker)
    clock.advance(365 * DAY)
    remove_expired(app)
    assert {row[0] for row in stored(app, "SELECT id FROM jobs")} == {pending, running}


def test_hostile_retention_bodies_are_422s_that_change_nothing(client, admin):
    deep: object = 60
    for _ in range(100):
        deep = {"completed_seconds": deep}
    before = client.get("/types/email", headers=admin.headers).json["retention"]
    for retention in (deep, {"completed_seconds": 10**400}, {"completed_seconds": -60},
                      {"completed_seconds": "\u0666\u0660"}, {"completed_seconds": [60]},
                      {"\uff43ompleted_seconds": 60}, [60], "7d"):
        answer = client.patch("/types/email", headers=admin.headers,
                              json={"retention": retention, "paused": True})
        assert answer.status_code == 422, retention
        assert answer.content_type == "application/problem+json"
    shown = client.get("/types/email", headers=admin.headers).json
    assert (shown["retention"], shown["paused"]) == (before, False)
