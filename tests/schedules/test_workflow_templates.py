"""A schedule whose template is a workflow, on both engines: created, shown and replaced
through the API with every bad template a 422 naming its field; each slot makes one workflow
(its dependencies honoured in claim order), catch-up makes one per missed slot, and racing
processes make one per slot, the unique index on the first job holding the slot."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from flask import Flask

from app import create_app
from app.core.callers import Caller, Role
from app.core.clock import ManualClock
from app.core.priorities import Priority
from app.jobs.domain.intake import new_job
from app.jobs.sql.repository import JobRepository
from app.schedules import service as schedule_service
from app.web.http import MAX_JSON_DEPTH
from tests.conftest import Api, Key
from tests.schedules.conftest import Schedules, micros, set_clock, utc

# export first; mail and archive once it completed; report after both, whatever they did.
NIGHTLY = {"name": "nightly-export", "jobs": [
    {"ref": "export", "type": "sync", "payload": {"table": "orders"}},
    {"ref": "mail", "type": "email", "depends_on": ["export"]},
    {"ref": "archive", "type": "pdf", "depends_on": ["export"], "priority": "high"},
    {"ref": "report", "type": "email", "depends_on": ["mail", "archive"],
     "on_dependency_failure": "run"},
]}
# As stored and shown: each job as a POST /jobs body with its defaults filled in.
NIGHTLY_SHOWN = {"name": "nightly-export", "jobs": [
    {"ref": "export", "type": "sync", "payload": {"table": "orders"}, "max_retries": 3},
    {"ref": "mail", "type": "email", "payload": {}, "max_retries": 3,
     "depends_on": ["export"]},
    {"ref": "archive", "type": "pdf", "payload": {}, "priority": "high", "max_retries": 3,
     "depends_on": ["export"]},
    {"ref": "report", "type": "email", "payload": {}, "max_retries": 3,
     "depends_on": ["mail", "archive"], "on_dependency_failure": "run"},
]}


def _create(schedules: Schedules, **body: Any) -> Any:
    body.setdefault("name", "nightly")
    body.setdefault("cron", "*/10 * * * *")
    return schedules.client.post("/schedules", json=body, headers=schedules.admin.headers)


def _workflows(schedules: Schedules) -> list[dict[str, Any]]:
    """Every workflow, oldest first, each with its jobs (as GET /workflows/{id} shows them)."""
    headers = schedules.admin.headers
    listed = schedules.client.get("/workflows", query_string={"limit": 500},
                                  headers=headers).get_json()["workflows"]
    return [schedules.client.get(f"/workflows/{summary['id']}", headers=headers).get_json()
            for summary in listed]


def _jobs_by_id(schedules: Schedules) -> dict[int, dict[str, Any]]:
    return {job["id"]: job for job in schedules.jobs()}


def _first_slots(schedules: Schedules) -> list[str]:
    """The slot each workflow was made for: its first job's scheduled_for, oldest first."""
    jobs = _jobs_by_id(schedules)
    return [jobs[workflow["jobs"][0]["id"]]["scheduled_for"][:19] + "Z"
            for workflow in _workflows(schedules)]


# -- the API --------------------------------------------------------------------------------


def test_a_workflow_template_is_stored_and_shown_in_place_of_a_job(
        schedules: Schedules) -> None:
    response = _create(schedules, workflow=NIGHTLY)
    assert response.status_code == 201
    body = response.get_json()
    assert body["workflow"] == NIGHTLY_SHOWN
    assert body["job"] is None
    assert body["last_job_id"] is None and body["last_workflow_id"] is None
    assert schedules.get("nightly").get_json() == body
    listed = schedules.client.get("/schedules", headers=schedules.admin.headers).get_json()
    assert listed["schedules"] == [body]
    # A job schedule shows the same fields, the other way round.
    plain = schedules.create(name="plain", cron="@daily").get_json()
    assert plain["workflow"] is None and plain["last_workflow_id"] is None
    assert plain["job"] == {"type": "email", "payload": {"to": "ops"}, "max_retries": 3}


def _jobs(*jobs: dict[str, Any]) -> dict[str, Any]:
    return {"jobs": list(jobs)}


_A = {"ref": "a", "type": "email"}


@pytest.mark.parametrize(("workflow", "field", "says"), [
    (_jobs(_A, {"ref": "b", "type": "email", "depends_on": ["nobody"]}),
     "workflow.jobs.1.depends_on", "No item has the ref 'nobody'"),
    (_jobs({"ref": "a", "type": "email", "depends_on": ["b"]},
           {"ref": "b", "type": "email", "depends_on": ["a"]}),
     "workflow.jobs", "A cycle: "),
    (_jobs(_A, {"ref": "b", "type": "fax", "depends_on": ["a"]}),
     "workflow.jobs.1.type", ""),  # not a configured type
    (_jobs(_A, {"ref": "a", "type": "email"}), "workflow.jobs.1.ref", "used by item 0"),
    (_jobs(_A, {"ref": "b", "type": "email", "depends_on": [17]}),
     "workflow.jobs.1.depends_on", "names its own jobs by ref"),
    (_jobs({"ref": "a", "type": "email", "depends_on": ["a"]}),
     "workflow.jobs.0.depends_on", "cannot depend on itself"),
    (_jobs({"type": "email"}), "workflow.jobs.0.ref", ""),
    (_jobs({"ref": "a", "type": "email", "unique": {"key": "k"}}), "workflow.jobs.0.unique", ""),
    (_jobs({"ref": "a", "type": "email", "run_at": "2027-01-16T00:00:00Z"}),
     "workflow.jobs.0.run_at", ""),
    (_jobs({"ref": "a", "type": "email", "delay_seconds": 5}),
     "workflow.jobs.0.delay_seconds", ""),
    (_jobs({"ref": "a", "type": "email", "idempotency_key": "k"}),
     "workflow.jobs.0.idempotency_key", ""),
    (_jobs(), "workflow.jobs", ""),
    (_jobs(*[{"ref": f"j{n}", "type": "email"} for n in range(1001)]), "workflow.jobs", ""),
    ({"name": "x" * 101, **_jobs(_A)}, "workflow.name", ""),
    ({"name": "nightly"}, "workflow.jobs", ""),
])
def test_a_bad_workflow_template_is_422_naming_its_field(
        schedules: Schedules, workflow: dict[str, Any], field: str, says: str) -> None:
    response = _create(schedules, workflow=workflow)
    assert response.status_code == 422
    errors = response.get_json()["errors"]
    assert field in errors, errors
    assert says in " ".join(errors[field])
    assert schedules.get("nightly").status_code == 404


def _nested(depth: int) -> dict[str, Any]:
    """A JSON object `depth` levels deep (`{}` is 1)."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def test_a_payload_post_workflows_takes_is_taken_by_a_workflow_template(
        schedules: Schedules, api: Api, producer: Key) -> None:
    def workflow(depth: int) -> dict[str, Any]:
        return _jobs(_A, {"ref": "b", "type": "email", "payload": _nested(depth)})

    deepest = workflow(MAX_JSON_DEPTH)
    assert api.client.post("/workflows", json=deepest,
                           headers=producer.headers).status_code == 201
    created = _create(schedules, workflow=deepest)
    assert created.status_code == 201, created.get_json().get("errors")
    assert created.get_json()["workflow"]["jobs"][1]["payload"] == _nested(MAX_JSON_DEPTH)
    # One past the limit is refused alike, naming the same field under workflow.
    deeper = workflow(MAX_JSON_DEPTH + 1)
    assert api.client.post("/workflows", json=deeper,
                           headers=producer.headers).get_json()["errors"] == {
        "jobs.1.payload": [f"Nested deeper than {MAX_JSON_DEPTH} levels."]}
    refused = schedules.patch("nightly", workflow=deeper)
    assert refused.status_code == 422
    assert list(refused.get_json()["errors"]) == ["workflow.jobs.1.payload"]


def test_job_and_workflow_are_one_or_the_other(schedules: Schedules) -> None:
    both = _create(schedules, job={"type": "email"}, workflow=_jobs(_A))
    assert both.status_code == 422 and "workflow" in both.get_json()["errors"]
    neither = schedules.client.post("/schedules", json={"name": "nightly", "cron": "@daily"},
                                    headers=schedules.admin.headers)
    assert neither.status_code == 422 and "job" in neither.get_json()["errors"]
    # A job template waits on nothing: dependencies are a workflow template's.
    waiting = schedules.create(job={"type": "email", "depends_on": [1]})
    assert waiting.status_code == 422 and "job.depends_on" in waiting.get_json()["errors"]
    schedules.create(cron="@daily")
    patched = schedules.patch("nightly", job={"type": "pdf"}, workflow=_jobs(_A))
    assert patched.status_code == 422 and "workflow" in patched.get_json()["errors"]


def test_patch_replaces_the_template_either_way(schedules: Schedules) -> None:
    schedules.create(cron="@daily")
    to_workflow = schedules.patch("nightly", workflow=NIGHTLY)
    assert to_workflow.status_code == 200
    assert to_workflow.get_json()["workflow"] == NIGHTLY_SHOWN
    assert to_workflow.get_json()["job"] is None
    assert schedules.get("nightly").get_json()["workflow"] == NIGHTLY_SHOWN
    # A bad workflow changes nothing.
    cycle = _jobs({"ref": "a", "type": "email", "depends_on": ["a"]})
    refused = schedules.patch("nightly", workflow=cycle)
    assert refused.status_code == 422
    assert "workflow.jobs.0.depends_on" in refused.get_json()["errors"]
    assert schedules.get("nightly").get_json()["workflow"] == NIGHTLY_SHOWN
    smaller = schedules.patch("nightly", workflow=_jobs(_A)).get_json()
    assert smaller["workflow"] == {"jobs": [{"ref": "a", "type": "email", "payload": {},
                                             "max_retries": 3}]}
    back = schedules.patch("nightly", job={"type": "pdf"}).get_json()
    assert back["job"] == {"type": "pdf", "payload": {}, "max_retries": 3}
    assert back["workflow"] is None


# -- firing ---------------------------------------------------------------------------------


def _claim_all(api: Api, worker: Key) -> list[int]:
    """Claim and complete until nothing is claimable: the ids in claim order."""
    order = []
    while True:
        response = api.claim(worker)
        if response.status_code != 200:
            return order
        order.append(response.get_json()["id"])
        assert api.complete(worker, order[-1], result={"ok": True}).status_code == 200


def test_each_slot_makes_one_workflow_whose_jobs_run_in_dependency_order(
        schedules: Schedules, clock: ManualClock, api: Api, worker: Key) -> None:
    set_clock(clock, "2027-01-15T08:00:00Z")
    assert _create(schedules, workflow=NIGHTLY).status_code == 201
    set_clock(clock, "2027-01-15T08:10:00.200Z")
    assert schedules.fire() == 1
    (workflow,) = _workflows(schedules)
    assert workflow["name"] == "nightly-export" and workflow["status"] == "running"
    ids = {job["ref"]: job["id"] for job in workflow["jobs"]}
    assert list(ids) == ["export", "mail", "archive", "report"]
    assert workflow["counts"]["pending"] == 1 and workflow["counts"]["waiting"] == 3
    # Every job names the schedule; the first holds the slot, the others none.
    jobs = _jobs_by_id(schedules)
    assert [jobs[job_id]["schedule"] for job_id in ids.values()] == ["nightly"] * 4
    assert [jobs[job_id]["scheduled_for"] for job_id in ids.values()] == [
        "2027-01-15T08:10:00.000000Z", None, None, None]
    assert jobs[ids["archive"]]["priority"] == "high"
    shown = schedules.get("nightly").get_json()
    assert shown["last_job_id"] == ids["export"]
    assert shown["last_workflow_id"] == workflow["id"]
    assert shown["last_run_at"] == "2027-01-15T08:10:00.000000Z"

    order = _claim_all(api, worker)
    assert order[0] == ids["export"] and order[-1] == ids["report"]
    assert set(order[1:3]) == {ids["mail"], ids["archive"]}
    assert _workflows(schedules)[0]["status"] == "completed"

    set_clock(clock, "2027-01-15T08:20:00.200Z")
    assert schedules.fire() == 1
    assert _first_slots(schedules) == ["2027-01-15T08:10:00Z", "2027-01-15T08:20:00Z"]
    newest = _workflows(schedules)[-1]
    assert schedules.get("nightly").get_json()["last_workflow_id"] == newest["id"]


def test_a_workflow_schedules_jobs_and_workflows_are_the_admins_to_see(
        schedules: Schedules, clock: ManualClock, api: Api, producer: Key) -> None:
    set_clock(clock, "2027-01-15T08:00:00Z")
    _create(schedules, workflow=NIGHTLY)
    set_clock(clock, "2027-01-15T08:10:00Z")
    schedules.fire()
    (workflow,) = _workflows(schedules)
    headers = producer.headers
    assert schedules.client.get("/workflows", headers=headers).get_json()["workflows"] == []
    assert schedules.client.get(f"/workflows/{workflow['id']}",
                                headers=headers).status_code == 404
    assert api.list(producer).get_json()["jobs"] == []
    for job in workflow["jobs"]:
        assert api.get(producer, job["id"]).status_code == 404
        events = schedules.client.get(f"/jobs/{job['id']}/events",
                                      headers=schedules.admin.headers).get_json()["events"]
        assert (events[0]["event"], events[0]["actor"]) == ("enqueued", "schedule:nightly")


def test_catch_up_all_makes_one_workflow_per_missed_slot(schedules: Schedules,
                                                         clock: ManualClock) -> None:
    set_clock(clock, "2027-01-15T08:00:00Z")
    _create(schedules, workflow=NIGHTLY, catch_up="all")
    set_clock(clock, "2027-01-15T08:10:00.300Z")
    assert schedules.fire() == 1
    set_clock(clock, "2027-01-15T10:15:00Z")  # 08:20 … 10:10 were missed
    assert schedules.fire() == 12
    slots = _first_slots(schedules)
    assert slots == ["2027-01-15T08:10:00Z"] + [
        utc(micros("2027-01-15T08:20:00Z") + n * 600_000_000) for n in range(12)]
    workflows = _workflows(schedules)
    assert all(len(workflow["jobs"]) == 4 for workflow in workflows)
    # Each workflow's jobs are its own: no edge crosses from one slot's workflow to another's.
    for workflow in workflows:
        own = {job["id"] for job in workflow["jobs"]}
        assert all(set(job["depends_on"]) <= own for job in workflow["jobs"])
    shown = schedules.get("nightly").get_json()
    assert shown["last_workflow_id"] == workflows[-1]["id"]
    assert shown["next_run_at"] == "2027-01-15T10:20:00.000000Z"


def test_catch_up_latest_makes_a_workflow_for_the_newest_missed_slot_only(
        schedules: Schedules, clock: ManualClock) -> None:
    set_clock(clock, "2027-01-15T08:00:00Z")
    _create(schedules, workflow=NIGHTLY)
    set_clock(clock, "2027-01-15T10:15:00Z")
    assert schedules.fire() == 1
    assert _first_slots(schedules) == ["2027-01-15T10:10:00Z"]


def test_a_firing_stores_at_most_its_budget_of_workflow_jobs_per_transaction(
        schedules: Schedules, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedule_service, "FIRE_WORKFLOW_JOBS", 8)  # two 4-job workflows
    transactions: list[int] = []
    jobs_service = schedules.service.jobs
    write = jobs_service.write

    def counted(work: Any) -> Any:
        transactions.append(1)
        return write(work)

    monkeypatch.setattr(jobs_service, "write", counted)
    set_clock(clock, "2027-01-15T08:00:00Z")
    for name in ("nightly", "second"):
        _create(schedules, name=name, workflow=NIGHTLY, catch_up="all")
    schedules.create(name="plain", cron="*/10 * * * *", catch_up="all")
    set_clock(clock, "2027-01-15T08:30:00.100Z")
    # 3 slots each: 3 plain jobs and 6 workflows of 4 jobs, at most 2 workflows a transaction.
    assert schedules.fire() == 9
    assert len(transactions) == 3
    jobs = _jobs_by_id(schedules)
    made = Counter((jobs[workflow["jobs"][0]["id"]]["schedule"],
                    jobs[workflow["jobs"][0]["id"]]["scheduled_for"][11:16])
                   for workflow in _workflows(schedules))
    assert made == {(name, slot): 1 for name in ("nightly", "second")
                    for slot in ("08:10", "08:20", "08:30")}
    for name in ("nightly", "second", "plain"):
        shown = schedules.get(name).get_json()
        assert shown["next_run_at"] == "2027-01-15T08:40:00.000000Z"
        assert shown["last_run_at"] == "2027-01-15T08:30:00.000000Z"


def test_processes_racing_for_a_slot_make_one_workflow(
        schedules: Schedules, clock: ManualClock, app_config: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # One workflow a transaction: the racers also leave slots to each other's next ones.
    monkeypatch.setattr(schedule_service, "FIRE_WORKFLOW_JOBS", 4)
    set_clock(clock, "2027-01-15T08:00:00Z")
    for name in ("nightly", "second"):
        _create(schedules, name=name, workflow=NIGHTLY, cron="* * * * *", catch_up="all")
    schedules.create(name="plain", cron="* * * * *")  # fired in the same batches
    # Four apps on one database stand for four server processes, each with its own engine.
    apps: list[Flask] = [create_app(app_config) for _ in range(4)]
    errors: list[BaseException] = []
    fired: list[int] = []
    try:
        for minute in range(1, 6):
            set_clock(clock, f"2027-01-15T08:{minute:02d}:00.100Z")
            barrier = threading.Barrier(len(apps))

            def fire(app: Flask, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                try:
                    fired.append(app.extensions["queuelog"].schedules.fire_due())
                except BaseException as exc:  # told to the test below, not lost in a thread
                    errors.append(exc)

            threads = [threading.Thread(target=fire, args=(app,)) for app in apps]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        for app in apps:
            app.extensions["queuelog"].db.engine.dispose()
    assert errors == []
    slots = [f"08:{minute:02d}" for minute in range(1, 6)]
    jobs = _jobs_by_id(schedules)
    made = Counter((jobs[workflow["jobs"][0]["id"]]["schedule"],
                    jobs[workflow["jobs"][0]["id"]]["scheduled_for"][11:16])
                   for workflow in _workflows(schedules))
    assert made == {(name, slot): 1 for name in ("nightly", "second") for slot in slots}
    assert sum(fired) == 3 * len(slots)  # two workflows and a job per slot
    per_schedule = Counter(job["schedule"] for job in jobs.values())
    assert per_schedule == {"nightly": 4 * len(slots), "second": 4 * len(slots),
                            "plain": len(slots)}


def _hold_slot(app: Flask, slot: int) -> int:
    """Insert a job holding the schedule `nightly`'s slot, as a process firing without the
    schedule row's lock (during an upgrade, say) would have: what the index must refuse."""
    services = app.extensions["queuelog"]
    caller = Caller(name="schedule:nightly", role=Role.ADMIN, max_priority=Priority.CRITICAL,
                    allowed_types=None)
    values = {**new_job(services.schedules.intake, caller, {"type": "sync", "payload": {},
                                                            "max_retries": 3}, None, 1).values,
              "schedule": "nightly", "scheduled_for": slot}
    with services.db.write() as conn:
        return JobRepository(conn).insert_job(values).id


