"""Tags and trace context (contract §20) on both engines, through the HTTP API: a job's tags
are a set, stored beside it, shown and filtered by (GET /jobs?tag=, through its index); the
W3C trace context of the request that enqueued it reaches the worker's claim unchanged,
through retries, batches, workflows and schedules; a job without either writes nothing
beside its row; retention removes both with the job."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event, text

from app.jobs.sql.repository import JobRepository
from app.storage.engine import Database, make_engine
from tests.conftest import Api, Key

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACESTATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
TRACED = {"traceparent": TRACEPARENT, "tracestate": TRACESTATE}


def rows(app: Any, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    with app.extensions["queuelog"].db.engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(sql), params)]


def side_rows(app: Any, job_id: int) -> tuple[int, int]:
    """How many job_tags and job_traces rows the job has."""
    [(tags,)] = rows(app, "SELECT COUNT(*) FROM job_tags WHERE job_id = :id", id=job_id)
    [(traces,)] = rows(app, "SELECT COUNT(*) FROM job_traces WHERE job_id = :id", id=job_id)
    return int(tags), int(traces)


# -- tags ----------------------------------------------------------------------------------------

def test_tags_are_a_set_stored_sorted_and_shown_on_enqueue_read_and_listing(api, producer):
    created = api.enqueue(producer, tags=["zeta", "alpha", "zeta", "mid dle"])
    assert created.status_code == 201, created.json
    assert created.json["tags"] == ["alpha", "mid dle", "zeta"]
    assert created.json["trace"] is None
    job_id = created.json["id"]
    assert api.get(producer, job_id).json["tags"] == ["alpha", "mid dle", "zeta"]
    [listed] = api.list(producer).json["jobs"]
    assert listed["tags"] == ["alpha", "mid dle", "zeta"] and listed["trace"] is None
    untagged = api.enqueue(producer, tags=None).json
    assert untagged["tags"] == [] and api.get(producer, untagged["id"]).json["tags"] == []


def _nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("tags,field", [
    ([f"t{i}" for i in range(11)], "tags"),
    (["x" * 65], "tags.0"),
    (["ok", ""], "tags.1"),
    (["café"], "tags.0"),
    (["a\x00b"], "tags.0"),
    (["tab\there"], "tags.0"),
    ([7], "tags.0"),
    ("one-tag", "tags"),
    ({"a": 1}, "tags"),
    # Hostile: a list nested 100 deep, a huge number, fullwidth letters.
    (_nested(100), "tags.0"),
    ([10 ** 400], "tags.0"),
    (["\uff56\uff49\uff50"], "tags.0"),
])
def test_bad_tags_are_a_422_naming_the_field_and_store_nothing(app, api, producer, tags, field):
    refused = api.enqueue(producer, tags=tags)
    assert refused.status_code == 422, refused.json
    assert field in refused.json["errors"], refused.json
    assert rows(app, "SELECT COUNT(*) FROM jobs") == [(0,)]


def test_a_batch_item_with_bad_tags_names_its_position(api, client, producer):
    refused = client.post("/jobs/batch", headers=producer.headers, json={
        "jobs": [{"type": "email", "tags": ["fine"]}, {"type": "email", "tags": ["x" * 65]}]})
    assert refused.status_code == 422
    assert "jobs.1.tags.0" in refused.json["errors"], refused.json


def test_ten_tags_of_64_characters_are_taken(api, producer):
    tags = [f"{i}" + "x" * 63 for i in range(10)]
    created = api.enqueue(producer, tags=tags)
    assert created.status_code == 201, created.json
    assert created.json["tags"] == sorted(tags)


def test_an_idempotent_replay_with_other_tags_is_refused_and_with_the_same_set_replayed(
        api, producer):
    first = api.enqueue(producer, idempotency_key="k-1", tags=["b", "a"])
    assert first.status_code == 201
    again = api.enqueue(producer, idempotency_key="k-1", tags=["a", "b", "a"])
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json["tags"] == ["a", "b"]
    other = api.enqueue(producer, idempotency_key="k-1", tags=["a"])
    assert other.status_code == 422
    assert "idempotency_key" in other.json["errors"]


def test_a_unique_twin_met_keeps_its_own_tags_and_trace(app, api, producer):
    first = api.enqueue(producer, tags=["old"], headers=TRACED,
                        unique={"key": "k", "on_conflict": "replace"})
    assert first.status_code == 201
    replaced = api.enqueue(producer, tags=["new"], payload={"v": 2},
                           unique={"key": "k", "on_conflict": "replace"})
    assert replaced.status_code == 200 and replaced.headers["Deduplicated"] == "replaced"
    assert replaced.json["id"] == first.json["id"] and replaced.json["payload"] == {"v": 2}
    assert replaced.json["tags"] == ["old"] and replaced.json["trace"] == TRACED
    assert side_rows(app, first.json["id"]) == (1, 1)


def test_get_jobs_by_tag_filters_with_the_other_filters_and_pages_by_id(api, producer,
                                                                         admin):
    tagged = [api.enqueue(producer, type=kind, tags=["red", f"n{i}"]).json["id"]
              for i, kind in enumerate(["email", "pdf", "email", "email", "pdf"])]
    api.enqueue(producer, tags=["blue"])
    api.enqueue(producer)
    listed = api.list(admin, tag="red").json
    assert [job["id"] for job in listed["jobs"]] == tagged
    assert all("red" in job["tags"] for job in listed["jobs"])
    emails = api.list(admin, tag="red", type="email").json["jobs"]
    assert [job["id"] for job in emails] == [tagged[0], tagged[2], tagged[3]]
    assert [job["id"] for job in api.list(producer, tag="n1").json["jobs"]] == [tagged[1]]
    assert api.list(admin, tag="green").json == {"jobs": [], "next_cursor": None}

    seen, cursor = [], None
    while True:
        page = api.list(admin, tag="red", limit="2", **({"cursor": cursor} if cursor else {}))
        assert page.status_code == 200, page.json
        seen += [job["id"] for job in page.json["jobs"]]
        cursor = page.json["next_cursor"]
        if cursor is None:
            break
    assert seen == tagged


def test_a_worker_lists_by_tag_only_the_jobs_it_holds(api, producer, worker):
    held = api.enqueue(producer, tags=["red"]).json["id"]
    api.enqueue(producer, tags=["red"])
    assert api.claim(worker).json["id"] == held
    assert [job["id"] for job in api.list(worker, tag="red").json["jobs"]] == [held]


@pytest.mark.parametrize("tag", ["x" * 65, "", "caf\u00e9", "a\x00b", "\x01"])
def test_a_bad_tag_filter_is_a_422_naming_tag(api, admin, tag):
    refused = api.list(admin, tag=tag)
    assert refused.status_code == 422, refused.json
    assert "tag" in refused.json["errors"], refused.json


def test_cancel_many_takes_the_jobs_of_a_tag(api, client, producer, admin):
    red = [api.enqueue(producer, tags=["red"]).json["id"] for _ in range(3)]
    blue = api.enqueue(producer, tags=["blue"]).json["id"]
    cancelled = client.post("/jobs/cancel-many", headers=admin.headers, json={"tag": "red"})
    assert cancelled.status_code == 200, cancelled.json
    assert cancelled.json == {"count": 3, "ids": red}
    assert api.get(admin, blue).json["status"] == "pending"


def test_sqlite_listing_by_tag_walks_the_tags_index(sqlite_template):
    database = Database(make_engine(f"sqlite:///{sqlite_template}"))
    statements: list[Any] = []
    plans = []
    with database.read() as conn:
        event.listen(conn, "before_cursor_execute",
                     lambda *args: statements.append((args[2], args[3])))
        for options in ({}, {"job_type": "email"}, {"status": "pending"},
                        {"status": "failed"}, {"status": "running"}, {"producer": "p"},
                        {"descending": True, "after_id": 10}):
            JobRepository(conn).list_jobs(after_id=options.pop("after_id", 0), limit=51,
                                          tag="red", **options)
            statement, parameters = statements[-1]
            plans.append([row[-1] for row in conn.exec_driver_sql(
                "EXPLAIN QUERY PLAN " + statement, parameters).all()])
    database.engine.dispose()
    for plan in plans:
        assert any("ix_job_tags_tag_job_id (tag=? AND job_id" in step for step in plan), plan
        assert not any("TEMP B-TREE" in step for step in plan), plan  # already in id order
        # No walk of the tags, nor of the jobs (running: only its partial index of the
        # running rows, as the listing of running jobs reads them).
        assert not any(step.startswith("SCAN job_tags") or step == "SCAN jobs"
                       for step in plan), plan


# -- trace context -------------------------------------------------------------------------------

def test_the_trace_of_post_jobs_reaches_the_claim_unchanged_and_again_after_a_retry(
        app, api, producer, worker, admin):
    created = api.enqueue(producer, headers=TRACED, tags=["traced"])
    assert created.status_code == 201
    assert created.json["trace"] == TRACED
    job_id = created.json["id"]
    assert side_rows(app, job_id) == (1, 1)
    assert api.get(admin, job_id).json["trace"] == TRACED

    claimed = api.claim(worker).json
    assert claimed["id"] == job_id and claimed["trace"] == TRACED
    failed = api.fail(worker, job_id, lease_token=claimed["lease_token"], retry_in_seconds=0)
    assert failed.json["status"] == "pending"
    again = api.claim(worker).json
    assert again["id"] == job_id and again["retry_count"] == 1
    assert again["trace"] == TRACED


def test_a_trace_without_tracestate_shows_it_null_and_a_job_without_one_claims_null(
        api, producer, worker):
    traced = api.enqueue(producer, headers={"traceparent": TRACEPARENT}).json["id"]
    plain = api.enqueue(producer).json["id"]
    claimed = api.client.post("/jobs/claim-many", headers=worker.headers,
                              json={"max_jobs": 5}).json["jobs"]
    assert {job["id"]: job["trace"] for job in claimed} == {
        traced: {"traceparent": TRACEPARENT, "tracestate": None}, plain: None}


def test_a_long_polling_claim_carries_the_trace(api, producer, worker):
    api.enqueue(producer, headers=TRACED)
    claimed = api.claim(worker, wait_seconds=1)
    assert claimed.status_code == 200 and claimed.json["trace"] == TRACED


@pytest.mark.parametrize("headers", [
    {"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"},
    {"traceparent": "not a traceparent", "tracestate": "a=b"},
    {"traceparent": "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
])
def test_an_invalid_traceparent_is_ignored_and_the_job_stored(app, api, producer, worker,
                                                              headers):
    created = api.enqueue(producer, headers=headers)
    assert created.status_code == 201, created.json
    assert created.json["trace"] is None
    assert side_rows(app, created.json["id"]) == (0, 0)
    assert api.claim(worker).json["trace"] is None


def test_a_job_without_tags_or_trace_writes_nothing_beside_its_row(app, api, client,
                                                                   producer):
    single = api.enqueue(producer).json["id"]
    batch = client.post("/jobs/batch", headers=producer.headers,
                        json={"jobs": [{"type": "email"}, {"type": "pdf", "tags": []}]})
    workflow = client.post("/workflows", headers=producer.headers, json={
        "jobs": [{"ref": "a", "type": "email"}, {"ref": "b", "type": "pdf",
                                                 "depends_on": ["a"]}]})
    assert batch.status_code == 201 and workflow.status_code == 201
    assert single and rows(app, "SELECT COUNT(*) FROM job_tags") == [(0,)]
    assert rows(app, "SELECT COUNT(*) FROM job_traces") == [(0,)]


def test_every_item_of_a_batch_carries_the_batch_requests_trace(app, api, client, producer,
                                                                worker):
    made = client.post("/jobs/batch", headers={**producer.headers, **TRACED}, json={"jobs": [
        {"type": "email", "tags": ["b", "a"]}, {"type": "pdf"},
        {"type": "sync", "ref": "last", "tags": ["c"]}]})
    assert made.status_code == 201, made.json
    jobs = made.json["jobs"]
    assert [job["tags"] for job in jobs] == [["a", "b"], [], ["c"]]
    assert all(job["trace"] == TRACED for job in jobs)
    assert rows(app, "SELECT COUNT(*) FROM job_traces") == [(3,)]
    claimed = client.post("/jobs/claim-many", headers=worker.headers,
                          json={"max_jobs": 10}).json["jobs"]
    assert len(claimed) == 3 and all(job["trace"] == TRACED for job in claimed)


def test_a_batch_with_dependencies_takes_the_graph_path_and_keeps_tags_and_trace(
        app, client, producer):
    made = client.post("/jobs/batch", headers={**producer.headers, **TRACED}, json={"jobs": [
        {"type": "email", "ref": "first", "tags": ["x"]},
        {"type": "pdf", "depends_on": ["first"], "tags": ["y"]}]})
    assert made.status_code == 201, made.json
    assert [job["tags"] for job in made.json["jobs"]] == [["x"], ["y"]]
    assert [job["trace"] for job in made.json["jobs"]] == [TRACED, TRACED]


def test_every_job_of_a_workflow_carries_the_requests_trace(app, api, client, producer,
                                                            worker, admin):
    created = client.post("/workflows", headers={**producer.headers, **TRACED}, json={
        "jobs": [{"ref": "charge", "type": "email", "tags": ["order-7"]},
                 {"ref": "ship", "type": "pdf", "depends_on": ["charge"]}]})
    assert created.status_code == 201, created.json
    ids = created.json["jobs"]
    assert api.get(admin, ids["charge"]).json["tags"] == ["order-7"]
    first = api.claim(worker).json
    assert first["id"] == ids["charge"] and first["trace"] == TRACED
    api.complete(worker, first["id"], lease_token=first["lease_token"])
    second = api.claim(worker).json
    assert second["id"] == ids["ship"] and second["trace"] == TRACED


def test_the_jobs_a_schedule_fires_carry_the_trace_of_its_creation(app, api, client, clock,
                                                                   admin, worker):
    created = client.post("/schedules", headers={**admin.headers, **TRACED}, json={
        "name": "minutely", "cron": "* * * * *",
        "job": {"type": "email", "tags": ["nightly", "audit"]}})
    assert created.status_code == 201, created.json
    workflow = client.post("/schedules", headers=admin.headers, json={
        "name": "untraced", "cron": "* * * * *",
        "workflow": {"jobs": [{"ref": "a", "type": "pdf", "tags": ["wf"]}]}})
    assert workflow.status_code == 201, workflow.json
    # A PATCH does not change the trace.
    assert client.patch("/schedules/minutely", headers=admin.headers,
                        json={"catch_up": "all"}).status_code == 200
    clock.advance(61)
    assert app.extensions["queuelog"].schedules.fire_due() == 2
    fired = {job["schedule"]: job for job in api.list(admin, limit="10").json["jobs"]}
    assert fired["minutely"]["tags"] == ["audit", "nightly"]
    assert fired["minutely"]["trace"] == TRACED
    assert fired["untraced"]["tags"] == ["wf"] and fired["untraced"]["trace"] is None
    claimed = {job["schedule"]: job for job in client.post(
        "/jobs/claim-many", headers=worker.headers, json={"max_jobs": 5}).json["jobs"]}
    assert claimed["minutely"]["trace"] == TRACED and claimed["untraced"]["trace"] is None


def test_a_traced_schedules_workflow_jobs_carry_its_trace(app, api, client, clock, admin):
    client.post("/schedules", headers={**admin.headers, **TRACED}, json={
        "name": "flow", "cron": "* * * * *",
        "workflow": {"jobs": [{"ref": "a", "type": "pdf"},
                              {"ref": "b", "type": "email", "depends_on": ["a"]}]}})
    clock.advance(61)
    assert app.extensions["queuelog"].schedules.fire_due() == 1
    jobs = api.list(admin).json["jobs"]
    assert len(jobs) == 2 and all(job["trace"] == TRACED for job in jobs)


# -- retention -----------------------------------------------------------------------------------

def test_retention_removes_a_jobs_tags_and_trace_with_it(app, api, client, clock, producer,
                                                        worker, admin):
    client.patch("/types/email", headers=admin.headers,
                 json={"retention": {"completed_seconds": 60}})
    done = _finished(api, producer, worker, tags=["a", "b"], headers=TRACED)
    kept = api.enqueue(producer, tags=["a"], headers=TRACED).json["id"]
    assert side_rows(app, done) == (2, 1)
    clock.advance(120)  # maintenance, which moving the clock runs, removes it
    assert side_rows(app, done) == (0, 0)
    assert side_rows(app, done) == (0, 0)
    assert side_rows(app, kept) == (1, 1)


def test_purge_removes_a_jobs_tags_and_trace_with_it(app, api, clock, producer, worker):
    done = _finished(api, producer, worker, tags=["a"], headers=TRACED)
    clock.advance(3 * 86_400)
    deleted = app.extensions["queuelog"].jobs.purge(older_than_seconds=86_400)
    assert deleted == 1, deleted
    assert side_rows(app, done) == (0, 0)


def _finished(api: Api, producer: Key, worker: Key, **enqueue: Any) -> int:
    job_id = int(api.enqueue(producer, **enqueue).json["id"])
    claimed = api.claim(worker).json
    assert claimed["id"] == job_id
    assert api.complete(worker, job_id, lease_token=claimed["lease_token"]).status_code == 200
    return job_id


def test_a_batch_item_meeting_a_stored_twin_shows_the_twins_tags_not_its_own(client, producer):
    # A job the batch made shows what it was sent with; one it met shows what is stored.
    stored = client.post("/jobs", headers=producer.headers, json={
        "type": "email", "tags": ["stored"], "unique": {"key": "k"}})
    assert stored.status_code == 201, stored.json
    made = client.post("/jobs/batch", headers={**producer.headers, **TRACED}, json={"jobs": [
        {"type": "email", "tags": ["sent"], "unique": {"key": "k"}},
        {"type": "pdf", "tags": ["new"]}]})
    assert made.status_code == 201, made.json
    twin, new = made.json["jobs"]
    assert twin["id"] == stored.json["id"] and twin["deduplicated"] is True  # returned
    assert twin["tags"] == ["stored"] and twin["trace"] is None
    assert new["tags"] == ["new"] and new["trace"] == TRACED
