"""What the job service writes into a job's history, in the transaction of the change itself.

The rule of what is written lives here. A job's row tells an uneventful life by itself
(app/jobs/timeline/row_story.py): its enqueue by its producer, its current attempt's claim
and that attempt's completion. Those are not written. Everything else is — a failure, a lost
lease, a cancel or its request, a refused report, a retry, a deduplicated enqueue, a push
delivery, a reservation's end, a dependency's move, an expiry — and before it, in the same
transaction, whatever of the row's story it follows that is not stored yet (`_keep`): so the
stored events stay in the order they happened, and the next claim, overwriting claimed_at and
worker_id, loses nothing.

Every method takes the connection of the job service's transaction: an attempt or an event is
stored if and only if the change it records commits (a refused report, whose own
transaction is rolled back, is written in a transaction of its own).
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection

from app.core.clock import MICROS, to_rfc3339
from app.core.fingerprint import error_fingerprint
from app.core.limits import FAILURE_SAMPLE_CHARS
from app.core.statuses import JobStatus
from app.jobs.domain.history import EventName, Outcome
from app.jobs.domain.models import LEASE_EXPIRED_ERROR, Job
from app.jobs.domain.transitions import Transition
from app.jobs.timeline.failure_repository import Failure, FailureRepository
from app.jobs.timeline.instance_repository import InstanceRepository
from app.jobs.timeline.instances import InstanceTallies
from app.jobs.timeline.repository import HistoryRepository
from app.jobs.timeline.row_story import (
    claimed_event,
    completed_event,
    detail_text,
    holds_an_attempt,
)
from app.jobs.timeline.stats_repository import CountKey, StatsRepository
from app.storage.engine import statement_of_its_own

# A stale worker retrying a refused report forever must not grow a job's timeline without
# bound: past this many report_refused events on one job, further refusals are only counted
# (the metric), not stored.
MAX_REFUSALS_KEPT = 100
# The attempts whose errors form failure groups: a worker's fail, a lease run out, a deadline
# passed (a cancelled attempt is nobody's failure).
GROUPED_OUTCOMES = frozenset({Outcome.FAILED, Outcome.LEASE_EXPIRED, Outcome.TIMED_OUT})
# A key's last-seen time is written at most this often per process; /workers and explain
# read it to about this precision.
ACTIVITY_INTERVAL_US = 60 * MICROS
# The transitions whose event the row tells (the claim, the completion): not written.
TOLD_BY_THE_ROW = frozenset({Transition.CLAIM, Transition.COMPLETE})


def _detail(**values: Any) -> str | None:
    return detail_text(values)


# Fingerprinting a long error costs milliseconds: a fail fingerprints its error before it
# takes the write lock (`fingerprint_of`), and the recorder, inside it, finds it remembered.
fingerprint_of = functools.lru_cache(maxsize=32)(error_fingerprint)

# A time no job has (the last microsecond of year 9999): where it shows in a detail written
# for a stand-in job, a statement writes the text of the time only the row knows.
_UNKNOWN_TIME = 253402300799999999


# A job as a fail leaves it, its times those no job has: the details a fail writes are its
# own with its status and error (fail_history).
_STAND_IN = Job(id=0, type="", payload="", priority=0, status=JobStatus.RUNNING.value,
                retry_count=0, max_retries=0, producer="", idempotency_key=None,
                request_fingerprint=None, run_at=_UNKNOWN_TIME, claimed_at=_UNKNOWN_TIME,
                worker_id="", lease_expires_at=None, lease_token=None, result=None,
                error=None, created_at=0, updated_at=0, claimed_until=_UNKNOWN_TIME)


def _around_time(detail: str | None) -> tuple[str, str]:
    """A detail holding _UNKNOWN_TIME's text: the text before it and after it (its last
    place: the error, which may hold anything, comes before it)."""
    before, found, after = (detail or "").rpartition(to_rfc3339(_UNKNOWN_TIME) or "")
    if not found:
        raise ValueError("the detail does not hold the time")
    return before, after


@dataclass(frozen=True, slots=True)
class FailHistory:
    """What a worker's fail that ends a plain job's attempt writes into its history, for one
    statement that reads the job's row as it changes it (app/jobs/sql/fail_repository.py): the
    attempt's outcome and error with its failure group (fingerprint, sample), and, when
    events are written (`events`), each event's name and detail. Where a detail holds a
    time only the row knows, it is the text before and after that time's RFC 3339 text:
    the attempt's claim (`claimed`, its lease's end claimed_until), a retry (`retried`, its
    run_at); a failure for good needs none (`failed`)."""

    outcome: str
    error: str
    fingerprint: str
    sample: str
    events: bool
    claimed: tuple[str, str, str]
    retried: tuple[str, str, str]
    failed: tuple[str, str | None]


class HistoryRecorder:
    """Writes attempts always, events unless `events` is off (QUEUELOG_JOB_EVENTS=0), and the
    per-minute stats (docs/OPERATIONS.md) unless `stats` is off (QUEUELOG_STATS=0)."""

    def __init__(self, *, events: bool = True, stats: bool = True) -> None:
        self.events = events
        self.stats = stats
        # name -> (last seen written, last claim written), in this process.
        self._written: dict[str, tuple[int, int]] = {}
        self._written_lock = threading.Lock()
        # Each key's instances, counted in this process.
        self.instances = InstanceTallies()

    def transition(self, conn: Connection, transition: Transition, jobs: Sequence[Job], *,
                   actor: str, now_us: int, held_by: str | None = None,
                   details: Mapping[int, Mapping[str, Any]] | None = None,
                   counts: Counter[CountKey] | None = None,
                   before: Mapping[int, Job] | None = None,
                   current_attempts: Mapping[int, str | None] | None = None) -> None:
        """Record `transition`, which left `jobs` as they are; `held_by` names the worker a
        rescued lease belonged to; `details`, by job id, adds to an event's detail what the
        job alone does not say (the dependency that cancelled it). `before`, by job id, is
        the row as it stood before an attempt's end that clears its claim (a failure sent
        back to pending); `current_attempts`, by job id, the outcome of its stored current
        attempt as the caller read it with that row (None: none stored), for the jobs whose
        attempt is not to be looked up again. What it adds to the stats goes into `counts`,
        which the
        transaction hands to its process once committed (app/jobs/timeline/stats_buffer.py;
        without: written at once, in the transaction)."""
        if not jobs:
            return
        repo = HistoryRepository(conn)
        edge = transition.value
        outcome = edge.closes_attempt
        # What the rows told and lose now (claims), written just before the transition's own.
        rows: list[dict[str, Any]] = []
        if outcome is not None and outcome is not Outcome.COMPLETED:
            held = before or {}
            rows = self._end_attempts(conn, repo, outcome, jobs,
                                      [held.get(job.id, job) for job in jobs], now_us,
                                      current_attempts or {})
        if self.stats:
            self._count(conn, transition, jobs, now_us, counts)
        if not self.events:
            return
        if transition not in TOLD_BY_THE_ROW:
            extra = details or {}
            rows += [row for job in jobs
                     if (row := self._event_row(transition, job, actor, now_us, held_by,
                                                extra.get(job.id)))]
        if rows:
            repo.add_events(rows)

    def counted(self, conn: Connection, transition: Transition, jobs: Sequence[Job], *,
                now_us: int, counts: Counter[CountKey] | None = None) -> None:
        """Count into the stats a transition whose history its own statement wrote (see
        fail_history): as `transition` counts it, and nothing written."""
        if self.stats and jobs:
            self._count(conn, transition, jobs, now_us, counts)

    def fail_history(self, error: str) -> FailHistory:
        """What a worker's fail with `error` (as stored) writes into a plain job's history,
        as transition(Transition.FAIL) writes it for a job whose claim only its row told."""
        outcome = Transition.FAIL.value.closes_attempt
        assert outcome is not None
        retried = replace(_STAND_IN, status=JobStatus.PENDING.value, error=error)
        failed = replace(_STAND_IN, status=JobStatus.FAILED.value, error=error)
        claimed = claimed_event(retried)
        retry = self._event_row(Transition.FAIL, retried, "", 0, None, None) or {}
        end = self._event_row(Transition.FAIL, failed, "", 0, None, None) or {}
        return FailHistory(
            outcome=outcome.value, error=error, fingerprint=fingerprint_of(error),
            sample=error[:FAILURE_SAMPLE_CHARS.max], events=self.events,
            claimed=(claimed["event"], *_around_time(claimed["detail"])),
            retried=(retry["event"], *_around_time(retry["detail"])),
            failed=(end["event"], end["detail"]))

    def enqueued(self, conn: Connection, jobs: Sequence[Job], *,
                 actor: str | None = None, actors: Sequence[str] | None = None,
                 counts: Counter[CountKey] | None = None) -> None:
        """Record new jobs: one multi-row INSERT for a batch. The actor is the producer
        unless told: `actor` for all, or `actors` one per job (schedules' jobs:
        `schedule:<name>`)."""
        if self.stats and jobs:
            # A reserved job is counted when it is confirmed (it is no work before).
            made = Counter((job.type, "enqueued") for job in jobs
                           if job.status != JobStatus.RESERVED)
            self._add(conn, made, jobs[0].created_at, counts)
        if self.events and jobs:
            # The row tells an enqueue by its producer; another actor's is written.
            who = actors or [actor or job.producer for job in jobs]
            rows = [{"job_id": job.id, "at": job.created_at, "event": EventName.ENQUEUED.value,
                     "actor": name, "detail": None}
                    for job, name in zip(jobs, who, strict=True) if name != job.producer]
            if rows:
                HistoryRepository(conn).add_events(rows)

    def deduplicated(self, conn: Connection, jobs: Sequence[Job], *, actor: str,
                     now_us: int) -> None:
        """Record unique enqueues that met these jobs and got them back (`return`). Kept up to
        the same bound as refused reports: a producer sending one key in a loop must not grow
        a timeline without end."""
        if not self.events or not jobs:
            return
        repo = HistoryRepository(conn)
        kept = [job for job in jobs
                if repo.count_events(job.id, EventName.DEDUPLICATED) < MAX_REFUSALS_KEPT]
        self._keep(repo, kept, completions=True)
        repo.add_events([{"job_id": job.id, "at": now_us, "event": EventName.DEDUPLICATED.value,
                          "actor": actor, "detail": None} for job in kept])

    def delivered(self, conn: Connection, job: Job, status: int, *, actor: str,
                  now_us: int) -> None:
        """Record that a push delivery of `job` was answered with HTTP `status` (before the
        completed, retry_scheduled or failed event its outcome makes). `job` still holds the
        attempt's claim (as its report found it, or completed)."""
        if self.events:
            repo = HistoryRepository(conn)
            self._keep(repo, [job], completions=False)
            repo.add_events([{
                "job_id": job.id, "at": now_us, "event": EventName.DELIVERED.value,
                "actor": actor, "detail": _detail(status_code=status)}])

    def cancel_requested(self, conn: Connection, job: Job, *, actor: str,
                         now_us: int) -> None:
        """Record that `actor` asked for the running job's cancel (its end, later, records
        the cancelled event)."""
        if self.events:
            repo = HistoryRepository(conn)
            self._keep(repo, [job], completions=False)
            repo.add_events([{
                "job_id": job.id, "at": now_us, "event": EventName.CANCEL_REQUESTED.value,
                "actor": actor, "detail": _detail(worker=job.worker_id)}])

    def report_refused(self, conn: Connection, job: Job, *, worker: str, report: str,
                       reason: str, now_us: int) -> None:
        """Record a heartbeat, complete or fail refused with 409 on `job` as it is now (in a
        transaction of its own: the refused request's was rolled back)."""
        if not self.events:
            return
        repo = HistoryRepository(conn)
        job_id = job.id
        if repo.count_events(job_id, EventName.REPORT_REFUSED) >= MAX_REFUSALS_KEPT:
            return
        self._keep(repo, [job], completions=True)
        repo.add_events([{"job_id": job_id, "at": now_us,
                          "event": EventName.REPORT_REFUSED.value, "actor": worker,
                          "detail": _detail(report=report, reason=reason)}])

    def seen(self, conn: Connection, name: str, now_us: int, *, claimed: bool,
             instance: str | None = None, jobs: int = 0) -> None:
        """Note that a worker key claimed (taking `jobs` jobs) or reported now: written at
        most once a minute per key and process; and, with the `instance` label its worker
        sent, that instance's note (app/jobs/timeline/instances.py), likewise at most once a
        minute per key, label and process. Each write is a statement of its own in
        one-statement work. (Noted in memory before the commit: a transaction rolled back
        after this only delays the next write by a minute.)"""
        note = None if instance is None else self.instances.note(
            name, instance, now_us, claimed=jobs if claimed else None)
        with self._written_lock:
            seen_at, claim_at = self._written.get(name, (0, 0))
            due_seen = now_us - seen_at >= ACTIVITY_INTERVAL_US
            due_claim = claimed and now_us - claim_at >= ACTIVITY_INTERVAL_US
            due = due_seen or due_claim
            if due:
                self._written[name] = (now_us, now_us if claimed else claim_at)
        if due:
            with statement_of_its_own(conn):
                HistoryRepository(conn).record_activity(name, now_us, claimed=claimed)
        if note is not None:
            with statement_of_its_own(conn):
                InstanceRepository(conn).record(note)

    def _keep(self, repo: HistoryRepository, jobs: Sequence[Job], *,
              completions: bool) -> None:
        """Write what the rows of `jobs` tell and is not stored yet, before what follows it
        is. Without `completions`, each job is the row as it holds its attempt's claim (the
        report's, or the one an attempt's end is about to clear): that claim, an attempt
        running, with its claimed event. With `completions`, each job is its row as it is
        now: the attempt it holds, if any (running or completed), and a completed one's
        completion too. The enqueue, always first, stays told by the row."""
        holding = [job for job in jobs
                   if (holds_an_attempt(job) if completions else job.claimed_at is not None)]
        if not holding:
            return
        stored = repo.current_outcomes([job.id for job in holding])
        claims = [job for job in holding if job.id not in stored]
        if claims:
            repo.open_attempts([{"job_id": job.id, "worker_id": job.worker_id,
                                 "claimed_at": job.claimed_at,
                                 "worker_instance": job.worker_instance} for job in claims])
        events = []
        for job in holding:
            if job.id not in stored:
                events.append(claimed_event(job))
            if (completions and job.status == JobStatus.COMPLETED
                    and stored.get(job.id) != Outcome.COMPLETED.value):
                repo.close_attempts([{"closed_job_id": job.id, "new_error": None,
                                      "new_fingerprint": None}],
                                    Outcome.COMPLETED, job.updated_at)
                events.append(completed_event(job))
        if self.events and events:
            repo.add_events(events)

    def _end_attempts(self, conn: Connection, repo: HistoryRepository, outcome: Outcome,
                      jobs: Sequence[Job], held: Sequence[Job], now_us: int,
                      known: Mapping[int, str | None]) -> list[dict[str, Any]]:
        """End the jobs' attempts (`held`: each job's row as it held the attempt's claim); a
        failed one is counted into its failure group (docs/OPERATIONS.md, Failure groups), by
        the fingerprint of its error as stored (redacted). An attempt whose claim only its
        row told is stored ended, in one statement; returns the claimed events of those, for
        the caller to write before what ended them (the enqueue stays told by the row).
        `known`: the stored current attempts already read (see transition)."""
        holding = [job for job in held if job.claimed_at is not None]
        unknown = [job.id for job in holding if job.id not in known]
        stored = repo.current_outcomes(unknown) if unknown else {}
        stored |= {job_id: outcome for job_id, outcome in known.items() if outcome is not None}
        unstored = {job.id: job for job in holding if job.id not in stored}
        ended, closed, failures = [], [], []
        for job in jobs:
            error = self._error(outcome, job)
            fingerprint = None
            if error is not None and outcome in GROUPED_OUTCOMES:
                fingerprint = fingerprint_of(error)
                failures.append(Failure(job.type, fingerprint,
                                        error[:FAILURE_SAMPLE_CHARS.max],
                                        ended_failed=job.status == JobStatus.FAILED))
            claim = unstored.get(job.id)
            if claim is None:
                closed.append({"closed_job_id": job.id, "new_error": error,
                               "new_fingerprint": fingerprint})
            else:
                ended.append({"job_id": job.id, "worker_id": claim.worker_id,
                              "worker_instance": claim.worker_instance,
                              "claimed_at": claim.claimed_at, "error": error,
                              "fingerprint": fingerprint})
        if ended:
            repo.add_ended_attempts(ended, outcome, now_us)
        if closed:
            repo.close_attempts(closed, outcome, now_us)
        if failures:
            FailureRepository(conn).record(failures, now_us)
        return [claimed_event(job) for job in unstored.values()]

    @staticmethod
    def _add(conn: Connection, made: Counter[CountKey], now_us: int,
             counts: Counter[CountKey] | None) -> None:
        if counts is None:
            StatsRepository(conn).add(made, now_us)
        else:
            counts.update(made)

    @classmethod
    def _count(cls, conn: Connection, transition: Transition, jobs: Sequence[Job],
               now_us: int, counts: Counter[CountKey] | None) -> None:
        """Add what this transition did to the minute's stats: an attempt started (claimed),
        a job completed, an attempt failed (the attempts failure groups count: a fail, a
        lease run out, a deadline passed), a reserved job confirmed (enqueued)."""
        edge = transition.value
        kind = None
        if edge.opens_attempt:
            kind = "claimed"
        elif edge.closes_attempt is Outcome.COMPLETED:
            kind = "completed"
        elif edge.closes_attempt in GROUPED_OUTCOMES:
            kind = "failed"
        elif transition is Transition.CONFIRM:
            kind = "enqueued"
        if kind is not None:
            made = Counter((job.type, kind) for job in jobs)
            if kind == "claimed":
                # First attempts apart: a retry budget's window counts them (they are no
                # column of the stats, which leave them out).
                made.update((job.type, "claimed_first") for job in jobs if job.retry_count == 0)
            cls._add(conn, made, now_us, counts)

    @staticmethod
    def _error(outcome: Outcome, job: Job) -> str | None:
        if outcome in (Outcome.COMPLETED, Outcome.SUSPENDED):
            return None
        if outcome is Outcome.LEASE_EXPIRED:
            return LEASE_EXPIRED_ERROR
        return job.error

    @staticmethod
    def _event_row(transition: Transition, job: Job, actor: str, now_us: int,
                   held_by: str | None, extra: Mapping[str, Any] | None
                   ) -> dict[str, Any] | None:
        marks = transition.marks_of(job)
        if marks.event is None:
            return None
        return {"job_id": job.id, "at": now_us, "event": marks.event.value, "actor": actor,
                "detail": _detail(**marks.detail(job, held_by), **(extra or {}))}
