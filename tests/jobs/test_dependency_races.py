"""No race leaves a job waiting forever (contract §15): a dependency that completes while its
dependent is enqueued, and two dependencies of one job completing at once, are each seen by
one of the two transactions, on both engines. Threads of one process, each with its own
connection: on PostgreSQL the transactions truly overlap."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

ROUNDS = 25


def side_by_side(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls at once (released together by a barrier); their answers in order."""
    barrier = threading.Barrier(len(calls))
    answers: list[Any] = [None] * len(calls)

    def run(position: int, call: Callable[[], Any]) -> None:
        barrier.wait()
        answers[position] = call()

    threads = [threading.Thread(target=run, args=(position, call))
               for position, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return answers


def test_a_dependency_completing_while_its_dependent_is_enqueued_is_never_missed(
        app, producer, worker):
    clients = [app.test_client() for _ in range(2)]
    for _ in range(ROUNDS):
        dependency = clients[0].post("/jobs", json={"type": "email"},
                                     headers=producer.headers).json["id"]
        claimed = clients[0].post("/jobs/claim", json={}, headers=worker.headers).json
        assert claimed["id"] == dependency
        completed, enqueued = side_by_side(
            functools.partial(clients[0].post, f"/jobs/{dependency}/complete", json={},
                              headers=worker.headers),
            functools.partial(clients[1].post, "/jobs",
                              json={"type": "email", "depends_on": [dependency]},
                              headers=producer.headers))
        assert (completed.status_code, enqueued.status_code) == (200, 201)
        dependent = clients[0].get(f"/jobs/{enqueued.json['id']}", headers=producer.headers)
        assert dependent.json["status"] == "pending", dependent.json
        # Claimed and finished, so that the next round's claim takes its own job.
        job = clients[0].post("/jobs/claim", json={}, headers=worker.headers).json
        clients[0].post(f"/jobs/{job['id']}/complete", json={}, headers=worker.headers)


def test_two_dependencies_completing_at_once_release_their_dependent(app, producer, worker):
    clients = [app.test_client() for _ in range(2)]
    for _ in range(ROUNDS):
        first = clients[0].post("/jobs", json={"type": "email"},
                                headers=producer.headers).json["id"]
        second = clients[0].post("/jobs", json={"type": "email"},
                                 headers=producer.headers).json["id"]
        joined = clients[0].post("/jobs", json={"type": "email", "depends_on": [first, second]},
                                 headers=producer.headers).json["id"]
        claimed = clients[0].post("/jobs/claim-many", json={"max_jobs": 2},
                                  headers=worker.headers).json["jobs"]
        assert {job["id"] for job in claimed} == {first, second}
        answers = side_by_side(*[
            functools.partial(clients[position].post, f"/jobs/{job['id']}/complete", json={},
                              headers=worker.headers)
            for position, job in enumerate(claimed)])
        assert [answer.status_code for answer in answers] == [200, 200]
        shown = clients[0].get(f"/jobs/{joined}", headers=producer.headers).json
        assert (shown["status"], shown["waiting_on"]) == ("pending", 0)
        job = clients[0].post("/jobs/claim", json={}, headers=worker.headers).json
        assert job["id"] == joined
        clients[0].post(f"/jobs/{joined}/complete", json={}, headers=worker.headers)


def test_a_failure_and_an_enqueue_at_once_cancel_the_dependent_either_way(app, producer,
                                                                          worker):
    clients = [app.test_client() for _ in range(2)]
    for _ in range(ROUNDS):
        dependency = clients[0].post("/jobs", json={"type": "email", "max_retries": 0},
                                     headers=producer.headers).json["id"]
        clients[0].post("/jobs/claim", json={}, headers=worker.headers)
        failed, enqueued = side_by_side(
            functools.partial(clients[0].post, f"/jobs/{dependency}/fail",
                              json={"error": "no"}, headers=worker.headers),
            functools.partial(clients[1].post, "/jobs",
                              json={"type": "email", "depends_on": [dependency]},
                              headers=producer.headers))
        assert (failed.status_code, enqueued.status_code) == (200, 201)
        dependent = clients[0].get(f"/jobs/{enqueued.json['id']}", headers=producer.headers)
        assert dependent.json["status"] == "cancelled"
