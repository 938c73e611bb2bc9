"""Flow control against a model, driven by Hypothesis: random enqueues (of three types, with
and without concurrency keys, at three priorities), changes of the types' settings (pause,
max_running, max_running_per_key, rate and burst), claims of one or several jobs (of any type
or of some), completions and jumps of the ManualClock. Every claim must take exactly the jobs
the model says: the first allowed ones in claim order, passing over paused types, types at
their cap or out of tokens, and full keys; after every step GET /types must agree with the
model."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from sqlalchemy import delete

from app.core.clock import MICROS, ManualClock
from app.core.priorities import Priority
from app.storage.schema import job_types as job_types_table
from app.storage.schema import jobs as jobs_table

TYPES = ("email", "pdf", "sync")
KEYS = (None, "a", "a", "b")  # "a" twice: keys that collide are the point


@dataclass
class ModelJob:
    id: int
    type: str
    key: str | None
    priority: int
    created_at: int
    status: str = "pending"


@dataclass
class ModelType:
    paused: bool = False
    max_running: int | None = None
    max_running_per_key: int | None = None
    rate: float | None = None
    burst: int | None = None
    tokens: float | None = None
    tokens_at: int | None = None

    @property
    def effective_burst(self) -> int:
        if self.burst is not None:
            return self.burst
        return 1 if self.rate is None else max(1, math.ceil(self.rate))

    def available(self, now: int) -> float:
        if self.rate is None:
            return math.inf
        if self.tokens is None or self.tokens_at is None:
            return float(self.effective_burst)
        return min(self.effective_burst,
                   self.tokens + self.rate * max(0, now - self.tokens_at) / MICROS)


@dataclass(frozen=True)
class Env:
    app: Flask
    client: FlaskClient
    clock: ManualClock
    admin: Any
    worker: Any


@dataclass
class Model:
    jobs: dict[int, ModelJob] = field(default_factory=dict)
    types: dict[str, ModelType] = field(default_factory=lambda: {t: ModelType() for t in TYPES})

    def running(self, job_type: str, key: Any = ...) -> int:
        return sum(1 for j in self.jobs.values() if j.status == "running" and j.type == job_type
                   and (key is ... or j.key == key))

    def expected_claim(self, now: int, limit: int, wanted: set[str] | None) -> list[int]:
        """The first allowed jobs in claim order: what the contract says a claim takes."""
        budget: dict[str, float] = {}
        for name, t in self.types.items():
            allowed = math.inf if t.max_running is None else t.max_running - self.running(name)
            if t.rate is not None:
                allowed = min(allowed, math.floor(t.available(now) + 1e-9))
            budget[name] = 0 if t.paused else allowed
        taken_per_key: dict[tuple[str, str], int] = {}
        chosen: list[int] = []
        for job in sorted(self.jobs.values(), key=lambda j: (-j.priority, j.created_at, j.id)):
            if len(chosen) == limit:
                break
            if job.status != "pending" or (wanted is not None and job.type not in wanted):
                continue
            if budget[job.type] <= 0:
                continue
            cap = self.types[job.type].max_running_per_key
            if cap is not None and job.key is not None:
                slot = (job.type, job.key)
                if self.running(job.type, job.key) + taken_per_key.get(slot, 0) >= cap:
                    continue
                taken_per_key[slot] = taken_per_key.get(slot, 0) + 1
            budget[job.type] -= 1
            chosen.append(job.id)
        return chosen


class FlowMachine(RuleBasedStateMachine):
    def __init__(self, env: Env) -> None:
        super().__init__()
        self.env = env
        self.model = Model()
        with env.app.extensions["queuelog"].db.write() as conn:
            conn.execute(delete(jobs_table))
            conn.execute(delete(job_types_table))

    @property
    def now(self) -> int:
        return self.env.clock.now_us()

    @rule(job_type=st.sampled_from(TYPES), key=st.sampled_from(KEYS),
          priority=st.sampled_from(["low", "medium", "high"]))
    def enqueue(self, job_type: str, key: str | None, priority: str) -> None:
        body: dict[str, Any] = {"type": job_type, "priority": priority}
        if key is not None:
            body["concurrency_key"] = key
        response = self.env.client.post("/jobs", json=body, headers=self.env.admin.headers)
        assert response.status_code == 201, response.json
        job_id = response.json["id"]
        self.model.jobs[job_id] = ModelJob(job_id, job_type, key,
                                           int(Priority.from_label(priority)), self.now)

    @rule(job_type=st.sampled_from(TYPES), paused=st.booleans(),
          max_running=st.sampled_from([None, 1, 2, 3]),
          per_key=st.sampled_from([None, 1, 1, 2]),
          rate=st.sampled_from([None, 0.5, 1.0, 2.0]), burst=st.sampled_from([None, 1, 3]))
    def set_type(self, job_type: str, paused: bool, max_running: int | None,
                 per_key: int | None, rate: float | None, burst: int | None) -> None:
        response = self.env.client.patch(f"/types/{job_type}", headers=self.env.admin.headers,
                                         json={"paused": paused, "max_running": max_running,
                                               "max_running_per_key": per_key,
                                               "rate_per_second": rate, "burst": burst})
        assert response.status_code == 200, response.json
        t = self.model.types[job_type]
        held = t.available(self.now)
        t.paused, t.max_running, t.max_running_per_key = paused, max_running, per_key
        t.rate, t.burst = rate, burst
        if rate is None:
            t.tokens = t.tokens_at = None
        else:
            t.tokens = min(held, float(t.effective_burst))
            t.tokens_at = max(self.now, t.tokens_at or self.now)

    @rule(limit=st.integers(1, 4),  # claim-many: several jobs of one key in one claim
          wanted=st.none() | st.sets(st.sampled_from(TYPES), min_size=1))
    def claim(self, limit: int, wanted: set[str] | None) -> None:
        expected = self.model.expected_claim(self.now, limit, wanted)
        body: dict[str, Any] = {"max_jobs": limit}
        if wanted is not None:
            body["types"] = sorted(wanted)
        response = self.env.client.post("/jobs/claim-many", json=body,
                                        headers=self.env.worker.headers)
        assert response.status_code == 200, response.json
        assert [job["id"] for job in response.json["jobs"]] == expected
        for job_id in expected:
            job = self.model.jobs[job_id]
            job.status = "running"
            t = self.model.types[job.type]
            if t.rate is not None:
                t.tokens = t.available(self.now) - 1
                t.tokens_at = max(self.now, t.tokens_at or self.now)

    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        running = sorted(j.id for j in self.model.jobs.values() if j.status == "running")
        if not running:
            return
        job_id = data.draw(st.sampled_from(running))
        response = self.env.client.post(f"/jobs/{job_id}/complete", json={},
                                        headers=self.env.worker.headers)
        assert response.status_code == 200, response.json
        self.model.jobs[job_id].status = "completed"

    @rule(quarters=st.integers(1, 12))
    def advance(self, quarters: int) -> None:
        self.env.clock.advance(quarters / 4)

    @invariant()
    def types_agree_with_the_model(self) -> None:
        shown = {t["type"]: t for t in self.env.client.get(
            "/types", headers=self.env.admin.headers).json["types"]}
        for name, t in self.model.types.items():
            counts = shown[name]["counts"]
            assert counts["pending"] == sum(1 for j in self.model.jobs.values()
                                            if j.type == name and j.status == "pending")
            assert counts["running"] == self.model.running(name)
            assert counts["completed"] == sum(1 for j in self.model.jobs.values()
                                              if j.type == name and j.status == "completed")
            assert (shown[name]["paused"], shown[name]["max_running"],
                    shown[name]["max_running_per_key"], shown[name]["rate_per_second"],
                    shown[name]["burst"]) == (t.paused, t.max_running, t.max_running_per_key,
                                              t.rate, t.effective_burst)


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    return {**app_config, "TYPE_COUNTS_MAX_AGE_SECONDS": 0, "LEASE_SECONDS": 3600}


@pytest.mark.slow
def test_every_claim_takes_the_first_allowed_jobs_under_any_limits(
        app: Flask, client: FlaskClient, clock: ManualClock, make_key: Any) -> None:
    env = Env(app, client, clock, make_key("admin-1", "admin"), make_key("worker-1", "worker"))
    run_state_machine_as_test(
        lambda: FlowMachine(env),
        settings=settings(max_examples=50, stateful_step_count=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )
