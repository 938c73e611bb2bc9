"""Retention never shrinks what names a job (docs/WORKFLOWS.md, "Removed jobs"), on both
engines: a job's dependencies list keeps every entry of its depends_on, in order, a removed
one saying so; a workflow keeps every job in its jobs and counts, a removed one counted as
removed; a workflow goes only once none of its jobs is left."""

from __future__ import annotations

from typing import Any

import pytest

from app import stop_maintenance
from tests.conftest import Api, Key
from tests.jobs.test_retention import remove_expired, stored

DAY = 86_400


@pytest.fixture(autouse=True)
def retention_by_hand(app: Any) -> None:
    """Retention run by hand, to see what each pass removes: the maintenance loop, whose
    rounds moving the clock runs (retention among them), is stopped."""
    stop_maintenance(app)


def keep(client: Any, admin: Key, job_type: str, completed_seconds: int | None) -> None:
    answer = client.patch(f"/types/{job_type}", headers=admin.headers,
                          json={"retention": {"completed_seconds": completed_seconds}})
    assert answer.status_code == 200, answer.json


def run(api: Api, worker: Key, job_id: int, *, fail: bool = False,
        result: dict[str, Any] | None = None) -> None:
    claimed = api.claim(worker).json
    assert claimed["id"] == job_id, claimed
    if fail:
        api.fail(worker, job_id, lease_token=claimed["lease_token"], error="boom")
    else:
        api.complete(worker, job_id, lease_token=claimed["lease_token"], result=result)


def dependencies(api: Api, key: Key, job_id: int) -> list[dict[str, Any]]:
    answer = api.client.get(f"/jobs/{job_id}/dependencies", headers=key.headers)
    assert answer.status_code == 200, answer.json
    shown: list[dict[str, Any]] = answer.json["dependencies"]
    return shown


def test_a_removed_dependency_keeps_its_place_in_the_list_and_says_removed(
        app, api, client, clock, producer, worker, admin):
    keep(client, admin, "email", 60)  # completed email jobs go after a minute
    keep(client, admin, "pdf", None)  # completed pdf jobs stay
    mail = api.enqueue(producer, type="email").json["id"]
    ship = api.enqueue(producer, type="pdf").json["id"]
    report = api.enqueue(producer, type="sync", max_retries=0,
                         depends_on=[mail, ship]).json["id"]
    run(api, worker, mail, result={"sent": True})
    run(api, worker, ship, result={"parcel": "P-1"})
    run(api, worker, report, fail=True)  # ended: its dependencies are no longer kept for it
    clock.advance(DAY)
    assert remove_expired(app) == 1
    assert api.get(admin, mail).status_code == 404

    # An admin runs the report again: its worker still reads both dependencies, in order.
    assert api.retry(admin, report).json["status"] == "pending"
    claimed = api.claim(worker).json
    assert claimed["id"] == report
    expected = [{"id": mail, "type": None, "status": "removed", "result": None},
                {"id": ship, "type": "pdf", "status": "completed", "result": {"parcel": "P-1"}}]
    assert dependencies(api, worker, report) == expected
    assert dependencies(api, producer, report) == expected
    assert api.get(producer, report).json["depends_on"] == [mail, ship]


def test_every_dependency_removed_still_lists_each_one(app, api, client, clock, producer,
                                                       worker, admin):
    keep(client, admin, "email", 60)
    first = api.enqueue(producer, type="email").json["id"]
    second = api.enqueue(producer, type="email").json["id"]
    child = api.enqueue(producer, type="sync", depends_on=[second, first]).json["id"]
    for job_id in (first, second, child):
        run(api, worker, job_id)
    clock.advance(DAY)
    assert remove_expired(app) == 2  # sync keeps its completed jobs 7 days
    assert [(dep["id"], dep["status"]) for dep in dependencies(api, producer, child)] == [
        (second, "removed"), (first, "removed")]


def test_a_workflow_counts_its_removed_jobs_and_goes_once_none_is_left(
        app, api, client, clock, producer, worker, admin):
    keep(client, admin, "email", 60)
    keep(client, admin, "pdf", 3 * DAY)
    created = client.post("/workflows", headers=producer.headers, json={"jobs": [
        {"ref": "charge", "type": "email"},
        {"ref": "ship", "type": "pdf", "depends_on": ["charge"]}]})
    assert created.status_code == 201, created.json
    workflow_id, ids = created.json["id"], created.json["jobs"]
    run(api, worker, ids["charge"])
    run(api, worker, ids["ship"])
    clock.advance(DAY)
    assert remove_expired(app) == 1  # charge

    shown = client.get(f"/workflows/{workflow_id}", headers=producer.headers).json
    assert [(job["ref"], job["id"], job["type"], job["status"], job["depends_on"])
            for job in shown["jobs"]] == [
        ("charge", ids["charge"], None, "removed", []),
        ("ship", ids["ship"], "pdf", "completed", [ids["charge"]])]
    assert shown["counts"]["removed"] == 1 and shown["counts"]["completed"] == 1
    assert sum(shown["counts"].values()) == 2
    assert shown["status"] == "completed"
    listed = client.get("/workflows", headers=producer.headers).json["workflows"]
    assert [(w["id"], w["counts"]["removed"], w["counts"]["completed"], w["status"])
            for w in listed] == [(workflow_id, 1, 1, "completed")]
    page = client.get(f"/ui/workflows/{workflow_id}", headers=admin.headers)
    assert page.status_code in (200, 302)  # the dashboard draws it (or asks to sign in)

    clock.advance(3 * DAY)
    assert remove_expired(app) == 1  # ship: the workflow has no job left
    assert client.get(f"/workflows/{workflow_id}",
                      headers=producer.headers).status_code == 404
    assert stored(app, "SELECT workflow_id FROM workflow_jobs") == []
    assert stored(app, "SELECT id FROM workflows") == []


def test_purge_keeps_a_workflow_whole_until_its_last_job_goes(app, api, client, clock,
                                                              producer, worker):
    second = client.post("/workflows", headers=producer.headers, json={"jobs": [
        {"ref": "c", "type": "email"}]})
    first = client.post("/workflows", headers=producer.headers, json={"jobs": [
        {"ref": "a", "type": "email"}, {"ref": "b", "type": "email", "delay_seconds": DAY}]})
    run(api, worker, second.json["jobs"]["c"])
    run(api, worker, first.json["jobs"]["a"])
    clock.advance(2 * DAY)
    purge = app.extensions["queuelog"].jobs.purge
    assert purge(older_than_seconds=DAY) == 2  # a and c; b is pending, unfinished
    counts = client.get(f"/workflows/{first.json['id']}", headers=producer.headers).json[
        "counts"]
    assert (counts["removed"], counts["pending"]) == (1, 1)
    assert client.get(f"/workflows/{second.json['id']}",
                      headers=producer.headers).status_code == 404