def test_a_slot_whose_first_job_exists_stores_nothing_of_its_workflow(
        schedules: Schedules, clock: ManualClock, app: Flask) -> None:
    set_clock(clock, "2027-01-15T08:00:00Z")
    _create(schedules, workflow=NIGHTLY, catch_up="all")
    held = _hold_slot(app, micros("2027-01-15T08:10:00Z"))
    set_clock(clock, "2027-01-15T08:20:00.100Z")
    # 08:10 is held already: its workflow is left out whole; 08:20's is made.
    assert schedules.fire() == 1
    (workflow,) = _workflows(schedules)
    assert _first_slots(schedules) == ["2027-01-15T08:20:00Z"]
    assert sorted(_jobs_by_id(schedules)) == sorted(
        [held] + [job["id"] for job in workflow["jobs"]])
    shown = schedules.get("nightly").get_json()
    assert shown["last_workflow_id"] == workflow["id"]
    assert shown["next_run_at"] == "2027-01-15T08:30:00.000000Z"


def test_the_index_lets_a_schedule_have_many_jobs_without_a_slot(app: Flask) -> None:
    # The jobs of a workflow after its first carry the schedule with scheduled_for NULL:
    # NULLs are distinct in the unique index on both engines.
    services = app.extensions["queuelog"]
    caller = Caller(name="schedule:nightly", role=Role.ADMIN, max_priority=Priority.CRITICAL,
                    allowed_types=None)
    values = {**new_job(services.schedules.intake, caller, {"type": "email", "payload": {},
                                                            "max_retries": 3}, None, 1).values,
              "schedule": "nightly", "scheduled_for": None}
    with services.db.write() as conn:
        jobs = JobRepository(conn).insert_jobs([values] * 3)
        again = JobRepository(conn).insert_job(values)
    assert len({job.id for job in [*jobs, again]}) == 4


def test_a_slot_whose_workflow_no_longer_validates_is_skipped_and_said(
        schedules: Schedules, clock: ManualClock, app_config: dict[str, Any],
        caplog: Any) -> None:
    set_clock(clock, "2027-01-15T08:00:00Z")
    _create(schedules, workflow=NIGHTLY)
    narrowed = create_app({**app_config, "JOB_TYPES": {"email", "sync"}})  # pdf is gone
    set_clock(clock, "2027-01-15T08:10:00Z")
    try:
        assert narrowed.extensions["queuelog"].schedules.fire_due() == 0
    finally:
        narrowed.extensions["queuelog"].db.engine.dispose()
    assert "its workflow does not validate: workflow.jobs.2.type" in caplog.text
    assert "orders" not in caplog.text  # never the payload
    assert _workflows(schedules) == [] and schedules.jobs() == []
    # The schedule moved on: its next slot fires where the types are configured.
    set_clock(clock, "2027-01-15T08:20:00Z")
    assert schedules.fire() == 1
