"""A plain job's fail that waits for its row (PostgreSQL) while another transaction stores its
running attempt (a refused report's record) ends that attempt: one attempt, one claimed event
(app/jobs/sql/fail_repository.py)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from app.jobs.sql.repository import JobRepository
from app.jobs.timeline.recorder import HistoryRecorder
from tests.conftest import ENGINES, Api
from tests.jobs.test_claim_stamped_under_lock import wait_until, waiting_for_a_lock


@pytest.fixture(params=[e for e in ENGINES if getattr(e, "values", [e])[0] == "postgresql"])
def engine_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_an_attempt_stored_while_the_fail_waits_is_ended_and_its_claim_told_once(
        app, client, api: Api, producer, worker, admin, clock):
    job_id = api.enqueue(producer, max_retries=2).json["id"]
    token = api.claim(worker).json["lease_token"]
    found = app.extensions["queuelog"]
    answers: list[Any] = []
    with found.db.engine.connect() as rival:
        transaction = rival.begin()
        # A refused report's record: the job's row locked, its claim stored, its refusal.
        held = JobRepository(rival).get_job(job_id, for_update=True)
        assert held is not None
        HistoryRecorder().report_refused(rival, held, worker="worker-2", report="heartbeat",
                                         reason="The job is held by another worker.",
                                         now_us=clock.now_us())
        thread = threading.Thread(target=lambda: answers.append(
            api.fail(worker, job_id, lease_token=token, retry_in_seconds=5)))
        thread.start()
        wait_until(lambda: bool(waiting_for_a_lock(app)), "the fail never waited for the row")
        transaction.commit()
    thread.join()
    [failed] = answers
    assert (failed.status_code, failed.json["status"]) == (200, "pending")
    attempts = client.get(f"/jobs/{job_id}/attempts", headers=admin.headers).json["attempts"]
    assert [(a["number"], a["outcome"]) for a in attempts] == [(1, "failed")]
    events = client.get(f"/jobs/{job_id}/events", headers=admin.headers).json["events"]
    assert [e["event"] for e in events] == ["enqueued", "claimed", "report_refused",
                                            "retry_scheduled"]
