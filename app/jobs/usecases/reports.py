"""A worker's reports on the job it holds: heartbeat (with its progress and checkpoint),
complete (one or several), fail; and the refusals of those it does not hold, each recorded as
a report_refused event. A report on a job whose cancel was requested ends it cancelled
(Transition.STOP), whatever it reports (docs/JOBS.md, Running jobs)."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from sqlalchemy.exc import SQLAlchemyError

from app.core.callers import Caller
from app.core.clock import MICROS, Clock, to_rfc3339
from app.core.errors import Conflict, NotFound, QueueError
from app.core.limits import RETRIES
from app.core.redaction import redact_error
from app.core.statuses import JobStatus
from app.jobs.domain.flow import NoRetryBudget, RetryPolicy
from app.jobs.domain.intake import sized_json
from app.jobs.domain.models import Job, JobControls
from app.jobs.domain.report_pace import (
    CHECKPOINT_SPACING_US,
    CheckpointTooSoon,
    HeartbeatTooSoon,
    next_heartbeat_at,
)
from app.jobs.domain.settings import QueueSettings
from app.jobs.domain.transitions import Transition, refusal
from app.jobs.sql.control_repository import progress_columns
from app.jobs.timeline.recorder import fingerprint_of
from app.jobs.tx.attempts import end_attempt
from app.jobs.tx.uow import JobsTx, JobsUnitOfWork
from app.jobs.usecases.bulk_complete import (
    bulk_positions,
    complete_alone,
    note_types_without_modes,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


class ReportRefused(Conflict):
    """A heartbeat, complete or fail refused with 409: the job exists, the caller does not
    hold it. Carries what its report_refused event says."""

    def __init__(self, detail: str, *, job_id: int, worker: str) -> None:
        super().__init__(detail)
        self.job_id = job_id
        self.worker = worker


@dataclass(frozen=True)
class Progress:
    """What a heartbeat reports besides being alive: its progress (done, total), its message
    (as sent) and its checkpoint (a JSON object), each None when not sent."""

    done_total: tuple[int, int] | None = None
    message: str | None = None
    checkpoint: dict[str, Any] | None = None


@dataclass(frozen=True)
class Beat:
    """A heartbeat's answer: the job, and its controls (its cancel requested? its progress)."""

    job: Job
    controls: JobControls


