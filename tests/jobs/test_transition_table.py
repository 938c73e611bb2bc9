"""The state machine's table without a database: every edge, where it starts, what it writes,
the event, attempt outcome and metrics it records, and that its UPDATE names only its
from-statuses (so it is never applied from another). tests/jobs/test_transitions.py sees
the same edges through the API."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from typing import Any

import pytest
from sqlalchemy.dialects import postgresql, sqlite

from app.core.clock import to_rfc3339
from app.core.statuses import JobStatus
from app.jobs.domain.history import EventName, Outcome
from app.jobs.domain.models import LEASE_EXPIRED_ERROR, TIMED_OUT_ERROR, Job
from app.jobs.domain.transitions import (
    JOB_METRICS,
    Guard,
    JobMetric,
    Transition,
    after_failure,
    refusal,
)
from app.jobs.sql.repository import _transition_update
from tests.jobs.test_models import make_job

W, P, R, C, F, X = (JobStatus.WAITING, JobStatus.PENDING, JobStatus.RUNNING,
                    JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)
V = JobStatus.RESERVED
S = JobStatus.SUSPENDED

# Each edge as the contract has it: its from-statuses and guard, and whether it opens an
# attempt or the outcome it closes one with.
EDGES: dict[Transition, tuple[set[JobStatus], Guard, bool, Outcome | None]] = {
    Transition.CLAIM: ({P}, Guard.ANYONE, True, None),
    Transition.HEARTBEAT: ({R}, Guard.LEASE_HOLDER, False, None),
    Transition.COMPLETE: ({R}, Guard.LEASE_HOLDER, False, Outcome.COMPLETED),
    Transition.FAIL: ({R}, Guard.LEASE_HOLDER, False, Outcome.FAILED),
    Transition.RESCUE: ({R}, Guard.ANYONE, False, Outcome.LEASE_EXPIRED),
    Transition.CANCEL: ({P, W, S}, Guard.ANYONE, False, None),
    Transition.RELEASE: ({W}, Guard.ANYONE, False, None),
    Transition.DEPENDENCY_CANCEL: ({W}, Guard.ANYONE, False, None),
    Transition.HOLD: ({P}, Guard.ANYONE, False, None),
    Transition.CANCEL_BLOCKING: ({F}, Guard.ANYONE, False, None),
    Transition.STOP: ({R}, Guard.LEASE_HOLDER, False, Outcome.CANCELLED),
    Transition.STOP_UNREPORTED: ({R}, Guard.ANYONE, False, Outcome.CANCELLED),
    Transition.TIME_OUT: ({R}, Guard.ANYONE, False, Outcome.TIMED_OUT),
    Transition.EXPIRE: ({P, W}, Guard.ANYONE, False, None),
    Transition.CONFIRM: ({V}, Guard.ANYONE, False, None),
    Transition.RELEASE_RESERVATION: ({V}, Guard.ANYONE, False, None),
    Transition.RETRY: ({F, X}, Guard.ANYONE, False, None),
    Transition.REPLACE: ({P}, Guard.ANYONE, False, None),
    Transition.SUSPEND: ({R}, Guard.LEASE_HOLDER, False, Outcome.SUSPENDED),
    Transition.RESUME: ({S}, Guard.ANYONE, False, None),
}

PENDING_JOB = make_job(status="pending", claimed_at=None, worker_id=None,
                       lease_expires_at=None, lease_token=None)
RUNNING_JOB = make_job()  # held by "w" until 100, under lease token "t", 3 retries left
LAST_TRY = make_job(retry_count=3)
WAITING_JOB = dataclasses.replace(PENDING_JOB, status="waiting", run_at=500)


@dataclasses.dataclass(frozen=True)
class Case:
    """One job moved along one edge: the job before, the arguments of the edge's write, and
    what the job and its records are afterwards."""

    name: str
    transition: Transition
    before: Job
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    status: JobStatus
    event: EventName | None
    metrics: tuple[str, ...]
    detail: dict[str, Any]


CASES = [
    Case("claim", Transition.CLAIM, PENDING_JOB, (),
         {"now_us": 10, "worker": "w", "lease_expires_at": 70_000_000, "lease_token": "t2"},
         R, EventName.CLAIMED, ("claimed",), {"lease_expires_at": to_rfc3339(70_000_000)}),
    Case("heartbeat", Transition.HEARTBEAT, RUNNING_JOB, (),
         {"now_us": 10, "lease_expires_at": 200}, R, None, (), {}),
    Case("complete", Transition.COMPLETE, RUNNING_JOB, (), {"now_us": 10, "result": "{}"},
         C, EventName.COMPLETED, ("completed",), {}),
    Case("fail, retries left", Transition.FAIL, RUNNING_JOB, (RUNNING_JOB, 10, "boom", 5), {},
         P, EventName.RETRY_SCHEDULED, ("retried",), {"error": "boom", "run_at": to_rfc3339(15)}),
    Case("fail, none left", Transition.FAIL, LAST_TRY, (LAST_TRY, 10, "boom", 5), {},
         F, EventName.FAILED, ("failed",), {"error": "boom"}),
    Case("rescue, retries left", Transition.RESCUE, RUNNING_JOB, (RUNNING_JOB, 10), {},
         P, EventName.LEASE_EXPIRED, ("rescued", "retried"),
         {"worker": "w", "status": "pending", "run_at": to_rfc3339(10)}),
    Case("rescue, none left", Transition.RESCUE, LAST_TRY, (LAST_TRY, 10), {},
         F, EventName.LEASE_EXPIRED, ("rescued", "failed"),
         {"worker": "w", "status": "failed", "run_at": None}),
    Case("cancel", Transition.CANCEL, PENDING_JOB, (), {"now_us": 10},
         X, EventName.CANCELLED, ("cancelled",), {}),
    Case("cancel a waiting job", Transition.CANCEL, WAITING_JOB, (), {"now_us": 10},
         X, EventName.CANCELLED, ("cancelled",), {}),
    # The detail naming the dependency is the dependency's end's to give (app/jobs/
    # dependencies.py), not the edge's: the edge alone records none.
    # run_at: the later of the job's own and the release's moment (the repository's SQL).
    Case("release", Transition.RELEASE, WAITING_JOB, (), {"now_us": 10, "run_at": 500},
         P, EventName.READY, (), {}),
    Case("dependency cancel", Transition.DEPENDENCY_CANCEL, WAITING_JOB, (), {"now_us": 10},
         X, EventName.CANCELLED, ("dependency_cancelled",), {}),
    # Held behind its ordered key's turn (contract §16): no event of its own, the enqueue or
    # retry that made it records one.
    Case("hold", Transition.HOLD, PENDING_JOB, (), {"now_us": 10}, W, None, (), {}),
    Case("cancel a failure that blocks its key", Transition.CANCEL_BLOCKING,
         make_job(status="failed"), (), {"now_us": 10},
         X, EventName.CANCELLED, ("cancelled",), {}),
    # Running jobs under control (contract §17): the event of a stop names who asked for it
    # from the detail its caller gives (the request's record), not from the edge.
    Case("stop: the holder reports after its cancel was requested", Transition.STOP,
         RUNNING_JOB, (), {"now_us": 10, "error": "stopping"},
         X, EventName.CANCELLED, ("cancelled",), {}),
    Case("stop: the lease ran out after its cancel was requested", Transition.STOP_UNREPORTED,
         RUNNING_JOB, (), {"now_us": 10},
         X, EventName.CANCELLED, ("cancelled",),
         {"worker": "w", "status": "cancelled", "run_at": None}),
    Case("time out, retries left", Transition.TIME_OUT, RUNNING_JOB, (RUNNING_JOB, 10, 5), {},
         P, EventName.RETRY_SCHEDULED, ("timed_out", "retried"),
         {"error": "timed out", "run_at": to_rfc3339(15)}),
    Case("time out, none left", Transition.TIME_OUT, LAST_TRY, (LAST_TRY, 10, 5), {},
         F, EventName.FAILED, ("timed_out", "failed"), {"error": "timed out"}),
    Case("expire", Transition.EXPIRE, dataclasses.replace(PENDING_JOB, expires_at=9),
         (), {"now_us": 10}, X, EventName.CANCELLED, ("expired",),
         {"reason": "expired", "expires_at": to_rfc3339(9)}),
    Case("expire a waiting job", Transition.EXPIRE,
         dataclasses.replace(WAITING_JOB, expires_at=9), (), {"now_us": 10},
         X, EventName.CANCELLED, ("expired",),
         {"reason": "expired", "expires_at": to_rfc3339(9)}),
    # Reserved jobs (contract §18): who decided is the detail the caller gives.
    Case("confirm", Transition.CONFIRM, dataclasses.replace(PENDING_JOB, status="reserved"),
         (), {"now_us": 10}, P, EventName.CONFIRMED, ("confirmed",), {}),
    Case("release a reservation", Transition.RELEASE_RESERVATION,
         dataclasses.replace(PENDING_JOB, status="reserved"), (), {"now_us": 10},
         X, EventName.RELEASED, ("released",), {}),
    Case("retry a failed job", Transition.RETRY, make_job(status="failed"), (), {"now_us": 10},
         P, EventName.RETRIED, ("requeued",), {}),
    Case("retry a cancelled job", Transition.RETRY,
         dataclasses.replace(PENDING_JOB, status="cancelled"), (), {"now_us": 10},
         P, EventName.RETRIED, ("requeued",), {}),
    Case("replace", Transition.REPLACE, PENDING_JOB, ({"payload": '{"a":1}'},), {},
         P, EventName.REPLACED, (), {}),
    # Waits (docs/WAITS.md): what it waits for is the suspend's detail to give.
    Case("suspend", Transition.SUSPEND, RUNNING_JOB, (), {"now_us": 10},
         S, EventName.SUSPENDED, ("suspended",), {}),
    Case("resume", Transition.RESUME, dataclasses.replace(PENDING_JOB, status="suspended"),
         (), {"now_us": 10, "resumed": '{"by":"event","data":null,"at":"x"}'},
         P, EventName.RESUMED, ("resumed",), {"by": "event"}),
    Case("cancel a suspended job", Transition.CANCEL,
         dataclasses.replace(PENDING_JOB, status="suspended"), (), {"now_us": 10},
         X, EventName.CANCELLED, ("cancelled",), {}),
]


def moved(case: Case) -> Job:
    """The job as the repository's UPDATE leaves it: the edge's columns written over it."""
    return dataclasses.replace(case.before, **case.transition.values(*case.args, **case.kwargs))



def _metrics(transition: Transition, jobs: list[Job]) -> Counter[str]:
    counted: Counter[str] = Counter()
    transition.count_metrics(jobs, counted)
    return counted

def test_every_edge_is_in_the_table_and_every_case_covers_one():
    assert set(EDGES) == set(Transition)
    assert {case.transition for case in CASES} == set(Transition)


@pytest.mark.parametrize("transition", list(Transition), ids=lambda t: t.name)
def test_each_edge_states_its_start_guard_and_attempt(transition: Transition):
    statuses, guard, opens, closes = EDGES[transition]
    assert set(transition.from_statuses) == statuses
    assert transition.value.guard is guard
    assert transition.by_lease_holder is (guard is Guard.LEASE_HOLDER)
    assert transition.value.opens_attempt is opens
    assert transition.value.closes_attempt is closes


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_edge_writes_its_status_and_records_its_event_and_metrics(case: Case):
    assert case.before.status in case.transition.from_statuses
    after = moved(case)
    assert after.status == case.status
    marks = case.transition.marks_of(after)
    assert marks.event is case.event
    assert tuple(metric.value for metric in marks.metrics) == case.metrics
    assert _metrics(case.transition, [after]) == Counter(case.metrics)
    assert dict(marks.detail(after, "w")) == case.detail


def test_metrics_are_counted_per_job_of_a_batch():
    retried = moved(CASES[5])
    failed = moved(CASES[6])
    assert _metrics(Transition.RESCUE, [retried, retried, failed]) == Counter(
        {"rescued": 3, "retried": 2, "failed": 1})
    assert _metrics(Transition.CLAIM, []) == Counter()


def test_retried_names_three_things_and_each_has_its_own_name():
    # The published counter queuelog_jobs_retried_total counts failed attempts requeued; the
    # admin's retry records the "retried" event and counts queuelog_jobs_requeued_total.
    assert JobMetric.RETRY_SCHEDULED.value == "retried"
    assert Transition.FAIL.marks_of(moved(CASES[3])).metrics == (JobMetric.RETRY_SCHEDULED,)
    assert Transition.RETRY.value.marks.event is EventName.RETRIED
    assert Transition.RETRY.value.marks.metrics == (JobMetric.REQUEUED,)


def test_every_metric_has_its_help_text():
    assert set(JOB_METRICS) == set(JobMetric)
    assert all(JOB_METRICS.values())


def _statuses_named(sql: str) -> set[str]:
    # Written `(jobs.status || '')` in a statement that finds the job by id (status_is_by_id).
    condition = re.search(r"\(?jobs\.status(?: \|\| '')?\)? (?:= '(\w+)'|IN \(([^)]*)\))", sql)
    assert condition is not None, sql
    single, listed = condition.groups()
    return {single} if single else set(re.findall(r"'(\w+)'", listed))


@pytest.mark.parametrize("dialect", [sqlite.dialect(), postgresql.dialect()],
                         ids=["sqlite", "postgresql"])
@pytest.mark.parametrize("transition", list(Transition), ids=lambda t: t.name)
def test_an_edge_is_never_applied_from_a_status_it_does_not_list(transition: Transition,
                                                                  dialect: Any):
    # The UPDATE that applies the edge: its condition names the from-statuses, no other.
    statement = _transition_update(transition, frozenset({"status", "updated_at"}),
                                   fenced=False).statement
    sql = str(statement.compile(dialect=dialect))
    assert _statuses_named(sql) == {status.value for status in transition.from_statuses}
    holder_checked = "jobs.worker_id =" in sql and "jobs.lease_expires_at >" in sql
    assert holder_checked is transition.by_lease_holder


@pytest.mark.parametrize("job,lease_token,reason", [
    (make_job(status="completed"), None, "The job is completed, not running."),
    (make_job(worker_id="other"), None, "The job is held by another worker."),
    (make_job(lease_expires_at=50), None, "The lease on this job has expired."),
    (make_job(lease_expires_at=50, claimed_at=0, timeout_seconds=1), None,
     "The lease on this job has expired."),
    (make_job(lease_expires_at=50, claimed_at=0, timeout_seconds=1), None,
     "The attempt ran past the job's timeout_seconds."),
    (make_job(), "old", "The lease token names an earlier attempt."),
    (make_job(), "t", "The job changed while this request ran."),
], ids=["not running", "another worker", "expired", "expired before the deadline",
        "past the deadline", "earlier attempt", "changed"])
def test_the_lease_holder_guard_names_why_it_refuses(job: Job, lease_token: str | None,
                                                     reason: str):
    # The deadline of the two cases with a timeout is claimed_at + 1 s: 1,000,000 µs.
    now = 1_000_000 if "timeout_seconds" in reason else 50
    assert refusal(job, "w", now, lease_token) == reason


def test_a_rescue_records_the_lease_expired_error():
    assert moved(CASES[5]).error == LEASE_EXPIRED_ERROR


def test_a_timed_out_attempt_records_its_error_and_forgets_its_lease_token():
    # Its worker may still be running it: a late report must not pass for a repeat.
    timed_out = Transition.TIME_OUT.values(RUNNING_JOB, 10, 5)
    assert timed_out["error"] == TIMED_OUT_ERROR and timed_out["lease_token"] is None


def test_a_stop_keeps_what_its_holder_reported_and_its_token_for_a_repeat():
    stopped = make_job(**Transition.STOP.values(now_us=5, result='{"partial":1}'))
    assert stopped.status == JobStatus.CANCELLED and stopped.result == '{"partial":1}'
    assert stopped.shows_stop("w", "t", result='{"partial":1}')
    assert not stopped.shows_stop("w", "older", result='{"partial":1}')
    assert not stopped.shows_stop("w", "t", result=None)  # another body
    assert not stopped.shows_stop("w", "t", error="boom")  # a fail is not this complete
    assert Transition.STOP_UNREPORTED.values(now_us=5)["lease_token"] is None


def test_after_failure_requeues_while_retries_are_left():
    change = after_failure(make_job(retry_count=2), now_us=1000, error="e", retry_delay_us=50)
    assert change["status"] == JobStatus.PENDING
    assert change["retry_count"] == 3 and change["run_at"] == 1050
    assert change["worker_id"] is None and change["claimed_at"] is None


def test_after_failure_ends_failed_when_the_budget_is_spent():
    change = after_failure(make_job(retry_count=3), now_us=1000, error="e", retry_delay_us=50)
    assert change["status"] == JobStatus.FAILED
    assert "retry_count" not in change and "worker_id" not in change  # last holder kept


def test_every_transition_is_a_member_of_its_own():
    # Enum members with equal values are aliases of one another: each needs its own value.
    assert [t.name for t in Transition] == [
        "CLAIM", "HEARTBEAT", "COMPLETE", "FAIL", "RESCUE", "CANCEL", "RELEASE",
        "DEPENDENCY_CANCEL", "HOLD", "CANCEL_BLOCKING", "STOP", "STOP_UNREPORTED", "TIME_OUT",
        "EXPIRE", "CONFIRM", "RELEASE_RESERVATION", "RETRY", "REPLACE", "SUSPEND", "RESUME"]
    assert len({t.value for t in Transition}) == len(list(Transition))
    assert Transition.FAIL is not Transition.HEARTBEAT


def test_only_a_workers_reports_need_the_lease_holder():
    assert {t for t in Transition if t.by_lease_holder} == {
        Transition.HEARTBEAT, Transition.COMPLETE, Transition.FAIL, Transition.STOP,
        Transition.SUSPEND}


def test_a_report_keeps_its_lease_token_so_that_a_repeat_is_recognised():
    done = Transition.COMPLETE.values(now_us=5, result='{"ok":true}')
    assert done["status"] == JobStatus.COMPLETED and "lease_token" not in done
    completed = make_job(status="completed", result='{"ok":true}', lease_token="t")
    assert completed.shows_complete("w", "t", '{"ok":true}')
    assert not completed.shows_complete("w", "t", None)  # another body
    assert not completed.shows_complete("w", "older", '{"ok":true}')
    assert not completed.shows_complete("x", "t", '{"ok":true}')


def test_a_repeated_fail_matches_the_error_and_the_delay_it_asked_for():
    requeued = make_job(**Transition.FAIL.values(make_job(), 1000, "boom", 5_000_000))
    assert requeued.shows_fail("w", "t", "boom", None)
    assert requeued.shows_fail("w", "t", "boom", 5_000_000)
    assert not requeued.shows_fail("w", "t", "boom", 6_000_000)
    assert not requeued.shows_fail("w", "t", "bang", None)
    reclaimed = make_job(**(Transition.FAIL.values(make_job(), 1000, "boom", 0)
                            | {"lease_token": "next"}))
    assert not reclaimed.shows_fail("w", "t", "boom", None)


def test_a_rescue_cancel_or_retry_forgets_the_lease_token():
    assert Transition.RESCUE.values(make_job(), 1000)["lease_token"] is None
    assert Transition.CANCEL.values(now_us=1)["lease_token"] is None
    assert Transition.DEPENDENCY_CANCEL.values(now_us=1)["lease_token"] is None
    assert Transition.CANCEL_BLOCKING.values(now_us=1)["lease_token"] is None
    assert Transition.RETRY.values(now_us=1)["lease_token"] is None
