"""POST /workflows and its reads: a graph stored in one transaction, its ids by ref, its status,
its cancel, and every refusal a 422 naming the field."""

from __future__ import annotations

from typing import Any

ORDER = [
    {"ref": "charge", "type": "email", "payload": {"order": 1001}},
    {"ref": "mail", "type": "email", "depends_on": ["charge"]},
    {"ref": "ship", "type": "pdf", "depends_on": ["charge"]},
    {"ref": "done", "type": "sync", "depends_on": ["mail", "ship"],
     "on_dependency_failure": "run"},
]


def create(api: Any, key: Any, jobs: list[dict[str, Any]], **extra: Any) -> Any:
    headers = {**key.headers, **extra.pop("headers", {})}
    return api.client.post("/workflows", json={"jobs": jobs, **extra}, headers=headers)


def read(api: Any, key: Any, workflow_id: int) -> Any:
    return api.client.get(f"/workflows/{workflow_id}", headers=key.headers)


def run_next(api: Any, worker: Any, *, fail: bool = False) -> dict[str, Any]:
    job = api.claim(worker).json
    if fail:
        api.fail(worker, job["id"])
    else:
        api.complete(worker, job["id"], result={"ran": job["id"]})
    return job


def test_a_workflow_is_stored_with_its_ids_by_ref_and_runs_in_order(api, producer, worker):
    created = create(api, producer, ORDER, name="order-1001")
    assert created.status_code == 201
    body = created.json
    ids = body["jobs"]
    assert set(ids) == {"charge", "mail", "ship", "done"}
    assert (body["name"], body["status"]) == ("order-1001", "running")
    assert body["counts"]["waiting"] == 3 and body["counts"]["pending"] == 1
    assert created.headers["Location"].endswith(f"/workflows/{body['id']}")

    order = [run_next(api, worker)["id"] for _ in range(4)]
    assert order[0] == ids["charge"] and order[-1] == ids["done"]
    assert set(order[1:3]) == {ids["mail"], ids["ship"]}
    shown = read(api, producer, body["id"]).json
    assert shown["status"] == "completed"
    assert [(job["ref"], job["status"]) for job in shown["jobs"]] == [
        ("charge", "completed"), ("mail", "completed"), ("ship", "completed"),
        ("done", "completed")]
    assert shown["jobs"][3]["depends_on"] == [ids["mail"], ids["ship"]]


def test_refs_may_name_later_items_and_existing_ids(api, producer, worker):
    existing = api.enqueue(producer).json["id"]
    created = create(api, producer, [
        {"ref": "last", "type": "email", "depends_on": ["first", existing]},
        {"ref": "first", "type": "email"}])
    assert created.status_code == 201
    ids = created.json["jobs"]
    job = api.get(producer, ids["last"]).json
    assert job["depends_on"] == [ids["first"], existing] and job["waiting_on"] == 2


def test_a_failure_cancels_the_waiting_jobs_and_the_workflow_ends_failed(api, producer,
                                                                       worker):
    jobs = [{**ORDER[0], "max_retries": 0}, *ORDER[1:]]
    body = create(api, producer, jobs).json
    run_next(api, worker, fail=True)
    shown = read(api, producer, body["id"]).json
    statuses = {job["ref"]: job["status"] for job in shown["jobs"]}
    # done runs on failure: mail and ship were cancelled, which counts as finished for it.
    assert statuses == {"charge": "failed", "mail": "cancelled", "ship": "cancelled",
                        "done": "pending"}
    assert shown["status"] == "running"
    run_next(api, worker)
    assert read(api, producer, body["id"]).json["status"] == "failed"


def test_cancel_cancels_waiting_and_pending_jobs_and_leaves_running_ones(api, producer,
                                                                        worker):
    body = create(api, producer, ORDER).json
    charge = api.claim(worker).json
    cancelled = api.client.post(f"/workflows/{body['id']}/cancel", headers=producer.headers)
    assert cancelled.status_code == 200
    statuses = {job["ref"]: job["status"] for job in cancelled.json["jobs"]}
    assert statuses == {"charge": "running", "mail": "cancelled", "ship": "cancelled",
                        "done": "cancelled"}
    assert api.complete(worker, charge["id"]).status_code == 200
    assert read(api, producer, body["id"]).json["status"] == "cancelled"
    assert api.claim(worker).status_code == 204


def test_a_cycle_is_refused_naming_its_refs_and_nothing_is_stored(api, producer):
    answer = create(api, producer, [
        {"ref": "a", "type": "email", "depends_on": ["c"]},
        {"ref": "b", "type": "email", "depends_on": ["a"]},
        {"ref": "c", "type": "email", "depends_on": ["b"]},
        {"ref": "free", "type": "email"}])
    assert answer.status_code == 422
    message = answer.json["errors"]["jobs"][0]
    assert all(ref in message for ref in ("a", "b", "c")) and "free" not in message
    assert api.list(producer).json["jobs"] == []


def test_bad_graphs_are_422_naming_the_field(api, producer, make_key):
    cases = {
        "jobs.1.ref": [{"ref": "a", "type": "email"}, {"ref": "a", "type": "email"}],
        "jobs.0.depends_on": [{"ref": "a", "type": "email", "depends_on": ["nowhere"]}],
        "jobs.1.depends_on": [{"ref": "a", "type": "email"},
                              {"ref": "b", "type": "email", "depends_on": ["a", "a"]}],
    }
    for field, jobs in cases.items():
        answer = create(api, producer, jobs)
        assert answer.status_code == 422, field
        assert field in answer.json["errors"], (field, answer.json)
    foreign = api.enqueue(make_key("producer-2", "producer")).json["id"]
    answer = create(api, producer, [{"ref": "a", "type": "email", "depends_on": [foreign]}])
    assert answer.json["errors"] == {
        "jobs.0.depends_on": [f"No job {foreign} that this key may name."]}
    missing_ref = create(api, producer, [{"type": "email"}])
    assert missing_ref.status_code == 422 and "jobs.0.ref" in missing_ref.json["errors"]
    too_many = create(api, producer, [{"ref": f"j{n}", "type": "email"} for n in range(1001)])
    assert too_many.status_code == 422 and "jobs" in too_many.json["errors"]
    deps = create(api, producer, [{"ref": "a", "type": "email",
                                   "depends_on": list(range(1, 102))}])
    assert deps.status_code == 422 and "jobs.0.depends_on" in deps.json["errors"]
    assert api.list(producer).json["jobs"] == []


def test_a_thousand_job_workflow_is_stored_whole(api, producer, worker):
    jobs = [{"ref": "root", "type": "email"}] + [
        {"ref": f"leaf-{n}", "type": "pdf", "depends_on": ["root"]} for n in range(998)]
    jobs.append({"ref": "join", "type": "sync",
                 "depends_on": [f"leaf-{n}" for n in range(100)]})
    created = create(api, producer, jobs)
    assert created.status_code == 201
    assert len(created.json["jobs"]) == 1000
    assert created.json["counts"]["waiting"] == 999


def test_an_idempotency_key_makes_the_whole_workflow_idempotent(api, producer):
    key = {"Idempotency-Key": "order-1001"}
    first = create(api, producer, ORDER, headers=key)
    again = create(api, producer, ORDER, headers=key)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json["jobs"] == first.json["jobs"]
    assert len(api.list(producer).json["jobs"]) == 4
    changed = create(api, producer, ORDER[:2], headers=key)
    assert changed.status_code == 422


def test_workers_may_not_create_or_read_workflows_and_producers_see_their_own(
        api, producer, worker, admin, make_key):
    assert create(api, worker, ORDER).status_code == 403
    body = create(api, producer, ORDER).json
    other = make_key("producer-2", "producer")
    assert read(api, other, body["id"]).status_code == 404
    assert read(api, admin, body["id"]).status_code == 200
    assert api.client.post(f"/workflows/{body['id']}/cancel",
                           headers=other.headers).status_code == 404
    listed = api.client.get("/workflows", headers=other.headers).json
    assert listed == {"workflows": [], "next_cursor": None}


def test_listing_pages_and_filters_by_status(api, producer, worker):
    first = create(api, producer, ORDER[:1]).json["id"]
    second = create(api, producer, ORDER[:1]).json["id"]
    third = create(api, producer, ORDER[:1]).json["id"]
    run_next(api, worker)  # completes first's only job
    page = api.client.get("/workflows", query_string={"limit": 2},
                          headers=producer.headers).json
    assert [item["id"] for item in page["workflows"]] == [first, second]
    rest = api.client.get("/workflows", query_string={"cursor": page["next_cursor"]},
                          headers=producer.headers).json
    assert [item["id"] for item in rest["workflows"]] == [third]
    running = api.client.get("/workflows", query_string={"status": "running"},
                             headers=producer.headers).json
    assert [item["id"] for item in running["workflows"]] == [second, third]


def test_a_batch_may_name_earlier_items_by_ref_but_not_later_ones(api, producer):
    ok = api.client.post("/jobs/batch", headers=producer.headers, json={"jobs": [
        {"ref": "a", "type": "email"}, {"type": "email", "depends_on": ["a"]}]})
    assert ok.status_code == 201
    first, second = ok.json["jobs"]
    assert second["status"] == "waiting" and second["depends_on"] == [first["id"]]
    later = api.client.post("/jobs/batch", headers=producer.headers, json={"jobs": [
        {"type": "email", "depends_on": ["b"]}, {"ref": "b", "type": "email"}]})
    assert later.status_code == 422 and "jobs.0.depends_on" in later.json["errors"]


def test_purge_keeps_a_finished_job_an_unfinished_job_depends_on(api, producer, worker, app,
                                                                  clock):
    a = api.enqueue(producer).json["id"]
    b = api.enqueue(producer, delay_seconds=3600).json["id"]
    waiting = api.enqueue(producer, depends_on=[a, b]).json["id"]
    lone = api.enqueue(producer).json["id"]
    assert [run_next(api, worker)["id"] for _ in range(2)] == [a, lone]
    clock.advance(2 * 86_400)
    purge = app.extensions["queuelog"].jobs.purge
    assert purge(older_than_seconds=86_400) == 1
    assert api.get(producer, lone).status_code == 404
    assert api.get(producer, a).status_code == 200
    assert [run_next(api, worker)["id"] for _ in range(2)] == [b, waiting]
    shown = api.client.get(f"/jobs/{waiting}/dependencies", headers=producer.headers).json
    assert [dep["id"] for dep in shown["dependencies"]] == [a, b]
    clock.advance(2 * 86_400)
    assert purge(older_than_seconds=86_400) == 3
    assert api.list(producer).json["jobs"] == []
