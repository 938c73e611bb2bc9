"""What a job's row tells of its history by itself: its enqueue by its producer, its current
attempt's claim (by worker_id and the instance label worker_instance, at claimed_at, leased
until claimed_until) and that attempt's completion (at updated_at: a completed job's row
changes no more). None of these is written to job_attempts or job_events
(app/jobs/timeline/recorder.py decides what is); GET /jobs/{id}/attempts and /events read
them back from the row (docs/API.md)."""

from __future__ import annotations

import json
from typing import Any

from app.core.statuses import JobStatus
from app.jobs.domain.history import CURRENT_OUTCOMES, Attempt, EventName, JobEvent, Outcome
from app.jobs.domain.models import Job
from app.jobs.domain.transitions import Transition

# The statuses in which the row holds its current attempt: running, or completed by it (a
# failed or cancelled job's last attempt was written when it ended).
HOLDS_AN_ATTEMPT = frozenset({JobStatus.RUNNING, JobStatus.COMPLETED})


def detail_text(values: dict[str, Any]) -> str | None:
    """An event's detail as stored: compact JSON of the values that are not None."""
    kept = {name: value for name, value in values.items() if value is not None}
    return json.dumps(kept, separators=(",", ":"), ensure_ascii=False) if kept else None


def holds_an_attempt(job: Job) -> bool:
    return job.status in HOLDS_AN_ATTEMPT and job.claimed_at is not None


def enqueued_event(job: Job) -> dict[str, Any]:
    return {"job_id": job.id, "at": job.created_at, "event": EventName.ENQUEUED.value,
            "actor": job.producer, "detail": None}


def claimed_event(job: Job) -> dict[str, Any]:
    """The claim of the attempt `job` holds (or held, the row as it stood before its end)."""
    detail = Transition.CLAIM.marks_of(job).detail(job, None)
    return {"job_id": job.id, "at": job.claimed_at, "event": EventName.CLAIMED.value,
            "actor": job.worker_id, "detail": detail_text(dict(detail))}


def completed_event(job: Job) -> dict[str, Any]:
    return {"job_id": job.id, "at": job.updated_at, "event": EventName.COMPLETED.value,
            "actor": job.worker_id, "detail": None}


def attempts_told(job: Job, stored: list[Attempt]) -> list[Attempt]:
    """The job's attempts: those stored, with the row's current one joined to them."""
    if not holds_an_attempt(job):
        return stored
    assert job.claimed_at is not None and job.worker_id is not None
    ended_at = job.updated_at if job.status == JobStatus.COMPLETED else None
    outcome = Outcome.COMPLETED if ended_at is not None else Outcome.RUNNING
    last = stored[-1] if stored else None
    if last is not None and last.outcome in CURRENT_OUTCOMES:
        if last.outcome == outcome:
            return stored
        # Its claim was kept while it ran; its completion is the row's.
        return [*stored[:-1], Attempt(last.id, last.job_id, last.number, last.worker_id,
                                      last.claimed_at, ended_at, outcome.value, None, None,
                                      last.worker_instance)]
    number = 1 if last is None else last.number + 1
    return [*stored, Attempt(0, job.id, number, job.worker_id, job.claimed_at, ended_at,
                             outcome.value, None, None, job.worker_instance)]


def events_told(job: Job, stored: list[JobEvent], current: Attempt | None,
                limit: int) -> list[JobEvent]:
    """The job's newest `limit` events: the `stored` ones (its newest `limit`, oldest
    first) with what the row tells but did not store. `current` is the stored attempt that
    is the row's current one, if any. Whatever was stored after a claim or a completion the
    row tells was written after writing that claim or completion first, so what remains
    untold is the oldest (the enqueue) or the newest."""
    head = [] if any(event.event == EventName.ENQUEUED for event in stored) \
        else [enqueued_event(job)]
    tail = []
    if holds_an_attempt(job):
        if current is None:
            tail.append(claimed_event(job))
        if job.status == JobStatus.COMPLETED and (
                current is None or current.outcome != Outcome.COMPLETED):
            tail.append(completed_event(job))
    told = [JobEvent(0, row["job_id"], row["at"], row["event"], row["actor"], row["detail"])
            for row in head] + stored + [
        JobEvent(0, row["job_id"], row["at"], row["event"], row["actor"], row["detail"])
        for row in tail]
    return told[-limit:]


def current_attempt(stored: list[Attempt]) -> Attempt | None:
    """The stored attempt that is the row's current one (see CURRENT_OUTCOMES), if any."""
    if stored and stored[-1].outcome in CURRENT_OUTCOMES:
        return stored[-1]
    return None
