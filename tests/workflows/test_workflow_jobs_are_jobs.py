"""Jobs of a workflow are jobs (contract §15, part three's preamble): flow control, uniqueness,
push types, history and visibility apply to them unchanged once they are released."""

from __future__ import annotations

from typing import Any


def create(api: Any, key: Any, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    answer = api.client.post("/workflows", json={"jobs": jobs}, headers=key.headers)
    assert answer.status_code == 201, answer.json
    ids: dict[str, Any] = answer.json["jobs"]
    return ids


def patch_type(api: Any, admin: Any, job_type: str, **body: Any) -> None:
    answer = api.client.patch(f"/types/{job_type}", json=body, headers=admin.headers)
    assert answer.status_code == 200, answer.json


def finish_next(api: Any, worker: Any, **claim: Any) -> int:
    job = api.claim(worker, **claim).json
    api.complete(worker, job["id"])
    return int(job["id"])


def test_a_released_job_of_a_paused_type_waits_for_its_resume(api, producer, worker, admin):
    ids = create(api, producer, [{"ref": "a", "type": "email"},
                                 {"ref": "b", "type": "pdf", "depends_on": ["a"]}])
    patch_type(api, admin, "pdf", paused=True)
    assert finish_next(api, worker) == ids["a"]
    assert api.get(producer, ids["b"]).json["status"] == "pending"
    assert api.claim(worker).status_code == 204
    explained = api.explain(admin, ids['b'])
    assert explained["reasons"][0]["code"] == "type_paused"
    patch_type(api, admin, "pdf", paused=False)
    assert finish_next(api, worker) == ids["b"]


def test_max_running_holds_released_jobs_back_like_any_other(api, producer, worker, admin):
    ids = create(api, producer, [{"ref": "root", "type": "email"}] + [
        {"ref": f"leaf-{n}", "type": "pdf", "depends_on": ["root"]} for n in range(3)])
    patch_type(api, admin, "pdf", max_running=1)
    assert finish_next(api, worker) == ids["root"]
    first = api.claim(worker).json
    assert first["type"] == "pdf"
    assert api.claim(worker).status_code == 204
    api.complete(worker, first["id"])
    assert api.claim(worker).json["type"] == "pdf"


def test_a_waiting_job_holds_its_unique_key(api, producer):
    root = api.enqueue(producer).json["id"]
    unique = {"key": "report-42"}
    waiting = api.enqueue(producer, type="pdf", depends_on=[root], unique=unique)
    assert waiting.json["status"] == "waiting"
    twin = api.enqueue(producer, type="pdf", unique=unique)
    assert twin.status_code == 200 and twin.headers["Deduplicated"] == "true"
    assert twin.json["id"] == waiting.json["id"]


def test_a_workflow_item_that_meets_a_unique_twin_names_that_job(api, producer, worker):
    twin = api.enqueue(producer, type="pdf", unique={"key": "render"}).json["id"]
    ids = create(api, producer, [
        {"ref": "render", "type": "pdf", "unique": {"key": "render"}},
        {"ref": "zip", "type": "sync", "depends_on": ["render"]}])
    assert ids["render"] == twin
    assert api.get(producer, ids["zip"]).json["depends_on"] == [twin]
    assert finish_next(api, worker) == twin
    assert api.get(producer, ids["zip"]).json["status"] == "pending"


def test_workers_never_claim_a_push_types_released_job(api, producer, worker, admin):
    patch_type(api, admin, "pdf", push={"url": "https://svc.internal/render",
                                        "timeout_seconds": 5})
    ids = create(api, producer, [{"ref": "a", "type": "email"},
                                 {"ref": "b", "type": "pdf", "depends_on": ["a"]}])
    assert finish_next(api, worker) == ids["a"]
    assert api.get(producer, ids["b"]).json["status"] == "pending"
    assert api.claim(worker).status_code == 204
    explained = api.explain(admin, ids['b'])
    assert "push_type" in [reason["code"] for reason in explained["reasons"]]


def test_a_workflow_jobs_history_tells_its_wait(api, producer, worker, admin):
    ids = create(api, producer, [{"ref": "a", "type": "email"},
                                 {"ref": "b", "type": "pdf", "depends_on": ["a"]}])
    explained = api.explain(producer, ids['b'])
    assert explained["claimable_now"] is False
    assert explained["reasons"][0] == {
        "code": "waiting_on", "ids": [ids["a"]],
        "message": explained["reasons"][0]["message"]}
    finish_next(api, worker)
    finish_next(api, worker)
    events = api.client.get(f"/jobs/{ids['b']}/events", headers=admin.headers).json["events"]
    assert [event["event"] for event in events] == ["enqueued", "ready", "claimed", "completed"]
    attempts = api.client.get(f"/jobs/{ids['b']}/attempts", headers=producer.headers).json
    assert [attempt["outcome"] for attempt in attempts["attempts"]] == ["completed"]


def test_type_counts_show_waiting_jobs(api, producer, admin):
    create(api, producer, [{"ref": "a", "type": "email"},
                           {"ref": "b", "type": "pdf", "depends_on": ["a"]},
                           {"ref": "c", "type": "pdf", "depends_on": ["a"]}])
    # The process's first count is taken now, after the enqueue.
    counts = api.client.get("/types/pdf", headers=admin.headers).json["counts"]
    assert (counts["waiting"], counts["pending"]) == (2, 0)


def test_a_workflows_cancel_leaves_alone_a_job_its_item_met(api, producer):
    twin = api.enqueue(producer, type="pdf", unique={"key": "render"}).json["id"]
    answer = api.client.post("/workflows", headers=producer.headers, json={"jobs": [
        {"ref": "render", "type": "pdf", "unique": {"key": "render"}},
        {"ref": "zip", "type": "sync", "depends_on": ["render"]}]})
    ids = answer.json["jobs"]
    assert ids["render"] == twin
    cancelled = api.client.post(f"/workflows/{answer.json['id']}/cancel",
                                headers=producer.headers).json
    assert {job["ref"]: job["status"] for job in cancelled["jobs"]} == {
        "render": "pending", "zip": "cancelled"}
