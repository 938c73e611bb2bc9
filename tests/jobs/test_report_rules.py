"""The worker report rules on a fake unit of work (tests/jobs/fakes.py): who may complete or
fail a job, the reason a refusal gives, a repeat of a report that landed, and the retry
budget, decided without a database."""

from __future__ import annotations

import random

import pytest

from app.core.callers import Caller, Role
from app.core.clock import MICROS, ManualClock
from app.core.errors import NotFound
from app.core.priorities import Priority
from app.core.statuses import JobStatus
from app.jobs.domain.intake import IntakeRules
from app.jobs.domain.models import Backoff
from app.jobs.domain.settings import QueueSettings
from app.jobs.usecases.enqueue import Enqueuing
from app.jobs.usecases.reports import ReportRefused, WorkerReports
from app.jobs.wake.waiting import JobSignal
from tests.jobs.fakes import FakeUnitOfWork

PRODUCER = Caller("shop", Role.PRODUCER, Priority.CRITICAL, None)
WORKER = Caller("w1", Role.WORKER, Priority.CRITICAL, None)
OTHER = Caller("w2", Role.WORKER, Priority.CRITICAL, None)
SETTINGS = QueueSettings(job_types=frozenset({"email"}), lease_seconds=60,
                         max_payload_bytes=65_536, backoff=Backoff(1, 60), bulk_batch_size=10)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start_us=1_800_000_000_000_000)


@pytest.fixture
def uow() -> FakeUnitOfWork:
    return FakeUnitOfWork()


@pytest.fixture
def reports(uow: FakeUnitOfWork, clock: ManualClock) -> WorkerReports:
    return WorkerReports(uow, clock, SETTINGS, random.Random(7))  # type: ignore[arg-type]


@pytest.fixture
def held(uow: FakeUnitOfWork, clock: ManualClock):
    """Enqueue a job (with `max_retries`) and lease it to WORKER; its id."""

    def hold(max_retries: int = 3) -> int:
        enqueuing = Enqueuing(uow, clock, IntakeRules(SETTINGS.job_types,  # type: ignore[arg-type]
                                                      SETTINGS.max_payload_bytes), JobSignal())
        job = enqueuing.enqueue(PRODUCER, {"type": "email", "payload": {},
                                           "max_retries": max_retries}).job
        uow.jobs.claimed(job.id, worker=WORKER.name, now_us=clock.now_us(),
                         lease_us=60 * MICROS, token="t1")
        uow.told.clear()
        return job.id

    return hold


def test_a_complete_by_another_worker_is_refused_with_the_reason_and_recorded(
        reports, uow, held):
    job_id = held()
    with pytest.raises(ReportRefused) as refused:
        reports.complete(OTHER, job_id, lease_token=None, result={"ok": True})
    assert refused.value.detail == "The job is held by another worker."
    assert uow.jobs.rows[job_id].status == JobStatus.RUNNING
    assert uow.timeline.told[-1] == ("report_refused", [job_id], {
        "report": "complete", "reason": "The job is held by another worker."})
    assert uow.told == [("report_refused", 1)]


def test_a_fail_after_the_lease_ran_out_is_refused_as_expired(reports, uow, held, clock):
    job_id = held()
    clock.advance(61)
    with pytest.raises(ReportRefused) as refused:
        reports.fail(WORKER, job_id, lease_token="t1", error="boom", retry_in_seconds=None)
    assert refused.value.detail == "The lease on this job has expired."
    assert uow.jobs.rows[job_id].status == JobStatus.RUNNING


def test_a_report_under_an_earlier_lease_token_is_refused(reports, held):
    job_id = held()
    with pytest.raises(ReportRefused) as refused:
        reports.heartbeat(WORKER, job_id, lease_token="t0", lease_seconds=None)
    assert refused.value.detail == "The lease token names an earlier attempt."


def test_a_report_on_no_job_is_not_found(reports):
    with pytest.raises(NotFound):
        reports.complete(WORKER, 99, lease_token=None, result=None)


def test_a_repeat_of_a_complete_that_landed_is_answered_with_the_job(reports, uow, held):
    job_id = held()
    done = reports.complete(WORKER, job_id, lease_token="t1", result={"ok": True})
    again = reports.complete(WORKER, job_id, lease_token="t1", result={"ok": True})
    assert again == done and done.status == JobStatus.COMPLETED
    assert uow.told == [("completed", 1)] and uow.finished == 1
    with pytest.raises(ReportRefused):  # another result is no repeat
        reports.complete(WORKER, job_id, lease_token="t1", result={"ok": False})


def test_a_repeat_of_a_fail_that_landed_is_answered_with_the_job(reports, uow, held):
    job_id = held()
    failed = reports.fail(WORKER, job_id, lease_token="t1", error="boom", retry_in_seconds=5)
    again = reports.fail(WORKER, job_id, lease_token="t1", error="boom", retry_in_seconds=5)
    assert again == failed and failed.status == JobStatus.PENDING
    assert uow.told == [("retried", 1)]


def test_a_fail_retries_while_the_budget_lasts_then_fails_the_job(reports, uow, held, clock):
    job_id = held(max_retries=1)
    retried = reports.fail(WORKER, job_id, lease_token="t1", error="boom", retry_in_seconds=5)
    assert (retried.status, retried.retry_count) == (JobStatus.PENDING, 1)
    assert retried.run_at == clock.now_us() + 5 * MICROS
    uow.jobs.claimed(job_id, worker=WORKER.name, now_us=clock.now_us(), lease_us=60 * MICROS,
                     token="t2")
    last = reports.fail(WORKER, job_id, lease_token="t2", error="boom again",
                        retry_in_seconds=None)
    assert (last.status, last.retry_count, last.error) == (JobStatus.FAILED, 1, "boom again")
    assert uow.told == [("retried", 1), ("failed", 1)] and uow.finished == 1


def test_complete_many_answers_each_item_on_its_own(reports, uow, held):
    mine, theirs = held(), held()
    uow.jobs.claimed(theirs, worker=OTHER.name, now_us=0, lease_us=10**18, token="o1")
    answers = reports.complete_many(WORKER, [{"id": mine, "lease_token": "t1"},
                                             {"id": theirs, "lease_token": None},
                                             {"id": 99}])
    assert answers[0] == (mine, uow.jobs.rows[mine])
    assert uow.jobs.rows[mine].status == JobStatus.COMPLETED
    assert isinstance(answers[1][1], ReportRefused) and isinstance(answers[2][1], NotFound)
    assert uow.jobs.rows[theirs].status == JobStatus.RUNNING
    assert ("completed", 1) in uow.told and ("report_refused", 1) in uow.told