class WorkerReports:
    """`settings`: the lease a heartbeat extends by default, the largest result, the backoff
    of a failed attempt; `rng` draws the backoff's jitter."""

    def __init__(self, uow: JobsUnitOfWork, clock: Clock, settings: QueueSettings,
                 rng: random.Random, retry_policy: RetryPolicy | None = None) -> None:
        self.uow = uow
        self.clock = clock
        self.settings = settings
        self.rng = rng
        self.retry_policy = retry_policy or NoRetryBudget()

    def heartbeat(self, caller: Caller, job_id: int, *, lease_token: str | None,
                  lease_seconds: int | None, progress: Progress | None = None,
                  instance: str | None = None) -> Beat:
        """Extend the caller's live lease on the job (never past its attempt's deadline) and
        store what it reports of its progress; the answer says whether its cancel was
        requested. Progress is not an event: a heartbeat writes no history. One sent before
        the job takes the next (app/jobs/domain/report_pace.py) raises HeartbeatTooSoon or
        CheckpointTooSoon, having written nothing. `instance`: the label the worker sent,
        noted as its instance seen (never checked against the job's: the key and the lease
        token alone say who holds it)."""
        lease_us = (lease_seconds or self.settings.lease_seconds) * MICROS
        progress = progress or Progress()
        message = None if progress.message is None else redact_error(progress.message)
        checkpoint = self._stored_checkpoint(progress.checkpoint)

        def heartbeat_in(tx: JobsTx) -> Beat:
            repo = tx.jobs_confirming(caller)  # by the heartbeat's UPDATE
            now = self.clock.now_us()
            values = Transition.HEARTBEAT.values(now_us=now, lease_expires_at=now + lease_us)
            # Progress rides on the heartbeat's own UPDATE: no statement, no page more.
            values |= progress_columns(now, progress.done_total, message)
            beat = repo.extend_lease(job_id, values, worker=caller.name, now_us=now,
                                     lease_token=lease_token)
            if beat is None:
                held = repo.get_job(job_id)
                if held is not None and held.is_held_by(caller.name, now, lease_token):
                    # Held, so refused for its pace alone: a 429, and no report_refused
                    # event (that would be a write per refused heartbeat).
                    raise HeartbeatTooSoon(next_heartbeat_at(
                        held.updated_at, held.lease_expires_at or now) - now)
                self.refuse_report(held, caller, now, lease_token)
            job, controls = beat
            if checkpoint is not None and not tx.controls.save_checkpoint_if_due(
                    job_id, checkpoint, now, CHECKPOINT_SPACING_US):
                raise CheckpointTooSoon()  # the whole heartbeat is rolled back
            tx.after_transition(Transition.HEARTBEAT, [job], actor=caller.name, now_us=now)
            with tx.statement_of_its_own():  # a note of activity, lost at worst for a minute
                tx.timeline.seen(caller.name, now, claimed=False, instance=instance)
            return Beat(job, controls)

        # Without a checkpoint, the heartbeat is its UPDATE alone: one round trip.
        run = self.uow.run if checkpoint is not None else self.uow.run_statement
        return self.report("heartbeat", caller, job_id, heartbeat_in, run)

    def _stored_checkpoint(self, checkpoint: dict[str, Any] | None) -> str | None:
        if checkpoint is None:
            return None
        return sized_json(checkpoint, "checkpoint", self.settings.max_payload_bytes)

    def complete(self, caller: Caller, job_id: int, *, lease_token: str | None,
                 result: dict[str, Any] | None, delivered: int | None = None) -> Job:
        """running → completed, by the worker holding the job. A repeat of a complete that
        landed (same lease token, same result) answers the job as that one left it.
        `delivered`: the HTTP status of the push delivery this completes (the dispatcher),
        recorded as a delivered event in the same transaction.

        A batch of one (complete_many): its problem, if any, is raised. Without `delivered`,
        the complete of a job whose end touches no other row is its UPDATE alone: one round
        trip on PostgreSQL."""
        if delivered is None:
            return self.report("complete", caller, job_id, self._lone_complete(
                caller, job_id, lease_token, self._stored_result(result)),
                self.uow.run_statement)
        [(_job_id, answer)] = self.complete_many(caller, [{
            "id": job_id, "lease_token": lease_token, "result": result,
            "delivered": delivered}])
        if isinstance(answer, QueueError):
            raise answer
        return answer

    def complete_many(self, caller: Caller,
                      items: list[dict[str, Any]]) -> list[tuple[int, Job | QueueError]]:
        """Complete several held jobs in one transaction; each succeeds or fails on its own
        and is answered with the job or the problem a single complete would give. An item's
        `delivered` is as for complete. Every refusal is recorded (report_refused) in a
        transaction of its own once this one has committed.

        The items a lone complete would complete in its one statement are completed first,
        together in one statement (app/jobs/usecases/bulk_complete.py); the others one by
        one. A batch of such items alone is that statement: one round trip on PostgreSQL."""
        results = [self._stored_result(item.get("result")) for item in items]
        bulk = bulk_positions(items)

        def complete_each(tx: JobsTx) -> list[tuple[int, Job | QueueError]]:
            tx.jobs_confirming(caller)  # by the first complete's UPDATE
            answers: list[tuple[int, Job | QueueError] | None] = [None] * len(items)
            # The items are judged at one moment, and the jobs they complete recorded
            # together (one executemany per history table rather than two statements a job).
            now = self.clock.now_us()
            alone = complete_alone(tx, caller, items, results, bulk, now)
            for position, job in alone.items():
                answers[position] = (job.id, job)
            completed: list[Job] = []
            stopped: list[Job] = []
            # Taken in id order, as every transaction that locks several jobs takes them
            # (an enqueue locking the dependencies it names, say; the statement above, too):
            # none waits for another in a circle on PostgreSQL.
            for position in sorted((at for at in range(len(items)) if at not in alone),
                                   key=lambda at: items[at]["id"]):
                item, job_id = items[position], items[position]["id"]
                try:
                    answers[position] = (job_id, self._complete_in(
                        tx, caller, job_id, item.get("lease_token"), results[position],
                        item.get("delivered"), now=now, completed=completed, stopped=stopped))
                except (NotFound, Conflict) as problem:
                    answers[position] = (job_id, problem)
            note_types_without_modes(tx, list(alone.values()), completed + stopped)
            completed = sorted([*alone.values(), *completed], key=lambda job: job.id)
            tx.after_transition(Transition.COMPLETE, completed, actor=caller.name, now_us=now)
            for job in stopped:
                self._record_stop(tx, job, caller, now)
            return [answer for answer in answers if answer is not None]

        # Every item the one statement's: one statement, as a lone complete.
        run = self.uow.run_statement if len(bulk) == len(items) else self.uow.run
        answers = run(complete_each)
        refused = [answer for _, answer in answers if isinstance(answer, ReportRefused)]
        if refused:
            self._record_refusals("complete", refused)
        return answers

    def _stored_result(self, result: dict[str, Any] | None) -> str | None:
        if result is None:
            return None
        return sized_json(result, "result", self.settings.max_payload_bytes)

    def _lone_complete(self, caller: Caller, job_id: int, lease_token: str | None,
                       stored_result: str | None) -> Callable[[JobsTx], Job]:
        """The work of one complete (no delivery), for run_statement: as one statement, the
        UPDATE of a job whose end touches no other row; anything else (a refusal, a replay,
        a cancel requested, dependents or a key) in a transaction, as complete_many's."""

        def complete_in(tx: JobsTx) -> Job:
            tx.jobs_confirming(caller)  # by the complete's UPDATE
            now = self.clock.now_us()
            if tx.one_statement:
                made = Transition.COMPLETE
                job = tx.jobs.apply_transition(
                    made, job_id, made.values(now_us=now, result=stored_result),
                    worker=caller.name, now_us=now, lease_token=lease_token, alone=True)
                if job is not None:  # (if not, the work runs again in a transaction)
                    with tx.statement_of_its_own():  # a note of activity
                        tx.timeline.seen(caller.name, now, claimed=False)
                    # Its UPDATE found its key, if any, with nothing to settle.
                    tx.keys.seen_without_modes(job.type)
                    tx.after_transition(made, [job], actor=caller.name, now_us=now)
                    return job
            completed: list[Job] = []
            stopped: list[Job] = []
            job = self._complete_in(tx, caller, job_id, lease_token, stored_result, None,
                                    now=now, completed=completed, stopped=stopped)
            tx.after_transition(Transition.COMPLETE, completed, actor=caller.name, now_us=now)
            for ended in stopped:
                self._record_stop(tx, ended, caller, now)
            return job

        return complete_in

    def _complete_in(self, tx: JobsTx, caller: Caller, job_id: int,
                     lease_token: str | None, stored_result: str | None,
                     delivered: int | None, *, now: int, completed: list[Job],
                     stopped: list[Job]) -> Job:
        """Complete one job at `now`; the job completed is added to `completed`, for the
        caller to hand to `tx.after_transition` with the others, in the same transaction
        (or, its cancel requested, the job cancelled to `stopped`)."""
        repo = tx.jobs
        job = repo.apply_transition(
            Transition.COMPLETE, job_id,
            Transition.COMPLETE.values(now_us=now, result=stored_result),
            worker=caller.name, now_us=now, lease_token=lease_token)
        tx.timeline.seen(caller.name, now, claimed=False)
        if job is not None:
            if delivered is not None:
                tx.timeline.delivered(job, delivered, actor=caller.name, now_us=now)
            completed.append(job)
            return job
        # Refused the plain edge: its cancel was requested, or the caller does not hold it.
        if tx.controls.cancel_requested_by(job_id) is not None:
            made = Transition.STOP
            job = repo.apply_transition(made, job_id, made.values(now_us=now,
                                                                  result=stored_result),
                                        worker=caller.name, now_us=now, lease_token=lease_token)
            if job is not None:
                if delivered is not None:
                    tx.timeline.delivered(job, delivered, actor=caller.name, now_us=now)
                stopped.append(job)
                return job
        current = repo.get_job(job_id)
        if current is not None and lease_token is not None and (
                current.shows_complete(caller.name, lease_token, stored_result)
                or current.shows_stop(caller.name, lease_token, result=stored_result)):
            return current
        return self.refuse_report(current, caller, now, lease_token)

    @staticmethod
    def _record_stop(tx: JobsTx, job: Job, caller: Caller, now: int) -> None:
        """The job ended cancelled on its holder's report: the request is settled, and the
        event names who asked."""
        requested_by = tx.controls.cancel_requested_by(job.id)
        tx.controls.forget_cancel_requests([job.id])
        tx.after_transition(Transition.STOP, [job], actor=caller.name, now_us=now,
                details={job.id: {"cancel_requested_by": requested_by}})

    def fail(self, caller: Caller, job_id: int, *, lease_token: str | None, error: str,
             retry_in_seconds: int | None, delivered: int | None = None,
             checkpoint: dict[str, Any] | None = None) -> Job:
        """Record a failed attempt: pending again after a backoff, or failed when none are
        left (cancelled, when its cancel was requested). A repeat of a fail that landed (same
        lease token, error and retry_in_seconds) answers the job as that one left it.
        `delivered`: as for complete. `checkpoint`: saved for the next attempt."""
        # PostgreSQL text cannot hold NUL; an error message is diagnostics, so it is kept with
        # each NUL shown as U+FFFD rather than refused, on every engine alike.
        error = redact_error(error).replace("\x00", "\ufffd")
        retry_in_us = None if retry_in_seconds is None else retry_in_seconds * MICROS
        stored_checkpoint = self._stored_checkpoint(checkpoint)
        fingerprint_of(error)  # before any lock: the recorder, inside it, finds it remembered
        # The backoff's jitter, drawn once for whichever retry count the job has reached.
        draw = self.rng.random() if retry_in_us is None else 0.0
        backoff = self.settings.backoff

        def delay_after(retry_count: int) -> int:
            return retry_in_us if retry_in_us is not None else backoff.delay_at(retry_count,
                                                                                 draw)

        def fail_in(tx: JobsTx) -> Job:
            if tx.one_statement:
                if stored_checkpoint is None and delivered is None:
                    failed = self._lone_fail(tx, caller, job_id, lease_token, error,
                                             delay_after)
                    if failed is not None:  # (if not, it runs again in a transaction)
                        return failed
                tx.need_transaction()  # a checkpoint or a delivery: more than one write
            return self._fail_in(tx, caller, job_id, lease_token, error, retry_in_us,
                                 delay_after, delivered, stored_checkpoint)

        # A plain job's fail is one statement: one round trip on PostgreSQL.
        return self.report("fail", caller, job_id, fail_in, self.uow.run_statement)

    def _lone_fail(self, tx: JobsTx, caller: Caller, job_id: int, lease_token: str | None,
                   error: str, delay_after: Callable[[int], int]) -> Job | None:
        """The fail of a plain job (no dependents, no key, no unique key, its cancel not
        requested) as one statement, history and failure group with it
        (app/jobs/sql/fail_repository.py): the job as it left it; None when the work must run
        in a transaction."""
        tx.jobs_confirming(caller)  # by the fail's statement
        now = self.clock.now_us()
        failed = tx.fails.fail_alone(
            job_id, worker=caller.name, now_us=now, lease_token=lease_token,
            history=tx.timeline.fail_history(error),
            delays=[delay_after(count) for count in range(RETRIES.max)], actor=caller.name)
        if failed is None:
            return None
        with tx.statement_of_its_own():  # a note of activity
            tx.timeline.seen(caller.name, now, claimed=False)
        tx.after_transition(Transition.FAIL, [failed], actor=caller.name, now_us=now,
                whole_in_statement=True)
        return failed

    def _fail_in(self, tx: JobsTx, caller: Caller, job_id: int, lease_token: str | None,
                 error: str, retry_in_us: int | None, delay_after: Callable[[int], int],
                 delivered: int | None, stored_checkpoint: str | None) -> Job:
        """A fail in a transaction: any job, and every refusal, replay or cancel."""
        repo = tx.jobs_confirming(caller)  # by the read that locks the job
        now = self.clock.now_us()
        held = tx.fails.job_to_end(job_id)
        if held is None or not held.job.is_held_by(caller.name, now, lease_token):
            current = None if held is None else held.job
            if current is not None and lease_token is not None and (
                    current.shows_fail(caller.name, lease_token, error, retry_in_us)
                    or current.shows_stop(caller.name, lease_token, error=error)):
                return current
            return self.refuse_report(current, caller, now, lease_token)
        job = held.job
        if stored_checkpoint is not None:
            tx.controls.save_checkpoint(job_id, stored_checkpoint, now)
        if held.cancel_requested_by is not None:
            # Its row is held: a cancel requested by now is seen, one requested later
            # finds the job no longer running.
            made = Transition.STOP
            stopped = repo.apply_transition(made, job_id, made.values(now_us=now, error=error),
                                            worker=caller.name, now_us=now,
                                            lease_token=lease_token)
            if stopped is None:
                raise ReportRefused("The job changed while this request ran; its lease "
                                    "is gone.", job_id=job_id, worker=caller.name)
            if delivered is not None:
                tx.timeline.delivered(stopped, delivered, actor=caller.name, now_us=now)
            self._record_stop(tx, stopped, caller, now)
            tx.timeline.seen(caller.name, now, claimed=False)
            return stopped
        values = Transition.FAIL.values(job, now, error, delay_after(job.retry_count))
        budget = self._retry_budget(tx, job, values, now)
        failed = end_attempt(repo, Transition.FAIL, job, values, worker=caller.name, now_us=now)
        if failed is None:  # another transaction changed it first (PostgreSQL only)
            raise ReportRefused("The job changed while this request ran; its lease is "
                                "gone.", job_id=job_id, worker=caller.name)
        if delivered is not None:
            tx.timeline.delivered(job, delivered, actor=caller.name, now_us=now)
        # Its stored attempt as read with its row, unless the delivery just stored it.
        stored = None if delivered is not None else {job.id: held.stored_attempt}
        tx.after_transition(Transition.FAIL, [failed], actor=caller.name, now_us=now,
                before={job.id: job}, current_attempts=stored, details=budget)
        tx.timeline.seen(caller.name, now, claimed=False)
        return failed

    def _retry_budget(self, tx: JobsTx, job: Job, values: dict[str, Any],
                      now: int) -> dict[int, dict[str, Any]] | None:
        """Move a retry's run_at (`values`) to where its type's retry budget puts it; the
        retry_scheduled event's detail when the budget held it back past its backoff."""
        if (values.get("status") != JobStatus.PENDING.value
                or not self.retry_policy.may_hold_back(job.type)):
            return None
        backoff_at = values["run_at"]
        values["run_at"] = self.retry_policy.retry_at(tx.conn, job.type, backoff_at, now)
        if values["run_at"] <= backoff_at:
            return None
        return {job.id: {"retry_budget": {"backoff_until": to_rfc3339(backoff_at)}}}

    @staticmethod
    def refuse_report(job: Job | None, caller: Caller, now: int,
                       lease_token: str | None) -> NoReturn:
        """Raise the problem that says why the caller does not hold the job."""
        if job is None:
            raise NotFound("No such job.")
        raise ReportRefused(refusal(job, caller.name, now, lease_token), job_id=job.id,
                            worker=caller.name)

    def report(self, report: str, caller: Caller, job_id: int,
                work: Callable[[JobsTx], T],
                run: Callable[[Callable[[JobsTx], T]], T] | None = None) -> T:
        """Run a worker's report (heartbeat, complete, fail) by `run` (the unit of work's run
        unless told); a refusal is recorded as a report_refused event in a transaction of its
        own, the report's being rolled back."""
        try:
            return (run or self.uow.run)(work)
        except ReportRefused as refused:
            self._record_refusals(report, [refused])
            raise

    def _record_refusals(self, report: str, refusals: list[ReportRefused]) -> None:
        now = self.clock.now_us()

        def record_in(tx: JobsTx) -> None:
            # A refused report is still a sign of life.
            tx.timeline.seen(refusals[0].worker, now, claimed=False)
            for refused in sorted(refusals, key=lambda refused: refused.job_id):
                # Held while its story is written before the refusal: no report of its holder
                # writes that story at the same time.
                job = tx.jobs.get_job(refused.job_id, for_update=True)
                if job is not None:  # not purged meanwhile
                    tx.timeline.report_refused(job, worker=refused.worker, report=report,
                                               reason=refused.detail, now_us=now)

        try:
            self.uow.run(record_in)
        except SQLAlchemyError:
            # The worker is owed its 409 all the same: a report refused is never turned into
            # a 503 (which it would retry) for want of its record.
            log.warning("queuelog: could not record %d refused report(s)", len(refusals),
                        exc_info=True)
        self.uow.on_event("report_refused", len(refusals))
