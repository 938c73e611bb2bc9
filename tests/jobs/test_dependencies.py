"""Jobs that wait for other jobs (contract §15): the waiting status, release on the last
dependency's completion, the cascade of a failed or cancelled dependency, and the refusals."""

from __future__ import annotations

from typing import Any


def events_of(api: Any, admin: Any, job_id: int) -> list[dict[str, Any]]:
    response = api.client.get(f"/jobs/{job_id}/events", headers=admin.headers)
    return list(response.json["events"])


def run_one(api: Any, worker: Any, **claim: Any) -> dict[str, Any]:
    """Claim the next job and complete it; the job as claimed."""
    job = api.claim(worker, **claim).json
    assert api.complete(worker, job["id"], result={"done": job["id"]}).status_code == 200
    return job


def test_a_job_with_an_unfinished_dependency_waits_and_is_never_claimed(api, producer,
                                                                        worker):
    first = api.enqueue(producer).json
    second = api.enqueue(producer, depends_on=[first["id"]])
    assert second.status_code == 201
    shown = second.json
    assert (shown["status"], shown["depends_on"], shown["waiting_on"]) == (
        "waiting", [first["id"]], 1)
    assert shown["on_dependency_failure"] == "cancel"
    assert api.claim(worker).json["id"] == first["id"]
    assert api.claim(worker).status_code == 204


def test_the_last_dependencys_completion_makes_the_job_pending_in_the_same_transaction(
        api, producer, worker, admin):
    a, b = api.enqueue(producer).json["id"], api.enqueue(producer).json["id"]
    joined = api.enqueue(producer, depends_on=[a, b]).json["id"]
    run_one(api, worker)
    assert api.get(producer, joined).json["waiting_on"] == 1
    run_one(api, worker)
    after = api.get(producer, joined).json
    assert (after["status"], after["waiting_on"]) == ("pending", 0)
    assert events_of(api, admin, joined)[-1]["event"] == "ready"
    assert api.claim(worker).json["id"] == joined


def test_a_dependency_already_completed_is_applied_at_once(api, producer, worker):
    a = api.enqueue(producer).json["id"]
    run_one(api, worker)
    b = api.enqueue(producer, depends_on=[a]).json
    assert (b["status"], b["waiting_on"], b["depends_on"]) == ("pending", 0, [a])


def test_a_job_born_pending_is_not_due_before_its_dependency_ended(api, clock, producer,
                                                                   worker):
    # The enqueue reads its clock before it waits for its dependencies' locks; one may end
    # meanwhile, stamped later. Here the enqueue's clock reads a minute before the end.
    a = api.enqueue(producer).json["id"]
    clock.advance(120)
    run_one(api, worker)
    ended_at = api.get(producer, a).json["updated_at"]
    clock.advance(-60)
    b = api.enqueue(producer, depends_on=[a]).json
    assert (b["status"], b["run_at"]) == ("pending", ended_at)
    assert api.claim(worker).status_code == 204  # a claim at the enqueue's moment
    clock.advance(60)
    claimed = api.claim(worker).json
    assert (claimed["id"], claimed["claimed_at"]) == (b["id"], ended_at)


def test_a_failed_dependency_cancels_its_dependents_transitively_and_run_ones_still_run(
        api, producer, worker, admin):
    root = api.enqueue(producer, max_retries=0).json["id"]
    child = api.enqueue(producer, depends_on=[root]).json["id"]
    grandchild = api.enqueue(producer, depends_on=[child]).json["id"]
    cleanup = api.enqueue(producer, depends_on=[child],
                          on_dependency_failure="run").json["id"]
    api.claim(worker)
    assert api.fail(worker, root).json["status"] == "failed"
    assert api.get(producer, child).json["status"] == "cancelled"
    assert api.get(producer, grandchild).json["status"] == "cancelled"
    assert api.get(producer, cleanup).json["status"] == "pending"
    cancelled = events_of(api, admin, child)[-1]
    assert cancelled["event"] == "cancelled"
    assert cancelled["detail"] == {"dependency": root, "dependency_status": "failed"}
    assert events_of(api, admin, grandchild)[-1]["detail"] == {
        "dependency": child, "dependency_status": "cancelled"}
    assert api.claim(worker).json["id"] == cleanup


def test_a_retried_dependency_does_not_revive_what_its_failure_cancelled(api, producer,
                                                                         worker, admin):
    root = api.enqueue(producer, max_retries=0).json["id"]
    child = api.enqueue(producer, depends_on=[root]).json["id"]
    api.claim(worker)
    api.fail(worker, root)
    api.retry(admin, root)
    run_one(api, worker)
    assert api.get(producer, child).json["status"] == "cancelled"


def test_a_retry_of_a_failed_dependency_with_run_counts_it_finished_once(api, producer,
                                                                        worker, admin):
    a = api.enqueue(producer, max_retries=0).json["id"]
    b = api.enqueue(producer).json["id"]
    waiting = api.enqueue(producer, depends_on=[a, b], on_dependency_failure="run").json["id"]
    api.claim(worker)
    api.fail(worker, a)
    api.retry(admin, a)
    run_one(api, worker)  # a again: its edge was applied when it failed
    assert api.get(producer, waiting).json["status"] == "waiting"
    run_one(api, worker)  # b
    assert api.get(producer, waiting).json["status"] == "pending"


def test_an_admin_cancel_of_a_dependency_cascades(api, producer, admin):
    root = api.enqueue(producer).json["id"]
    child = api.enqueue(producer, depends_on=[root]).json["id"]
    assert api.cancel(admin, root).json["status"] == "cancelled"
    assert api.get(producer, child).json["status"] == "cancelled"


def test_an_admin_can_cancel_a_waiting_job(api, producer, admin):
    root = api.enqueue(producer).json["id"]
    child = api.enqueue(producer, depends_on=[root]).json["id"]
    assert api.cancel(admin, child).json["status"] == "cancelled"


def test_a_lease_expiry_that_fails_a_job_for_good_cascades(api, producer, worker, clock):
    root = api.enqueue(producer, max_retries=0).json["id"]
    child = api.enqueue(producer, depends_on=[root]).json["id"]
    api.claim(worker, lease_seconds=1)
    clock.advance(2)
    assert api.claim(worker).status_code == 204  # the rescue runs inside this claim
    assert api.get(producer, root).json["status"] == "failed"
    assert api.get(producer, child).json["status"] == "cancelled"


def test_a_dependency_already_failed_cancels_the_new_job_at_once(api, producer, worker,
                                                                  admin):
    root = api.enqueue(producer, max_retries=0).json["id"]
    api.claim(worker)
    api.fail(worker, root)
    born = api.enqueue(producer, depends_on=[root])
    assert born.status_code == 201 and born.json["status"] == "cancelled"
    assert events_of(api, admin, born.json["id"])[-1]["detail"] == {
        "dependency": root, "dependency_status": "failed"}
    runs = api.enqueue(producer, depends_on=[root], on_dependency_failure="run").json
    assert runs["status"] == "pending"


def test_unknown_and_foreign_dependencies_are_refused_alike(api, producer, make_key):
    other = make_key("producer-2", "producer")
    foreign = api.enqueue(other).json["id"]
    missing = foreign + 1000
    answers = [api.enqueue(producer, depends_on=[job_id]) for job_id in (foreign, missing)]
    assert [answer.status_code for answer in answers] == [422, 422]
    assert answers[0].json["errors"]["depends_on"] == [f"No job {foreign} that this key may name."]
    assert answers[1].json["errors"]["depends_on"] == [f"No job {missing} that this key may name."]
    assert api.list(producer).json["jobs"] == []


def test_an_admin_may_name_any_producers_job(api, producer, admin):
    theirs = api.enqueue(producer).json["id"]
    assert api.enqueue(admin, depends_on=[theirs]).json["status"] == "waiting"


def test_a_dependency_named_twice_or_101_of_them_is_422(api, producer):
    job_id = api.enqueue(producer).json["id"]
    twice = api.enqueue(producer, depends_on=[job_id, job_id])
    assert twice.status_code == 422 and "depends_on" in twice.json["errors"]
    too_many = api.enqueue(producer, depends_on=list(range(1, 102)))
    assert too_many.status_code == 422 and "depends_on" in too_many.json["errors"]
    bad_choice = api.enqueue(producer, depends_on=[job_id], on_dependency_failure="maybe")
    assert bad_choice.status_code == 422
    assert "on_dependency_failure" in bad_choice.json["errors"]


def test_dependencies_route_shows_results_in_depends_on_order(api, producer, worker, make_key):
    a = api.enqueue(producer, type="pdf").json["id"]
    b = api.enqueue(producer, type="sync").json["id"]
    joined = api.enqueue(producer, depends_on=[b, a]).json["id"]
    run_one(api, worker)
    run_one(api, worker)
    holder = api.claim(worker).json
    assert holder["id"] == joined and "depends_on" not in holder
    shown = api.client.get(f"/jobs/{joined}/dependencies", headers=worker.headers)
    assert shown.status_code == 200
    assert shown.json == {"dependencies": [
        {"id": b, "type": "sync", "status": "completed", "result": {"done": b}},
        {"id": a, "type": "pdf", "status": "completed", "result": {"done": a}}]}
    stranger = make_key("worker-2", "worker")
    assert api.client.get(f"/jobs/{joined}/dependencies",
                          headers=stranger.headers).status_code == 404
    assert api.client.get(f"/jobs/{joined}/dependencies",
                          headers=producer.headers).status_code == 200


def test_waiting_jobs_are_listed_by_status(api, producer):
    root = api.enqueue(producer).json["id"]
    child = api.enqueue(producer, depends_on=[root]).json["id"]
    listed = api.list(producer, status="waiting").json["jobs"]
    assert [(job["id"], job["waiting_on"]) for job in listed] == [(child, 1)]


def test_an_idempotent_replay_with_other_dependencies_is_422(api, producer):
    a, b = api.enqueue(producer).json["id"], api.enqueue(producer).json["id"]
    key = {"Idempotency-Key": "k-1"}
    first = api.enqueue(producer, headers=key, depends_on=[a])
    again = api.enqueue(producer, headers=key, depends_on=[a])
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json["depends_on"] == [a]
    assert api.enqueue(producer, headers=key, depends_on=[b]).status_code == 422


def test_an_item_naming_an_earlier_items_job_stands_for_that_jobs_birth(api, producer,
                                                                       worker):
    failed = api.enqueue(producer, max_retries=0).json["id"]
    api.claim(worker)
    api.fail(worker, failed)
    same = {"type": "pdf", "depends_on": [failed], "idempotency_key": "k"}
    answer = api.client.post("/jobs/batch", headers=producer.headers, json={"jobs": [
        {"ref": "first", **same}, {"ref": "again", **same},
        {"type": "sync", "depends_on": ["again"]}]})
    assert answer.status_code == 201, answer.json
    first, again, last = answer.json["jobs"]
    assert again["id"] == first["id"] and again["replayed"] is True
    assert (first["status"], last["status"]) == ("cancelled", "cancelled")
    assert last["depends_on"] == [first["id"]]


def test_a_retried_dependent_waits_again_for_its_unfinished_dependencies(api, producer,
                                                                          worker, admin):
    failing = api.enqueue(producer, max_retries=0).json["id"]
    slow = api.enqueue(producer, delay_seconds=60).json["id"]
    dependent = api.enqueue(producer, depends_on=[failing, slow]).json["id"]
    api.claim(worker)
    api.fail(worker, failing)
    assert api.get(producer, dependent).json["status"] == "cancelled"
    retried = api.retry(admin, dependent).json
    assert (retried["status"], retried["waiting_on"]) == ("waiting", 1)
    assert api.claim(worker).status_code == 204
    bulk = api.client.post("/jobs/retry-many", json={"ids": [dependent]}, headers=admin.headers)
    assert bulk.json["count"] == 0  # waiting: not a failed or cancelled job any more
    api.cancel(admin, dependent)
    assert api.client.post("/jobs/retry-many", json={"ids": [dependent]},
                           headers=admin.headers).json["count"] == 1
    assert api.get(producer, dependent).json["status"] == "waiting"


def test_a_retried_dependent_whose_dependencies_all_ended_is_pending(api, producer, worker,
                                                                      admin):
    failing = api.enqueue(producer, max_retries=0).json["id"]
    dependent = api.enqueue(producer, depends_on=[failing]).json["id"]
    api.claim(worker)
    api.fail(worker, failing)
    assert api.retry(admin, dependent).json["status"] == "pending"
    assert api.claim(worker).json["id"] == dependent
