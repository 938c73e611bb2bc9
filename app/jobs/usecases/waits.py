"""Waiting without a worker (docs/WAITS.md): a worker suspends the job it holds until a moment,
an event of the job's producer or a waitpoint token's completion; whichever of those (or the
wait's timeout) comes first resumes it, once. Resuming is one conditional UPDATE from
`suspended` (Transition.RESUME): of two rivals (an event and the timeout, two answers to one
token), the second changes nothing.

An event and a wait for it may cross: each takes the lock of the producer's event name and
key first (WaitRepository.lock_event), so the later of the two always sees the earlier. An
event that woke nobody is kept (QUEUELOG_EVENT_KEEP_SECONDS) for the first wait for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.callers import Caller
from app.core.clock import MICROS, Clock, to_rfc3339
from app.core.errors import NotFound, WaitEnded
from app.core.statuses import JobStatus
from app.jobs.domain.intake import sized_json
from app.jobs.domain.models import Job
from app.jobs.domain.transitions import Transition
from app.jobs.domain.waits import (
    ResumedBy,
    Wait,
    WaitKind,
    new_token,
    resumed_text,
    token_hash,
    waiting_for,
)
from app.jobs.sql.wait_repository import StoredWait
from app.jobs.tx.uow import CLAIMABLE, JobsTx, JobsUnitOfWork
from app.jobs.usecases.reports import ReportRefused, WorkerReports

# How many suspended jobs one maintenance round resumes per transaction, and events it forgets.
RESUME_BATCH = 500
FORGET_BATCH = 1000
FORGET_EVERY_SECONDS = 60


@dataclass(frozen=True, slots=True)
class Suspended:
    """A suspend's answer: the job (suspended, or pending when a kept event resumed it at
    once), what it waits for, and the waitpoint token (a token wait's, shown this once)."""

    job: Job
    waiting_for: dict[str, Any] | None
    token: str | None = None


@dataclass(frozen=True, slots=True)
class EventPosted:
    """POST /events' answer: how many waits the event ended (0: it is kept for a later one),
    and whether it is a repeat of an event posted with the same Idempotency-Key."""

    woken: int
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class TokenCompleted:
    job_id: int
    at_us: int


class Waits:
    """`event_keep_seconds`: how long an event is kept (QUEUELOG_EVENT_KEEP_SECONDS);
    `max_payload_bytes`: the largest event or token data."""

    def __init__(self, uow: JobsUnitOfWork, clock: Clock, reports: WorkerReports, *,
                 event_keep_seconds: int, max_payload_bytes: int) -> None:
        self.uow = uow
        self.clock = clock
        self.reports = reports
        self.event_keep_us = event_keep_seconds * MICROS
        self.max_payload_bytes = max_payload_bytes
        self._next_forget_us = 0

    # -- suspend --------------------------------------------------------------------------

    def suspend(self, caller: Caller, job_id: int, *, lease_token: str | None, wait: Wait,
                checkpoint: dict[str, Any] | None = None) -> Suspended:
        """running → suspended, by the worker holding the job: its attempt ends (outcome
        suspended), its checkpoint is saved, and it waits. A wait for an event that was
        posted before and kept resumes at once. A repeat of a suspend that landed (same
        lease token) answers the job as it is, without the token (shown once). Refused
        (409, recorded) when the caller does not hold the job; a job whose cancel was
        requested ends cancelled, as any report of it does."""
        stored_checkpoint = (None if checkpoint is None else
                             sized_json(checkpoint, "checkpoint", self.max_payload_bytes))

        def suspend_in(tx: JobsTx) -> Suspended:
            repo = tx.jobs_confirming(caller)  # by the read that locks the job
            now = self.clock.now_us()
            held = tx.fails.job_to_end(job_id)
            if held is None or not held.job.is_held_by(caller.name, now, lease_token):
                current = None if held is None else held.job
                if (current is not None and lease_token is not None
                        and current.lease_token == lease_token
                        and current.status == JobStatus.SUSPENDED):
                    return Suspended(current, self._waiting_for(tx, current))
                self.reports.refuse_report(current, caller, now, lease_token)
            job = held.job
            if stored_checkpoint is not None:
                tx.controls.save_checkpoint(job_id, stored_checkpoint, now)
            if held.cancel_requested_by is not None:
                return Suspended(self._stop(tx, job, caller, now, lease_token), None)
            if wait.kind is WaitKind.EVENT:
                tx.waits.lock_event(job.producer, wait.event or "", wait.key)
            made = Transition.SUSPEND
            wake_at = wait.wake_at(now)
            suspended = repo.apply_transition(
                made, job_id, made.values(now_us=now), worker=caller.name,
                now_us=now, lease_token=lease_token)
            if suspended is None:  # another transaction changed it first (PostgreSQL only)
                raise ReportRefused("The job changed while this request ran; its lease is "
                                    "gone.", job_id=job_id, worker=caller.name)
            token = new_token() if wait.kind is WaitKind.TOKEN else None
            tx.waits.save_wait({
                "job_id": job_id, "kind": wait.kind.value,
                "producer": job.producer if wait.kind is WaitKind.EVENT else None,
                "event_name": wait.event, "event_key": wait.key if wait.event else None,
                "token_hash": None if token is None else token_hash(token),
                "until_at": wake_at, "suspended_at": now, "resolved_by": None,
                "resolved_at": None})
            shown = waiting_for(wait.kind, wake_at, wait.event, wait.key)
            tx.after_transition(made, [suspended], actor=caller.name, now_us=now,
                                before={job_id: job},
                                details={job_id: {"waiting_for": shown}},
                                current_attempts={job_id: held.stored_attempt})
            tx.timeline.seen(caller.name, now, claimed=False)
            if wait.kind is WaitKind.EVENT:
                kept = tx.waits.take_kept_event(job.producer, wait.event or "", wait.key,
                                                job_id, now)
                if kept is not None:
                    [resumed] = self._resume(tx, [job_id], ResumedBy.EVENT, kept.data, now)
                    return Suspended(resumed, None)
            return Suspended(suspended, shown, token)

        return self.reports.report("suspend", caller, job_id, suspend_in)

    def _stop(self, tx: JobsTx, job: Job, caller: Caller, now: int,
              lease_token: str | None) -> Job:
        made = Transition.STOP
        stopped = tx.jobs.apply_transition(made, job.id, made.values(now_us=now),
                                           worker=caller.name, now_us=now,
                                           lease_token=lease_token)
        if stopped is None:
            raise ReportRefused("The job changed while this request ran; its lease is gone.",
                                job_id=job.id, worker=caller.name)
        requested_by = tx.controls.cancel_requested_by(job.id)
        tx.controls.forget_cancel_requests([job.id])
        tx.after_transition(made, [stopped], actor=caller.name, now_us=now,
                            details={job.id: {"cancel_requested_by": requested_by}})
        tx.timeline.seen(caller.name, now, claimed=False)
        return stopped

    # -- what ends a wait -----------------------------------------------------------------

    def post_event(self, caller: Caller, producer: str, name: str, key: str,
                   data: dict[str, Any] | None, *, idempotency_key: str | None) -> EventPosted:
        """Resume every job of `producer` suspended on the event `name` with `key`, with the
        event's data; none: the event is kept for the first wait for it. The same
        Idempotency-Key again (while the event is kept) answers as the first did. `caller`
        posts it: a key revoked meanwhile resumes nothing and keeps nothing."""
        stored_data = None if data is None else sized_json(data, "data", self.max_payload_bytes)
        actor = caller.name

        def post_in(tx: JobsTx) -> EventPosted:
            tx.confirm(caller)
            now = self.clock.now_us()
            tx.waits.lock_event(producer, name, key)
            stored = {"producer": producer, "name": name, "event_key": key,
                      "data": stored_data, "idempotency_key": idempotency_key,
                      "posted_at": now, "keep_until": now + self.event_keep_us, "woken": 0,
                      "taken_by": None}
            event_id = None
            if idempotency_key is not None:
                # Stored first, so that a rival with the same key (another name's lock)
                # waits for this one's commit at the unique index and then finds it.
                event_id = tx.waits.add_event_once(stored)
                if event_id is None:
                    first = tx.waits.event_by_idempotency_key(producer, idempotency_key)
                    return EventPosted(0 if first is None else first.woken, replayed=True)
            waiters = tx.waits.event_waiters(producer, name, key)
            woken = self._resume(tx, waiters, ResumedBy.EVENT, stored_data, now, actor=actor)
            if event_id is None:
                tx.waits.add_event(stored | {"woken": len(woken)})
            elif woken:
                tx.waits.set_woken(event_id, len(woken))
            return EventPosted(len(woken))

        return self.uow.run(post_in)

    def complete_token(self, token: str, data: dict[str, Any] | None) -> TokenCompleted:
        """Resume the job whose wait the token names, with `data`; once. NotFound for a
        token nobody holds; Conflict, naming when, for one whose wait has ended."""
        stored_data = None if data is None else sized_json(data, "data", self.max_payload_bytes)
        hashed = token_hash(token)

        def complete_in(tx: JobsTx) -> TokenCompleted:
            now = self.clock.now_us()
            wait = tx.waits.wait_of_token(hashed)
            if wait is None:
                raise NotFound("No such waitpoint.")
            if wait.resolved_at is None and self._resume(
                    tx, [wait.job_id], ResumedBy.TOKEN, stored_data, now, actor="waitpoint"):
                return TokenCompleted(wait.job_id, now)
            raise _ended(tx.waits.wait_of_token(hashed) or wait)

        return self.uow.run(complete_in)

    def resume_due(self) -> int:
        """Maintenance: resume the suspended jobs whose moment has come (a sleep's end: by
        time; a wait's timeout: by timeout), a batch per transaction; how many. Asked first
        in a read, so that a round with nothing due writes nothing."""
        if not self.uow.read(lambda tx: tx.waits.any_due(self.clock.now_us())):
            return 0
        total = 0
        while True:
            def resume_in(tx: JobsTx) -> int:
                now = self.clock.now_us()
                due = tx.waits.due_suspended(now, RESUME_BATCH)
                slept = [job_id for job_id, kind in due if kind == WaitKind.TIME]
                timed_out = [job_id for job_id, kind in due if kind != WaitKind.TIME]
                self._resume(tx, slept, ResumedBy.TIME, None, now)
                self._resume(tx, timed_out, ResumedBy.TIMEOUT, None, now)
                if len(due) < RESUME_BATCH:
                    # A wait whose job left it otherwise and kept it open (none should) is
                    # ended, or its moment would stay due at every ask of maintenance.
                    tx.waits.end_orphaned(now)
                return len(due)

            batch = self.uow.write_alone(resume_in)
            total += batch
            if batch < RESUME_BATCH:
                return total

    def forget_events(self) -> None:
        """Maintenance: remove the events whose keeping has ended, a batch per transaction,
        at most once every FORGET_EVERY_SECONDS (an event kept a minute longer costs
        nothing, and an idle database is asked nothing meanwhile)."""
        now = self.clock.now_us()
        if now < self._next_forget_us:
            return
        self._next_forget_us = now + FORGET_EVERY_SECONDS * MICROS
        while self.uow.write_alone(lambda tx: tx.waits.delete_events_kept_until(
                self.clock.now_us(), FORGET_BATCH)) >= FORGET_BATCH:
            pass

    def _waiting_for(self, tx: JobsTx, job: Job) -> dict[str, Any] | None:
        if job.status != JobStatus.SUSPENDED:
            return None
        return tx.waits.waiting_for([job.id]).get(job.id)

    def _resume(self, tx: JobsTx, job_ids: list[int], by: ResumedBy, data: str | None,
                now: int, *, actor: str = "queuelog") -> list[Job]:
        """suspended → pending for those of these jobs still suspended, each once; their
        waits are resolved and the waiting claims told."""
        if not job_ids:
            return []
        made = Transition.RESUME
        values = made.values(now_us=now, resumed=resumed_text(by, data, now))
        resumed = tx.jobs.apply_transition_to_many(made, job_ids, values)
        # A unique job whose key a twin took while it waited (its while set holds pending but
        # not running) was left out: it resumes without the key, as a failed attempt's retry
        # does (app/jobs/tx/attempts.py). A job no longer suspended changes nothing here.
        for job_id in sorted(set(job_ids) - {job.id for job in resumed}):
            keyless = tx.jobs.apply_transition(made, job_id, values | {"unique_while": None})
            if keyless is not None:
                resumed.append(keyless)
        tx.waits.resolve([job.id for job in resumed], by.value, now)
        tx.events[CLAIMABLE] += len(resumed)
        tx.after_transition(made, resumed, actor=actor, now_us=now)
        return resumed


def _ended(wait: StoredWait) -> WaitEnded:
    if wait.resolved_at is None:  # the job left its wait otherwise (a cancel)
        return WaitEnded("The wait has ended: the job is no longer suspended.", None, None)
    return WaitEnded(f"The wait has ended, by {wait.resolved_by}.",
                     to_rfc3339(wait.resolved_at), wait.resolved_by)
