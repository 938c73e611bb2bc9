"""The service against a model of its state machine (docs/JOBS.md, A job's statuses), driven by
Hypothesis.

Random sequences of enqueue, claim, heartbeat, complete, fail, cancel and retry, from two
workers (one limited to some types) and an admin, with stale lease tokens, unknown ids and
jumps of the ManualClock past leases and backoffs. Every answer is checked against what the
model says the contract requires, and after every step every job, as an admin reads it, must
be what the model holds.

    pending --claim--> running --complete--> completed
       ^                  |--fail / lease expired, retries left--> pending (retry_count + 1)
       |                  '--fail / lease expired, none left-----> failed
       '--retry (admin)-- failed | cancelled <--cancel (admin)-- pending
    running --cancel (admin): requested; the holder's report or the lease's expiry--> cancelled
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import delete

from app.core.clock import MICROS, ManualClock, parse_rfc3339, to_rfc3339
from app.core.priorities import Priority
from app.storage.schema import jobs as jobs_table

LEASE_SECONDS = 300  # QUEUELOG_LEASE_SECONDS's default, which the test app keeps
BACKOFF_SECONDS, BACKOFF_MAX_SECONDS = 1.0, 3600.0  # the backoff defaults
UNKNOWN_ID = 10**9
TYPES = ("email", "pdf", "sync")


@dataclass
class ModelJob:
    id: int
    type: str
    priority: int
    max_retries: int
    created_at: int
    run_at: int
    status: str = "pending"
    retry_count: int = 0
    claimed_at: int | None = None
    worker: str | None = None
    lease_expires_at: int | None = None
    lease_token: str | None = None
    error: str | None = None
    cancel_requested: bool = False
    past_tokens: list[str] = field(default_factory=list)
    # The complete or fail that left the job as it is: (action, worker, token, body, delay),
    # the token being the lease's it landed under, whether or not the report carried it: the
    # service keeps that lease's token on the row and takes a report repeated with it (and
    # the same body) as a repeat, even when the one that landed came without a token.
    last_report: tuple[str, str, str, dict[str, Any], int] | None = None

    def held_by(self, worker: str, now: int, token: str | None) -> bool:
        return (self.status == "running" and self.worker == worker
                and self.lease_expires_at is not None and self.lease_expires_at > now
                and (token is None or token == self.lease_token))

    def repeats_last_report(self, action: str, worker: str, token: str | None,
                            body: dict[str, Any]) -> bool:
        """A complete or fail repeated after it landed, which answers 200: the same token
        and body (a fail's retry_in_seconds only counts when given and the job was
        requeued), by the same worker (a requeued job no longer names it)."""
        if self.last_report is None or token is None:
            return False
        last_action, last_worker, last_token, last_body, delay_us = self.last_report
        if (action, token) != (last_action, last_token):
            return False
        if action == "complete":
            return worker == last_worker and body == last_body
        if body["error"] != last_body["error"]:
            return False
        if self.status in ("failed", "cancelled"):
            return worker == last_worker
        return ("retry_in_seconds" not in body
                or body["retry_in_seconds"] * MICROS == delay_us)

    def stopped(self, error: str | None) -> None:
        """Its cancel was requested: cancelled, whatever it reported (or at lease expiry)."""
        self.status, self.error, self.lease_expires_at = "cancelled", error, None
        self.cancel_requested = False
        if self.lease_token is not None:
            self.past_tokens.append(self.lease_token)
        self.lease_token = None

    def attempt_failed(self, now: int, error: str, delay_us: int) -> None:
        """A failed attempt (by `fail` or an expired lease): pending again or failed."""
        self.last_report = None
        self.error = error
        self.lease_expires_at = None
        if self.lease_token is not None:
            self.past_tokens.append(self.lease_token)
        self.lease_token = None
        if self.retry_count < self.max_retries:
            self.status = "pending"
            self.retry_count += 1
            self.run_at = now + delay_us
            self.claimed_at = None
            self.worker = None
        else:
            self.status = "failed"


@dataclass(frozen=True)
class Env:
    app: Flask
    client: FlaskClient
    clock: ManualClock
    keys: dict[str, Any]


# The second worker's key is limited to these types.
WORKER_2_TYPES = frozenset({"email", "pdf"})
WORKER_TYPES: dict[str, frozenset[str] | None] = {"worker-1": None, "worker-2": WORKER_2_TYPES}


def make_keys(make_key: Any) -> dict[str, Any]:
    return {
        "admin": make_key("admin-1", "admin"),
        "worker-1": make_key("worker-1", "worker"),
        "worker-2": make_key("worker-2", "worker", types=sorted(WORKER_2_TYPES)),
    }


class QueueMachine(RuleBasedStateMachine):
    jobs = Bundle("jobs")

    def __init__(self, env: Env) -> None:
        super().__init__()
        self.env = env
        self.model: dict[int, ModelJob] = {}
        # Each run starts from an empty queue; the keys stay.
        with env.app.extensions["queuelog"].db.write() as conn:
            conn.execute(delete(jobs_table))

    # -- helpers --------------------------------------------------------------------------

    @property
    def now(self) -> int:
        return self.env.clock.now_us()

    def post(self, path: str, key: str, body: dict[str, Any] | None = None) -> Any:
        return self.env.client.post(path, json=body, headers=self.env.keys[key].headers)

    def token_for(self, job_id: int, choice: str) -> str | None:
        job = self.model.get(job_id)
        if choice == "current" and job is not None and job.lease_token is not None:
            return job.lease_token
        if choice == "stale" and job is not None and job.past_tokens:
            return job.past_tokens[-1]
        if choice == "forged":
            return f"{'0' * 32}.{job_id}"
        return None

    def expect_not_held(self, response: Any, job_id: int) -> None:
        expected = 404 if job_id not in self.model else 409
        assert response.status_code == expected, response.get_json()
        assert response.mimetype == "application/problem+json"

    def report(self, action: str, job_id: int, worker: str, lease_token: str | None,
               body: dict[str, Any]) -> tuple[Any, ModelJob | None]:
        """POST a worker's heartbeat, complete or fail. When the model says the worker does
        not hold the job, check the refusal and return no job (a repeat of the report that
        landed: check its 200 and return no job); else check the 200."""
        sent = dict(body)
        if lease_token is not None:
            body["lease_token"] = lease_token
        response = self.post(f"/jobs/{job_id}/{action}", worker, body)
        job = self.model.get(job_id)
        if job is not None and job.repeats_last_report(action, worker, lease_token, sent):
            assert response.status_code == 200, response.get_json()
            return response, None
        if job is None or not job.held_by(worker, self.now, lease_token):
            self.expect_not_held(response, job_id)
            return response, None
        assert response.status_code == 200, response.get_json()
        return response, job

    def rescue_expired_leases(self) -> None:
        for job in self.model.values():
            if job.status == "running" and job.lease_expires_at <= self.now:  # type: ignore[operator]
                if job.cancel_requested:
                    job.stopped(job.error)  # its last error, if any, stays
                    job.last_report = None
                else:
                    job.attempt_failed(self.now, "lease expired", 0)

    # -- producers and admins -------------------------------------------------------------

    @rule(target=jobs, job_type=st.sampled_from(TYPES),
          priority=st.sampled_from([p.label for p in Priority]),
          max_retries=st.integers(0, 2),
          delay=st.sampled_from([None, 0, 1, 60, 600]))
    def enqueue(self, job_type: str, priority: str, max_retries: int,
                delay: int | None) -> int:
        body: dict[str, Any] = {"type": job_type, "priority": priority,
                                "max_retries": max_retries, "payload": {"n": len(self.model)}}
        if delay is not None:
            body["delay_seconds"] = delay
        response = self.post("/jobs", "admin", body)

        assert response.status_code == 201, response.get_json()
        shown = response.get_json()
        job = ModelJob(id=shown["id"], type=job_type, priority=Priority.from_label(priority),
                       max_retries=max_retries, created_at=self.now,
                       run_at=self.now + (delay or 0) * MICROS)
        assert shown["id"] not in self.model
        assert (shown["status"], shown["retry_count"]) == ("pending", 0)
        assert shown["run_at"] == to_rfc3339(job.run_at)
        self.model[job.id] = job
        return job.id

    @rule(job_id=st.one_of(jobs, st.just(UNKNOWN_ID)))
    def cancel(self, job_id: int) -> None:
        response = self.post(f"/jobs/{job_id}/cancel", "admin")
        job = self.model.get(job_id)
        if job is not None and job.status == "running":
            # A request (contract §17): the job runs on until its holder reports.
            assert response.status_code == 200, response.get_json()
            assert response.get_json()["cancel_requested"] is True
            job.cancel_requested = True
            return
        if job is None or job.status != "pending":
            self.expect_not_held(response, job_id)
            return
        assert response.status_code == 200, response.get_json()
        job.status, job.last_report = "cancelled", None

    @rule(job_id=st.one_of(jobs, st.just(UNKNOWN_ID)))
    def retry(self, job_id: int) -> None:
        response = self.post(f"/jobs/{job_id}/retry", "admin")
        job = self.model.get(job_id)
        if job is None or job.status not in ("failed", "cancelled"):
            self.expect_not_held(response, job_id)
            return
        assert response.status_code == 200, response.get_json()
        job.status, job.retry_count, job.run_at = "pending", 0, self.now
        job.claimed_at = job.worker = job.lease_expires_at = job.lease_token = None
        job.last_report = None

    # -- workers --------------------------------------------------------------------------

    @rule(worker=st.sampled_from(sorted(WORKER_TYPES)),
          types=st.sampled_from([None, [], ["email"], ["pdf", "sync"], ["sync"], ["nope"]]),
          lease_seconds=st.sampled_from([None, 1, 30, 300]))
    def claim(self, worker: str, types: list[str] | None, lease_seconds: int | None) -> None:
        body: dict[str, Any] = {}
        if types is not None:
            body["types"] = types
        if lease_seconds is not None:
            body["lease_seconds"] = lease_seconds
        response = self.post("/jobs/claim", worker, body)

        if types is not None and not set(types) <= set(TYPES):
            assert response.status_code == 422, response.get_json()
            return
        wanted = None if types is None else frozenset(types)
        limit = WORKER_TYPES[worker]
        if limit is not None:
            wanted = limit if wanted is None else wanted & limit
        # An empty set of types finds nothing without touching the queue.
        if wanted is not None and not wanted:
            assert response.status_code == 204
            return
        claimable = sorted(
            (job for job in self.model.values()
             if job.status == "pending" and job.run_at <= self.now
             and (wanted is None or job.type in wanted)),
            key=lambda job: (-job.priority, job.created_at, job.id))
        if not claimable:
            assert response.status_code == 204, response.get_json()
            return

        assert response.status_code == 200, response.get_json()
        shown, job = response.get_json(), claimable[0]
        assert shown["id"] == job.id, "the claim must take the most urgent claimable job"
        job.status, job.worker, job.claimed_at = "running", worker, self.now
        job.lease_expires_at = self.now + (lease_seconds or LEASE_SECONDS) * MICROS
        job.lease_token, job.last_report = shown["lease_token"], None
        assert job.lease_token not in job.past_tokens

    @rule(job_id=st.one_of(jobs, st.just(UNKNOWN_ID)),
          worker=st.sampled_from(sorted(WORKER_TYPES)),
          token=st.sampled_from([None, "current", "stale", "forged"]),
          lease_seconds=st.sampled_from([None, 1, 600]))
    def heartbeat(self, job_id: int, worker: str, token: str, lease_seconds: int | None
                  ) -> None:
        body: dict[str, Any] = {}
        if lease_seconds is not None:
            body["lease_seconds"] = lease_seconds
        response, job = self.report("heartbeat", job_id, worker,
                                    self.token_for(job_id, token), body)
        if job is None:
            return
        assert response.get_json()["cancel_requested"] is job.cancel_requested
        job.lease_expires_at = self.now + (lease_seconds or LEASE_SECONDS) * MICROS

    @rule(job_id=st.one_of(jobs, st.just(UNKNOWN_ID)),
          worker=st.sampled_from(sorted(WORKER_TYPES)),
          token=st.sampled_from([None, "current", "stale", "forged"]))
    def complete(self, job_id: int, worker: str, token: str) -> None:
        lease_token = self.token_for(job_id, token)
        response, job = self.report("complete", job_id, worker, lease_token,
                                    {"result": {"ok": job_id}})
        if job is None:
            return
        assert response.get_json()["result"] == {"ok": job_id}
        held_token = job.lease_token
        if job.cancel_requested:
            job.stopped(None)
            if held_token is not None:
                job.last_report = ("complete", worker, held_token,
                                   {"result": {"ok": job_id}}, 0)
            return
        job.status, job.lease_expires_at = "completed", None
        if held_token is not None:
            job.past_tokens.append(held_token)
            job.last_report = ("complete", worker, held_token, {"result": {"ok": job_id}}, 0)
        job.lease_token = None

    @rule(job_id=st.one_of(jobs, st.just(UNKNOWN_ID)),
          worker=st.sampled_from(sorted(WORKER_TYPES)),
          token=st.sampled_from([None, "current", "stale"]),
          retry_in_seconds=st.sampled_from([None, 0, 5, 100]))
    def fail(self, job_id: int, worker: str, token: str, retry_in_seconds: int | None) -> None:
        error = f"attempt failed at {self.now}"
        body: dict[str, Any] = {"error": error}
        if retry_in_seconds is not None:
            body["retry_in_seconds"] = retry_in_seconds
        lease_token = self.token_for(job_id, token)
        response, job = self.report("fail", job_id, worker, lease_token, dict(body))
        if job is None:
            return
        shown = response.get_json()
        held_token = job.lease_token
        if job.cancel_requested:
            assert shown["status"] == "cancelled"
            job.stopped(error)
            if held_token is not None:
                job.last_report = ("fail", worker, held_token, body, 0)
            return
        if retry_in_seconds is not None:
            delay_us = retry_in_seconds * MICROS
        else:
            # Backoff: d = min(base * 2**retry_count, ceiling), drawn from [d/2, d].
            ceiling = min(BACKOFF_SECONDS * 2**job.retry_count, BACKOFF_MAX_SECONDS) * MICROS
            delay_us = parse_rfc3339(shown["run_at"]) - self.now
            if job.retry_count < job.max_retries:
                assert ceiling / 2 - 1 <= delay_us <= ceiling + 1, (delay_us, ceiling)
        job.attempt_failed(self.now, error, delay_us)
        if held_token is not None:
            job.last_report = ("fail", worker, held_token, body, delay_us)

    @rule(seconds=st.sampled_from([0.5, 1, 5, 30, 299, 300, 301, 3600]))
    def time_passes(self, seconds: float) -> None:
        # Moving the clock runs the maintenance round that falls due, which rescues the
        # leases that ran out (no claim does).
        self.env.clock.advance(seconds)
        self.rescue_expired_leases()

    # -- what must hold after every step ---------------------------------------------------

    @invariant()
    def every_job_is_as_the_model_says(self) -> None:
        response = self.env.client.get("/jobs", query_string={"limit": 500},
                                       headers=self.env.keys["admin"].headers)
        assert response.status_code == 200
        shown = {job["id"]: job for job in response.get_json()["jobs"]}
        assert set(shown) == set(self.model)
        for job_id, job in self.model.items():
            actual = shown[job_id]
            expected = {
                "status": job.status,
                "retry_count": job.retry_count,
                "worker_id": job.worker,
                "run_at": to_rfc3339(job.run_at),
                "claimed_at": to_rfc3339(job.claimed_at),
                "lease_expires_at": to_rfc3339(job.lease_expires_at),
                "error": job.error,
            }
            assert {name: actual[name] for name in expected} == expected, job_id


@pytest.mark.slow
def test_every_answer_and_every_job_follow_the_contracts_state_machine(
        app: Flask, client: FlaskClient, clock: ManualClock, make_key: Any) -> None:
    env = Env(app, client, clock, make_keys(make_key))
    run_state_machine_as_test(
        lambda: QueueMachine(env),  # type: ignore[arg-type]  # a factory, as documented
        settings=settings(max_examples=60, stateful_step_count=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )


def test_one_claim_takes_one_job_however_many_are_claimable(
        api: Any, admin: Any, worker: Any) -> None:
    """Found by the property above on PostgreSQL: the claim's LIMIT subquery, planned as a
    semi join, ran once per outer row, so the first claim took every claimable job."""
    ids = [api.enqueue(admin).get_json()["id"] for _ in range(3)]

    claimed = [api.claim(worker) for _ in range(4)]

    assert [c.status_code for c in claimed] == [200, 200, 200, 204]
    assert [c.get_json()["id"] for c in claimed[:3]] == ids


def _machine(app: Flask, client: FlaskClient, clock: ManualClock, make_key: Any
             ) -> QueueMachine:
    return QueueMachine(Env(app, client, clock, make_keys(make_key)))


def test_the_model_takes_a_tokened_repeat_of_a_tokenless_complete_as_a_repeat(
        app: Flask, client: FlaskClient, clock: ManualClock, make_key: Any) -> None:
    """Found by the property above (saved examples, both engines): a complete sent without a
    token landed under the lease it held; the same complete sent again with that lease's
    token answers 200, a repeat, where the model wanted 409 for a "stale" token. No lease
    was rescued and nobody claimed the job again, so nothing is fenced: the model, which
    only remembered reports that carried a token, was wrong."""
    machine = _machine(app, client, clock, make_key)
    job_id = machine.enqueue(job_type="email", priority="low", max_retries=0, delay=None)
    machine.cancel(job_id)
    machine.retry(job_id)
    machine.claim(worker="worker-1", types=None, lease_seconds=None)
    machine.every_job_is_as_the_model_says()
    machine.complete(job_id, worker="worker-1", token=None)
    machine.every_job_is_as_the_model_says()
    machine.complete(job_id, worker="worker-1", token="stale")  # was: 200 == 409
    machine.every_job_is_as_the_model_says()
    # The other worker, or no token at all, is still refused.
    machine.complete(job_id, worker="worker-2", token="stale")
    machine.complete(job_id, worker="worker-1", token=None)
    machine.every_job_is_as_the_model_says()


@pytest.mark.parametrize("retries", [0, 1])
def test_the_model_takes_a_tokened_repeat_of_a_tokenless_fail_as_a_repeat(
        app: Flask, client: FlaskClient, clock: ManualClock, make_key: Any,
        retries: int) -> None:
    """The same for fail, whether the job ended failed or went back to pending."""
    machine = _machine(app, client, clock, make_key)
    job_id = machine.enqueue(job_type="email", priority="low", max_retries=retries,
                             delay=None)
    machine.claim(worker="worker-1", types=None, lease_seconds=None)
    machine.fail(job_id, worker="worker-1", token=None, retry_in_seconds=5)
    machine.every_job_is_as_the_model_says()
    machine.fail(job_id, worker="worker-1", token="stale", retry_in_seconds=5)
    machine.fail(job_id, worker="worker-1", token="stale", retry_in_seconds=None)
    machine.fail(job_id, worker="worker-1", token="stale", retry_in_seconds=100)
    machine.every_job_is_as_the_model_says()


def test_a_token_whose_lease_was_rescued_and_the_job_claimed_again_stays_fenced(
        api: Any, client: FlaskClient, admin: Any, worker: Any, make_key: Any,
        clock: ManualClock) -> None:
    """The service side of the sequence above: a complete repeated with the token of the
    lease it landed under is a repeat (200, nothing changed); a token whose lease was rescued
    and whose job another worker claimed is refused with 409 and a report_refused event."""
    job_id = api.enqueue(admin).get_json()["id"]
    token = api.claim(worker).get_json()["lease_token"]
    landed = api.complete(worker, job_id, result={"ok": 1})
    assert landed.status_code == 200
    repeated = api.complete(worker, job_id, lease_token=token, result={"ok": 1})
    assert repeated.status_code == 200
    assert repeated.get_json() == landed.get_json()
    assert api.complete(worker, job_id, lease_token=token,
                        result={"ok": 2}).status_code == 409

    other = make_key("worker-2", "worker")
    job_id = api.enqueue(admin, max_retries=1).get_json()["id"]
    stale = api.claim(worker, lease_seconds=1).get_json()["lease_token"]
    clock.advance(2)
    fresh = api.claim(other).get_json()["lease_token"]  # rescues the lease, then claims
    assert fresh != stale
    answers = [api.complete(worker, job_id, lease_token=stale),
               api.fail(worker, job_id, lease_token=stale, error="late"),
               api.heartbeat(worker, job_id, lease_token=stale)]
    assert [answer.status_code for answer in answers] == [409, 409, 409]
    shown = client.get(f"/jobs/{job_id}/events", headers=admin.headers).get_json()["events"]
    refused = [event["detail"]["report"] for event in shown
               if event["event"] == "report_refused"]
    assert refused == ["complete", "fail", "heartbeat"]
    assert api.complete(other, job_id, lease_token=fresh).status_code == 200
