"""Unique jobs against a model, driven by Hypothesis: random interleavings of enqueues with
random unique options (key, while set, on_conflict) from two producers, and claims, completes,
fails, cancels and admin retries. Every answer must be the one the model predicts, and after
every step at most one job per scope (producer, type, key) may hold its key, that is be in one
of its while statuses, both as the model says and as the database stores it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import delete, select

from app.jobs.domain.uniqueness import holds_key_in
from app.storage.schema import jobs as jobs_table

PRODUCERS = ("shop", "billing")
KEYS = ("a", "b")
WHILE_SETS = (
    ("pending", "running"),
    ("pending",),
    ("pending", "cancelled"),
    ("pending", "running", "completed"),
    ("pending", "running", "completed", "failed", "cancelled"),
)
UNKNOWN_ID = 10**9


@dataclass
class ModelJob:
    id: int
    producer: str
    key: str
    while_set: frozenset[str]
    max_retries: int
    payload: dict[str, Any]
    status: str = "pending"
    retry_count: int = 0
    let_go: bool = False  # sent back to pending while a twin held the key

    def holds_key(self) -> bool:
        return not self.let_go and self.status in self.while_set


# A job picked among those the rule can act on (a number taken modulo how many there are);
# acting on jobs in the wrong state is the other state-machine test's business.
PICK = st.integers(0, 1000)


class UniqueMachine(RuleBasedStateMachine):
    def __init__(self, app: Flask, client: FlaskClient, keys: dict[str, Any]) -> None:
        super().__init__()
        self.app, self.client, self.keys = app, client, keys
        self.model: dict[int, ModelJob] = {}
        self.sequence = 0
        with app.extensions["queuelog"].db.write() as conn:
            conn.execute(delete(jobs_table))

    def post(self, path: str, key: str, body: dict[str, Any] | None = None) -> Any:
        return self.client.post(path, json=body, headers=self.keys[key].headers)

    def act(self, index: int, statuses: tuple[str, ...], action: str, key: str,
            body: dict[str, Any] | None = None) -> tuple[Any, ModelJob | None]:
        """POST /jobs/{id}/{action} on a job picked among those in `statuses`; with none,
        on an unknown id, which must answer 404 (and then no job is returned)."""
        candidates = sorted(job.id for job in self.model.values() if job.status in statuses)
        job_id = candidates[index % len(candidates)] if candidates else UNKNOWN_ID
        response = self.post(f"/jobs/{job_id}/{action}", key, body)
        if not candidates:
            assert response.status_code == 404
            return response, None
        return response, self.model[job_id]

    def holder(self, producer: str, key: str, other_than: int | None = None) -> ModelJob | None:
        holders = [job for job in self.model.values()
                   if (job.producer, job.key) == (producer, key) and job.holds_key()
                   and job.id != other_than]
        assert len(holders) <= 1
        return holders[0] if holders else None

    # Weighted toward one scope, so that twins meet often.
    @rule(producer=st.sampled_from(PRODUCERS[:1] * 3 + PRODUCERS[1:]),
          key=st.sampled_from(KEYS[:1] * 3 + KEYS[1:]),
          while_set=st.sampled_from(WHILE_SETS),
          on_conflict=st.sampled_from(["return", "reject", "replace"]),
          max_retries=st.integers(0, 1))
    def enqueue(self, producer: str, key: str, while_set: tuple[str, ...], on_conflict: str,
                max_retries: int) -> None:
        self.sequence += 1
        payload = {"n": self.sequence}
        response = self.post("/jobs", producer, {
            "type": "email", "payload": payload, "max_retries": max_retries,
            "unique": {"key": key, "while": list(while_set), "on_conflict": on_conflict}})
        twin = self.holder(producer, key)
        if twin is None:
            assert response.status_code == 201, response.get_json()
            job = ModelJob(response.get_json()["id"], producer, key, frozenset(while_set),
                           max_retries, payload)
            assert job.id not in self.model
            self.model[job.id] = job
            return
        if on_conflict == "return":
            assert response.status_code == 200, response.get_json()
            assert response.headers["Deduplicated"] == "true"
        elif on_conflict == "replace" and twin.status == "pending":
            assert response.status_code == 200, response.get_json()
            assert response.headers["Deduplicated"] == "replaced"
            twin.payload, twin.max_retries = payload, max_retries
            twin.while_set = frozenset(while_set)
        else:
            assert response.status_code == 409, response.get_json()
            assert response.get_json()["existing_job_id"] == twin.id
            return
        assert response.get_json()["id"] == twin.id

    @rule()
    def claim(self) -> None:
        response = self.post("/jobs/claim", "worker")
        pending = sorted(job.id for job in self.model.values() if job.status == "pending")
        if not pending:
            assert response.status_code == 204
            return
        assert response.status_code == 200, response.get_json()
        assert response.get_json()["id"] == pending[0]
        self.model[pending[0]].status = "running"

    @rule(index=PICK)
    def complete(self, index: int) -> None:
        response, job = self.act(index, ("running",), "complete", "worker")
        if job is None:
            return
        assert response.status_code == 200, response.get_json()
        job.status = "completed"

    @rule(index=PICK)
    def fail(self, index: int) -> None:
        response, job = self.act(index, ("running",), "fail", "worker",
                                 {"error": "boom", "retry_in_seconds": 0})
        if job is None:
            return
        assert response.status_code == 200, response.get_json()
        if job.retry_count < job.max_retries:
            job.retry_count += 1
            if (not job.holds_key() and "pending" in job.while_set
                    and self.holder(job.producer, job.key) is not None):
                job.let_go = True
            job.status = "pending"
        else:
            job.status = "failed"
        assert response.get_json()["status"] == job.status

    @rule(index=PICK)
    def cancel(self, index: int) -> None:
        response, job = self.act(index, ("pending",), "cancel", "admin")
        if job is None:
            return
        assert response.status_code == 200, response.get_json()
        job.status = "cancelled"

    @rule(index=PICK)
    def retry(self, index: int) -> None:
        response, job = self.act(index, ("failed", "cancelled"), "retry", "admin")
        if job is None:
            return
        twin = None if job.let_go else self.holder(job.producer, job.key, other_than=job.id)
        if twin is not None:
            assert response.status_code == 409, response.get_json()
            assert response.get_json()["existing_job_id"] == twin.id
            return
        assert response.status_code == 200, response.get_json()
        job.status, job.retry_count = "pending", 0

    @invariant()
    def jobs_are_as_the_model_says(self) -> None:
        response = self.client.get("/jobs", query_string={"limit": 500},
                                   headers=self.keys["admin"].headers)
        shown = {job["id"]: job for job in response.get_json()["jobs"]}
        assert set(shown) == set(self.model)
        for job_id, job in self.model.items():
            actual = shown[job_id]
            assert (actual["status"], actual["payload"], actual["unique_key"]) == \
                (job.status, job.payload, job.key), job_id

    @invariant()
    def at_most_one_job_per_scope_holds_its_key(self) -> None:
        with self.app.extensions["queuelog"].db.read() as conn:
            rows = conn.execute(select(jobs_table.c.id, jobs_table.c.producer,
                                       jobs_table.c.unique_scope, jobs_table.c.status,
                                       jobs_table.c.unique_while)).all()
        stored_holders = {row.id for row in rows if holds_key_in(row.unique_while, row.status)}
        per_scope = Counter((row.producer, row.unique_scope) for row in rows
                            if row.id in stored_holders)
        assert all(count == 1 for count in per_scope.values()), per_scope
        assert stored_holders == {job.id for job in self.model.values() if job.holds_key()}


@pytest.mark.slow
def test_at_most_one_job_per_scope_is_ever_in_its_while_statuses(
        app: Flask, client: FlaskClient, make_key: Any) -> None:
    keys = {name: make_key(name, "producer") for name in PRODUCERS}
    keys |= {"worker": make_key("worker-1", "worker"), "admin": make_key("admin-1", "admin")}
    run_state_machine_as_test(
        lambda: UniqueMachine(app, client, keys),
        # 60 runs of up to 40 steps each (2,400 steps a run), as the state machine of a job's
        # life (test_state_machine_property.py) takes.
        settings=settings(max_examples=60, stateful_step_count=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )
