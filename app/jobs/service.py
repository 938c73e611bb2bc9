"""The use cases of the queue. Each opens its transaction, applies the rules, and returns records.

Nothing here sees the HTTP request: handlers pass plain values and the authenticated caller.
"""

from __future__ import annotations

import functools
import logging
import random
import secrets
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from app.core.callers import Caller, Role
from app.core.clock import MICROS, Clock
from app.core.redaction import redact_error
from app.core.statuses import TERMINAL_STATUSES, JobStatus
from app.history.models import SERVICE_ACTOR
from app.jobs.cursor import decode_cursor, encode_cursor
from app.jobs.intake import (
    IntakeRules,
    NewJob,
    meet_stored_twin,
    new_job,
    plan_batch,
    replayed,
    require_configured_types,
    sized_json,
)
from app.jobs.models import Job, Transition
from app.jobs.repository import JobRepository, WriteConflict
from app.jobs.settings import QueueSettings
from app.jobs.uniqueness import Deduplicated, holds_key_in
from app.jobs.uow import JobsTx, JobsUnitOfWork
from app.jobs.waiting import POLL_SECONDS, JobSignal, WaitAnswer, WaitingBudget
from app.types.service import FlowControl, LimitReached
from app.web.problems import (
    Conflict,
    Forbidden,
    NotFound,
    Problem,
    UniqueConflict,
    ValidationFailed,
)

log = logging.getLogger(__name__)

# Expired leases rescued by one claim at most, so one claim's transaction stays short.
RESCUE_BATCH = 100
# A batch whose keys race a concurrent request on PostgreSQL is run again this many times.
_BATCH_ATTEMPTS = 3
# An enqueue whose twin changes between the insert and its look-up (PostgreSQL: the twin was
# claimed, finished or purged in between) tries again this many times.
_TWIN_ATTEMPTS = 3


@dataclass(frozen=True)
class Enqueued:
    """What an enqueue made: a new job, a replay (idempotency), or a twin met (unique)."""

    job: Job
    replayed: bool = False
    deduplicated: Deduplicated = Deduplicated.NO

    @property
    def created(self) -> bool:
        return not self.replayed and self.deduplicated is Deduplicated.NO


class _TwinMoved(Exception):
    """A batch's stored twin stopped being pending before its replacement (PostgreSQL)."""


def _is_unique_scope_violation(error: IntegrityError) -> bool:
    # Told apart by the index's name (PostgreSQL) or its column (SQLite's message).
    return "unique_scope" in str(error.orig)


@dataclass(frozen=True)
class Claimed:
    job: Job
    lease_token: str


T = TypeVar("T")


class ReportRefused(Conflict):
    """A heartbeat, complete or fail refused with 409: the job exists, the caller does not
    hold it. Carries what its report_refused event says."""

    def __init__(self, detail: str, *, job_id: int, worker: str) -> None:
        super().__init__(detail)
        self.job_id = job_id
        self.worker = worker


class JobService:
    def __init__(self, uow: JobsUnitOfWork, clock: Clock, settings: QueueSettings,
                 rng: random.Random | None = None, flow: FlowControl | None = None,
                 finished: JobSignal | None = None) -> None:
        self.uow = uow
        # None: no flow control at all (services built without the type settings).
        self.flow = flow
        self.clock = clock
        self.settings = settings
        self.rng = rng or random.SystemRandom()
        self.intake = IntakeRules(settings.job_types, settings.max_payload_bytes)
        self.signal = JobSignal()
        # Told when a job of this process may have finished (completed, failed, cancelled):
        # the unit of work's FINISHED signal.
        self.finished = finished or JobSignal()
        # Claims waiting for work, and reads waiting for a job to finish, each have a budget.
        self._claim_waits = WaitingBudget(settings.max_waiting_claims)
        self._result_waits = WaitingBudget(settings.max_waiting_requests)

    @property
    def max_payload_bytes(self) -> int:
        """The largest payload, or result, a job may carry (QUEUELOG_MAX_PAYLOAD_BYTES)."""
        return self.settings.max_payload_bytes

    # -- producers ------------------------------------------------------------------------

    def enqueue(self, caller: Caller, request: dict[str, Any],
                header_idempotency_key: str | None = None) -> Enqueued:
        """Store a new job, replay the one this idempotency key made before, or meet the twin
        holding this request's unique key (return it, reject, or replace it).

        Raises ValidationFailed, Forbidden, Conflict or UniqueConflict.
        """
        now = self.clock.now_us()
        new = new_job(self.intake, caller, request, header_idempotency_key, now)
        outcome = self.uow.run(lambda tx: self._insert_or_meet(self._confirmed(tx, caller), new))
        if outcome.created or outcome.deduplicated is Deduplicated.REPLACED:
            self.signal.notify()  # a replacement may have moved its run_at closer
        return outcome

    def enqueue_many(self, caller: Caller, requests: list[dict[str, Any]]) -> list[Enqueued]:
        """Store several jobs in one transaction, all or nothing; what each item made, in order.

        Every item is checked before anything is written; field errors are keyed by position
        (`jobs.3.type`). Idempotency keys and unique keys work per item, and an item meets an
        earlier item of the batch as it would a stored job.
        """
        now = self.clock.now_us()
        items, errors = [], {}
        for position, request in enumerate(requests):
            try:
                items.append(new_job(self.intake, caller, request, None, now))
            except ValidationFailed as exc:
                errors.update({f"jobs.{position}.{field}": messages
                               for field, messages in (exc.errors or {}).items()})
            except Forbidden as exc:
                raise Forbidden(f"jobs.{position}: {exc.detail}") from None
        if errors:
            raise ValidationFailed("Some jobs did not validate; nothing was stored.",
                                   errors=errors)
        for attempt in range(_BATCH_ATTEMPTS):
            try:
                results = self.uow.run(
                    lambda tx: self._insert_or_meet_many(self._confirmed(tx, caller), items))
                break
            except (IntegrityError, WriteConflict, _TwinMoved):
                # A concurrent request stored one of these keys between our look-up and
                # insert, deadlocked with this one, or moved a twin we meant to replace
                # (PostgreSQL only; SQLite's BEGIN IMMEDIATE serialises writers). Run again:
                # it is now a replay or a twin.
                if attempt == _BATCH_ATTEMPTS - 1:
                    raise Conflict("Requests with these idempotency or unique keys are in "
                                   "flight; retry.") from None
        if any(not outcome.replayed and outcome.deduplicated is not Deduplicated.RETURNED
               for outcome in results):
            self.signal.notify()
        return results

    @staticmethod
    def _insert_or_meet_many(tx: JobsTx, items: list[NewJob]) -> list[Enqueued]:
        repo = tx.jobs
        producer = items[0].values["producer"]
        keys = {item.values["idempotency_key"] for item in items
                if item.values["idempotency_key"] is not None}
        repo.lock_idempotency_keys(producer, keys)
        scopes = {item.unique.scope for item in items if item.unique is not None}
        plan = plan_batch(items, repo.find_by_idempotency_keys(producer, keys),
                          repo.find_unique_holders(producer, scopes))
        replaced = {}
        # In id order: concurrent batches replacing the same twins lock them in one order
        # and so cannot deadlock each other on PostgreSQL.
        for job_id, values in sorted(plan.replacements.items()):
            job = repo.apply_transition(Transition.REPLACE, job_id, values)
            if job is None:
                raise _TwinMoved()
            replaced[job_id] = job
        inserted = repo.insert_jobs(plan.new_rows)
        tx.timeline.enqueued(inserted)
        outcomes = [Enqueued(job, replayed=was_replayed, deduplicated=how)
                    for job, was_replayed, how in plan.results(inserted, replaced)]
        now = items[0].values["created_at"]
        # In request order: each item that met a twin is told on the twin's timeline.
        for outcome in outcomes:
            if outcome.replayed:
                continue
            if outcome.deduplicated is Deduplicated.RETURNED:
                tx.timeline.deduplicated([outcome.job], actor=producer, now_us=now)
            elif outcome.deduplicated is Deduplicated.REPLACED:
                tx.timeline.transition(Transition.REPLACE, [outcome.job], actor=producer,
                                       now_us=now)
        tx.events["enqueued"] += sum(1 for outcome in outcomes if outcome.created)
        return outcomes

    def enqueue_in(self, tx: JobsTx, new: NewJob, *, actor: str) -> Enqueued | None:
        """Store `new` (built by intake's new_job) inside the caller's write transaction (see
        `write`), recording `actor` on its timeline; None when the job's schedule slot has its
        job already (the unique index said so). A unique twin is met as on POST /jobs."""
        try:
            return self._insert_or_meet(tx, new, actor=actor)
        except UniqueConflict:
            raise  # the template's unique twin refused the job: the caller says so
        except Conflict:
            # Nothing stood in the way but the (schedule, scheduled_for) index: the slot's job
            # exists, enqueued by another process or host.
            return None

    def enqueue_slots_in(self, tx: JobsTx, items: Sequence[tuple[NewJob, str]]
                         ) -> list[Enqueued | UniqueConflict | None]:
        """Store schedule slots' jobs (each built by new_job, with its actor) inside the
        caller's write transaction, set-wise: the jobs without a unique or idempotency key in
        one INSERT and one history INSERT. Per item, in order: what it made; None when its
        slot has its job already; the UniqueConflict its unique twin answered (reject).

        Should a slot's job exist after all (a process firing otherwise than by locking the
        schedule rows, say during an upgrade), the one INSERT is undone and every item goes
        through enqueue_in, where the unique index answers for each."""
        results: list[Enqueued | UniqueConflict | None] = [None] * len(items)
        plain = [position for position, (new, _actor) in enumerate(items)
                 if new.unique is None and new.values["idempotency_key"] is None]
        chosen = set(plain)
        one_by_one = [position for position in range(len(items)) if position not in chosen]
        if plain:
            try:
                with tx.conn.begin_nested():
                    inserted = tx.jobs.insert_jobs([items[position][0].values
                                                 for position in plain])
            except IntegrityError:
                one_by_one = list(range(len(items)))
            else:
                tx.timeline.enqueued(inserted, actors=[items[position][1] for position in plain])
                tx.events["enqueued"] += len(inserted)
                for position, job in zip(plain, inserted, strict=True):
                    results[position] = Enqueued(job)
        for position in one_by_one:
            new, actor = items[position]
            try:
                results[position] = self.enqueue_in(tx, new, actor=actor)
            except UniqueConflict as refused:
                results[position] = refused
        return results

    def write(self, work: Callable[[JobsTx], T]) -> T:
        """Run `work` in a job transaction (app/storage/uow.py, whose rule it keeps); for
        other services whose writes create jobs (schedules). Claims waiting in this process
        are woken when it has enqueued."""
        result = self.uow.run(work)
        self.signal.notify()
        return result

    @staticmethod
    def _confirmed(tx: JobsTx, caller: Caller) -> JobsTx:
        tx.confirm(caller)
        return tx

    def _insert_or_meet(self, tx: JobsTx, new: NewJob, actor: str | None = None) -> Enqueued:
        values = new.values
        actor = actor or values["producer"]
        repo = tx.jobs
        for _attempt in range(_TWIN_ATTEMPTS):
            job = repo.insert_job(values)
            if job is not None:
                tx.timeline.enqueued([job], actor=actor)
                tx.events["enqueued"] += 1
                return Enqueued(job)
            # Refused by a unique index. The idempotency key is asked first: a replay is never
            # a duplicate.
            if values["idempotency_key"] is not None:
                twin = repo.find_by_idempotency_key(values["producer"], values["idempotency_key"])
                if twin is not None:
                    return Enqueued(replayed(twin, values), replayed=True)
            if new.unique is not None:
                holder = repo.find_unique_holder(values["producer"], new.unique.scope)
                if holder is not None:
                    replacement = meet_stored_twin(holder, new)
                    now = values["created_at"]
                    if replacement is None:
                        tx.timeline.deduplicated([holder], actor=actor, now_us=now)
                        return Enqueued(holder, deduplicated=Deduplicated.RETURNED)
                    replaced = repo.apply_transition(Transition.REPLACE, holder.id,
                                                     replacement)
                    if replaced is not None:
                        tx.timeline.transition(Transition.REPLACE, [replaced], actor=actor,
                                               now_us=now)
                        return Enqueued(replaced, deduplicated=Deduplicated.REPLACED)
            # The job that stood in the way moved on between the insert and the look-up.
        raise Conflict("A request with this idempotency or unique key is in flight; retry.")

    # -- reading --------------------------------------------------------------------------

    def get_job(self, caller: Caller, job_id: int) -> Job:
        """The job, if the caller may see it; NotFound otherwise (the two look alike)."""
        return self._read_visible(caller, job_id)

    def await_job(self, caller: Caller, job_id: int, wait_seconds: float) -> WaitAnswer[Job]:
        """The job as get_job reads it, once it is finished or `wait_seconds` have passed.

        An unfinished job is read again as soon as this process finishes a job, and every
        POLL_SECONDS for the other processes and hosts, until it is completed, failed or
        cancelled or the time is up; then it is answered as it is. Past the process's budget
        of waiting requests it is answered at once, marked `not_waited`.
        """
        seen = self.finished.generation
        job = self._read_visible(caller, job_id)
        if job.status in TERMINAL_STATUSES or wait_seconds <= 0:
            return WaitAnswer(job)
        with self._result_waits.slot() as granted:
            deadline = time.monotonic() + wait_seconds
            while (granted and job.status not in TERMINAL_STATUSES
                   and (remaining := deadline - time.monotonic()) > 0):
                self.finished.wait(seen, timeout=min(POLL_SECONDS, remaining))
                seen = self.finished.generation
                job = self._read_visible(caller, job_id)
        return WaitAnswer(job, not_waited=not granted)

    def _read_visible(self, caller: Caller, job_id: int) -> Job:
        job = self.uow.read(lambda tx: self._confirmed(tx, caller).jobs.get_job(job_id))
        if job is None or not self._visible_to(caller, job):
            raise NotFound("No such job.")
        return job

    def running_by_worker(self) -> dict[str, int]:
        """How many jobs each worker holds now, by the worker's name."""
        return self.uow.read(lambda tx: tx.jobs.count_running_by_worker())

    def list_jobs(self, caller: Caller, *, status: str | None, job_type: str | None,
                  limit: int, cursor: str | None, producer: str | None = None,
                  newest_first: bool = False, backward: bool = False,
                  scheduled: bool = False) -> tuple[list[Job], str | None]:
        """A page of the jobs the caller may see, by id, and the cursor of the next page.
        `producer` narrows an admin's listing to one producer's jobs (a producer sees only
        its own whatever it asks). `newest_first` lists by id downwards; `backward` gives the
        page before `cursor` (in the listing's order) and the cursor of the one before that;
        `scheduled` keeps the pending jobs whose run_at is still ahead."""
        after_id = decode_cursor(cursor) if cursor is not None else 0
        # A page backwards is read forwards in the other order, then turned round.
        descending = newest_first != backward
        page = self.uow.read(lambda tx: self._confirmed(tx, caller).jobs.list_jobs(
                after_id=after_id,
                limit=limit + 1,
                producer=caller.name if caller.role is Role.PRODUCER else producer,
                worker=caller.name if caller.role is Role.WORKER else None,
                status=JobStatus.PENDING.value if scheduled else status,
                job_type=job_type,
                run_after=self.clock.now_us() if scheduled else None,
                descending=descending,
            ))
        more = len(page) > limit
        page = page[:limit]
        following = encode_cursor(page[-1].id) if more else None
        if backward:
            page.reverse()
        return page, following

    @staticmethod
    def _visible_to(caller: Caller, job: Job) -> bool:
        if caller.role is Role.ADMIN:
            return True
        if caller.role is Role.PRODUCER:
            return job.producer == caller.name
        return job.worker_id == caller.name

    # -- workers --------------------------------------------------------------------------

    def claim(self, caller: Caller, *, types: Iterable[str] | None = None,
              lease_seconds: int | None = None, limit: int = 1,
              push: bool = False) -> list[Claimed]:
        """Claim up to `limit` jobs for the caller, most urgent first; [] when none is due.
        A worker's claim takes pulled types alone; the dispatcher's (`push`) push types
        alone (ClaimGate decides), under the same flow control.

        Expired leases are rescued in the same transaction first, so a job whose worker died
        is claimable again by this very claim.
        """
        return self.await_claim(caller, types=types, lease_seconds=lease_seconds,
                                limit=limit, push=push).value

    def await_claim(self, caller: Caller, *, types: Iterable[str] | None = None,
                    lease_seconds: int | None = None, limit: int = 1,
                    wait_seconds: float = 0, push: bool = False) -> WaitAnswer[list[Claimed]]:
        """As claim, waiting up to `wait_seconds` for a job when none is due now (no
        connection is held while waiting). Past the process's budget of waiting claims it
        answers at once, marked `not_waited`."""
        if types is not None:
            # Checked before anything else: a misspelt type would otherwise find nothing
            # forever, and a waiting claim only ever probes configured types.
            types = list(types)
            require_configured_types(self.settings.job_types, types, "types")
        wanted = self._claimable_types(caller, types)
        if wanted is not None and not wanted:
            # Nothing this key may ever take here: waiting would not change that.
            return WaitAnswer([])
        seen = self.signal.generation
        claimed = self._claim_now(caller, wanted, lease_seconds, limit, push)
        if claimed or wait_seconds <= 0:
            return WaitAnswer(claimed)
        with self._claim_waits.slot() as granted:
            deadline = time.monotonic() + wait_seconds
            while (granted and not claimed
                   and self._wait_for_work(wanted, seen, deadline, push)):
                seen = self.signal.generation
                claimed = self._claim_now(caller, wanted, lease_seconds, limit, push)
        return WaitAnswer(claimed, not_waited=not granted)

    def _claim_now(self, caller: Caller, wanted: frozenset[str] | None,
                   lease_seconds: int | None, limit: int, push: bool) -> list[Claimed]:
        lease_us = (lease_seconds or self.settings.lease_seconds) * MICROS
        nonce = secrets.token_hex(16)
        # Each attempt is a moment of its own: a key revoked since the request began (while
        # this claim waited for work, say) must take nothing, so every attempt's transaction
        # confirms the key again rather than trusting an earlier check.
        caller.live_checked = False

        flow = self.flow
        skips: list[tuple[str, str]] = []

        def claim_in(tx: JobsTx, *, optimistic: bool) -> list[Job]:
            repo, conn = self._confirmed(tx, caller).jobs, tx.conn
            now = self.clock.now_us()
            self._rescue_expired_leases(tx, now)
            # None: no limit concerns this claim, which then runs as without flow control.
            gate = None if flow is None else flow.gate(conn, wanted, now,
                                                         lock=not optimistic, push=push)
            if not optimistic:
                # The gate took its types' rows, waiting for them if another claim held them
                # (PostgreSQL): the claim holds what it needs from now.
                now = self.clock.now_us()
            types, claim_gate = wanted, None
            # Told once the claim committed; an attempt rolled back tells nothing.
            skips[:] = [] if flow is None or gate is None else flow.skips(conn, gate, now)
            if flow is not None and gate is not None and gate.restricts(limit):
                types, claim_gate = flow.allowed_types(gate, wanted), gate
            elif push and gate is None:
                return []  # no flow control to tell push types apart: never guess
            jobs = repo.claim_next_jobs(
                now_us=now, worker=caller.name, lease_expires_at=now + lease_us,
                nonce=nonce, limit=limit, types=types, gate=claim_gate,
            )
            if (flow is not None and gate is not None
                    and flow.settle(conn, gate, jobs, now, check=optimistic)):
                # Checked under its types' rows, which it may have waited for: its jobs are
                # claimed, and leased, from the moment it holds them.
                held_at = self.clock.now_us()
                if held_at != now:
                    now = held_at
                    jobs = repo.restamp_claimed(jobs, now_us=now,
                                                lease_expires_at=now + lease_us)
            # Recorded once the stamps are final, so the timeline reads as they do.
            tx.made(Transition.CLAIM, jobs, actor=caller.name, now_us=now)
            tx.timeline.seen(caller.name, now, claimed=True)
            return jobs

        # First on a gate read without locks, checked under them just before the commit
        # (PostgreSQL; see FlowControl.settle); when a limit was reached meanwhile, again
        # on a gate read under the locks, which cannot miss.
        try:
            jobs = self.uow.run(lambda tx: claim_in(tx, optimistic=True))
        except LimitReached:
            jobs = self.uow.run(lambda tx: claim_in(tx, optimistic=False))
        if flow is not None:
            flow.report_skips(skips)
        if jobs and flow is not None:
            flow.note_claimed(jobs)
        return [Claimed(job, job.lease_token or "") for job in jobs]

    def _wait_for_work(self, wanted: frozenset[str] | None, seen_generation: int,
                       deadline: float, push: bool = False) -> bool:
        """Sleep until a job may be claimable (True) or the deadline passes (False)."""
        while (remaining := deadline - time.monotonic()) > 0:
            if self.signal.wait(seen_generation, timeout=min(POLL_SECONDS, remaining)):
                return True
            if self.uow.read(lambda tx: self._may_claim_now(tx, wanted, push)):
                return True
        return False

    def _may_claim_now(self, tx: JobsTx, wanted: frozenset[str] | None,
                       push: bool = False) -> bool:
        """The waiting claim's peek: is there work this claim could take now, flow control
        included (a paused or full type's backlog must not wake it again and again)?"""
        now = self.clock.now_us()
        gate = None if self.flow is None else self.flow.gate(tx.conn, wanted, now, push=push)
        types = wanted
        if gate is not None and self.flow is not None:
            types = self.flow.allowed_types(gate, wanted)
        return tx.jobs.has_claimable_work(now, types, gate)

    @staticmethod
    def _claimable_types(caller: Caller, requested: Iterable[str] | None) -> frozenset[str] | None:
        """The types a claim may take: requested ∩ the key's; None means any type."""
        requested_set = None if requested is None else frozenset(requested)
        if requested_set is None:
            return caller.allowed_types
        if caller.allowed_types is None:
            return requested_set
        return requested_set & caller.allowed_types

    def _rescue_expired_leases(self, tx: JobsTx, now: int) -> None:
        # A lease that ran out is a failed attempt whose worker is presumed dead.
        for job in tx.jobs.find_expired_leases(now, RESCUE_BATCH):
            rescued = self._end_attempt(tx.jobs, Transition.RESCUE, job,
                                        Transition.RESCUE.values(job, now))
            if rescued is not None:
                tx.made(Transition.RESCUE, [rescued], actor=SERVICE_ACTOR, now_us=now,
                        held_by=job.worker_id)

    def heartbeat(self, caller: Caller, job_id: int, *, lease_token: str | None,
                  lease_seconds: int | None) -> Job:
        """Extend the caller's live lease on the job."""
        lease_us = (lease_seconds or self.settings.lease_seconds) * MICROS

        def heartbeat_in(tx: JobsTx) -> Job:
            repo = self._confirmed(tx, caller).jobs
            now = self.clock.now_us()
            values = Transition.HEARTBEAT.values(now_us=now, lease_expires_at=now + lease_us)
            job = repo.apply_transition(Transition.HEARTBEAT, job_id, values,
                                        worker=caller.name, now_us=now,
                                        lease_token=lease_token)
            if job is None:
                self._refuse_report(repo.get_job(job_id), caller, now, lease_token)
            tx.made(Transition.HEARTBEAT, [job], actor=caller.name, now_us=now)
            tx.timeline.seen(caller.name, now, claimed=False)
            return job

        return self._report("heartbeat", caller, job_id, heartbeat_in)

    def complete(self, caller: Caller, job_id: int, *, lease_token: str | None,
                 result: dict[str, Any] | None, delivered: int | None = None) -> Job:
        """running → completed, by the worker holding the job. A repeat of a complete that
        landed (same lease token, same result) answers the job as that one left it.
        `delivered`: the HTTP status of the push delivery this completes (the dispatcher),
        recorded as a delivered event in the same transaction."""
        stored_result = self._stored_result(result)
        return self._report("complete", caller, job_id, lambda tx: self._complete_in(
            self._confirmed(tx, caller), caller, job_id, lease_token, stored_result,
            delivered))

    def complete_many(self, caller: Caller,
                      items: list[dict[str, Any]]) -> list[tuple[int, Job | Problem]]:
        """Complete several held jobs in one transaction; each succeeds or fails on its own
        and is answered with the job or the problem a single complete would give."""
        results = [self._stored_result(item.get("result")) for item in items]

        def complete_each(tx: JobsTx) -> list[tuple[int, Job | Problem]]:
            self._confirmed(tx, caller)
            answers: list[tuple[int, Job | Problem]] = []
            # The items are judged at one moment, and the jobs they complete recorded
            # together (one executemany per history table rather than two statements a job).
            now = self.clock.now_us()
            completed: list[Job] = []
            for item, stored_result in zip(items, results, strict=True):
                job_id = item["id"]
                try:
                    answers.append((job_id, self._complete_in(
                        tx, caller, job_id, item.get("lease_token"), stored_result,
                        now=now, completed=completed)))
                except (NotFound, Conflict) as problem:
                    answers.append((job_id, problem))
            tx.made(Transition.COMPLETE, completed, actor=caller.name, now_us=now)
            return answers

        answers = self.uow.run(complete_each)
        refused = [answer for _, answer in answers if isinstance(answer, ReportRefused)]
        if refused:
            self._record_refusals("complete", refused)
        return answers

    def _stored_result(self, result: dict[str, Any] | None) -> str | None:
        if result is None:
            return None
        return sized_json(result, "result", self.settings.max_payload_bytes)

    def _complete_in(self, tx: JobsTx, caller: Caller, job_id: int,
                     lease_token: str | None, stored_result: str | None,
                     delivered: int | None = None, *, now: int | None = None,
                     completed: list[Job] | None = None) -> Job:
        """Complete one job at `now` (else the clock's). With `completed` given, the job
        completed is added to it for the caller to hand to `_made` with the others, in the
        same transaction, instead of here."""
        if now is None:
            now = self.clock.now_us()
        repo = tx.jobs
        job = repo.apply_transition(
            Transition.COMPLETE, job_id,
            Transition.COMPLETE.values(now_us=now, result=stored_result),
            worker=caller.name, now_us=now, lease_token=lease_token)
        tx.timeline.seen(caller.name, now, claimed=False)
        if job is not None:
            if delivered is not None:
                tx.timeline.delivered(job, delivered, actor=caller.name, now_us=now)
            if completed is None:
                tx.made(Transition.COMPLETE, [job], actor=caller.name, now_us=now)
            else:
                completed.append(job)
            return job
        current = repo.get_job(job_id)
        if (current is not None and lease_token is not None
                and current.shows_complete(caller.name, lease_token, stored_result)):
            return current
        return self._refuse_report(current, caller, now, lease_token)

    def fail(self, caller: Caller, job_id: int, *, lease_token: str | None, error: str,
             retry_in_seconds: int | None, delivered: int | None = None) -> Job:
        """Record a failed attempt: pending again after a backoff, or failed when none are
        left. A repeat of a fail that landed (same lease token, error and retry_in_seconds)
        answers the job as that one left it. `delivered`: as for complete."""
        # PostgreSQL text cannot hold NUL; an error message is diagnostics, so it is kept with
        # each NUL shown as U+FFFD rather than refused, on every engine alike.
        error = redact_error(error).replace("\x00", "\ufffd")
        retry_in_us = None if retry_in_seconds is None else retry_in_seconds * MICROS

        def fail_in(tx: JobsTx) -> Job:
            repo = self._confirmed(tx, caller).jobs
            now = self.clock.now_us()
            job = repo.get_job(job_id, for_update=True)
            if job is None or not job.is_held_by(caller.name, now, lease_token):
                if (job is not None and lease_token is not None
                        and job.shows_fail(caller.name, lease_token, error, retry_in_us)):
                    return job
                return self._refuse_report(job, caller, now, lease_token)
            if retry_in_us is None:
                delay = self.settings.backoff.delay_us(job.retry_count, self.rng)
            else:
                delay = retry_in_us
            failed = self._end_attempt(repo, Transition.FAIL, job,
                                       Transition.FAIL.values(job, now, error, delay),
                                       worker=caller.name, now_us=now)
            if failed is None:  # another transaction changed it first (PostgreSQL only)
                raise ReportRefused("The job changed while this request ran; its lease is "
                                    "gone.", job_id=job_id, worker=caller.name)
            if delivered is not None:
                tx.timeline.delivered(failed, delivered, actor=caller.name, now_us=now)
            tx.made(Transition.FAIL, [failed], actor=caller.name, now_us=now)
            tx.timeline.seen(caller.name, now, claimed=False)
            return failed

        return self._report("fail", caller, job_id, fail_in)

    @staticmethod
    def _end_attempt(repo: JobRepository, transition: Transition, job: Job,
                     values: dict[str, Any], *, worker: str | None = None,
                     now_us: int | None = None) -> Job | None:
        """Apply a failed attempt's `values` (FAIL or RESCUE) to the running `job` (None if it
        changed).

        Under a while set without running, a job sent back to pending enters its while set
        again; when a twin enqueued meanwhile holds the key, this job lets go of it rather
        than have the worker's report refused: the twin stands for the work, and this job
        still runs its retry.
        """
        def move(changes: dict[str, Any]) -> Job | None:
            return repo.apply_transition(transition, job.id, changes,
                                         lease_token=job.lease_token, worker=worker,
                                         now_us=now_us)

        if not (holds_key_in(job.unique_while, values["status"])
                and not holds_key_in(job.unique_while, job.status)):
            return move(values)
        try:
            with repo.conn.begin_nested():
                return move(values)
        except IntegrityError as exc:
            if not _is_unique_scope_violation(exc):
                raise
        return move(values | {"unique_while": None})

    @staticmethod
    def _refuse_report(job: Job | None, caller: Caller, now: int,
                       lease_token: str | None) -> NoReturn:
        """Raise the problem that says why the caller does not hold the job."""
        if job is None:
            raise NotFound("No such job.")
        if job.status != JobStatus.RUNNING:
            reason = f"The job is {job.status}, not running."
        elif job.worker_id != caller.name:
            reason = "The job is held by another worker."
        elif job.lease_expires_at is None or job.lease_expires_at <= now:
            reason = "The lease on this job has expired."
        elif lease_token is not None and lease_token != job.lease_token:
            reason = "The lease token names an earlier attempt."
        else:
            reason = "The job changed while this request ran."
        raise ReportRefused(reason, job_id=job.id, worker=caller.name)

    def _report(self, report: str, caller: Caller, job_id: int,
                work: Callable[[JobsTx], T]) -> T:
        """Run a worker's report (heartbeat, complete, fail); a refusal is recorded as a
        report_refused event in a transaction of its own, the report's being rolled back."""
        try:
            return self.uow.run(work)
        except ReportRefused as refused:
            self._record_refusals(report, [refused])
            raise

    def _record_refusals(self, report: str, refusals: list[ReportRefused]) -> None:
        now = self.clock.now_us()

        def record_in(tx: JobsTx) -> None:
            # A refused report is still a sign of life.
            tx.timeline.seen(refusals[0].worker, now, claimed=False)
            for refused in refusals:
                tx.timeline.report_refused(refused.job_id, worker=refused.worker,
                                           report=report, reason=refused.detail, now_us=now)

        try:
            self.uow.run(record_in)
        except SQLAlchemyError:
            # The worker is owed its 409 all the same: a report refused is never turned into
            # a 503 (which it would retry) for want of its record.
            log.warning("queuelog: could not record %d refused report(s)", len(refusals),
                        exc_info=True)
        self.uow.on_event("report_refused", len(refusals))

    # -- admins ---------------------------------------------------------------------------

    def cancel(self, caller: Caller, job_id: int) -> Job:
        """pending → cancelled."""
        return self._admin_transition(caller, job_id, Transition.CANCEL)

    def retry(self, caller: Caller, job_id: int) -> Job:
        """failed | cancelled → pending, with a fresh retry budget, claimable at once."""
        return self._admin_transition(caller, job_id, Transition.RETRY)

    def retry_many(self, caller: Caller, filters: dict[str, Any]) -> list[Job]:
        """Every failed or cancelled job the filters name (up to their limit) → pending with
        a fresh retry budget, in batches (see _bulk_transition); the others are skipped."""
        return self._bulk_transition(caller, Transition.RETRY, filters)

    def cancel_many(self, caller: Caller, filters: dict[str, Any]) -> list[Job]:
        """Every pending job the filters name (up to their limit) → cancelled, in batches (see
        _bulk_transition); the others are skipped."""
        return self._bulk_transition(caller, Transition.CANCEL, filters)

    def _bulk_transition(self, caller: Caller, transition: Transition,
                         filters: dict[str, Any]) -> list[Job]:
        """The jobs the filters name, lowest id first, up to their limit, taken a batch
        (QUEUELOG_BULK_BATCH_SIZE) at a time, each batch in a write transaction of its own:
        the database's write lock (SQLite's) is held for one batch at most, and every other
        writer goes on between batches. Only jobs that existed when the action began are
        taken. Returns the jobs changed, by id."""
        statuses = list(transition.from_statuses)
        if filters.get("status") is not None:
            statuses = [status for status in statuses if status == filters["status"]]
        if not statuses:
            return []
        batch_size = self.settings.bulk_batch_size
        # Named ids are looked at a batch of them at a time, not all of them by every batch.
        named = None if filters.get("ids") is None else sorted(set(filters["ids"]))
        up_to_id = self.uow.read(lambda tx: tx.jobs.highest_job_id())

        def transition_in(tx: JobsTx, ids: list[int] | None,
                          after_id: int, limit: int) -> tuple[list[int], list[Job]]:
            repo = self._confirmed(tx, caller).jobs
            now = self.clock.now_us()
            chosen = repo.find_ids_for_bulk(
                statuses=statuses, limit=limit, job_type=filters.get("type"),
                created_before=filters.get("created_before"),
                created_after=filters.get("created_after"), ids=ids, after_id=after_id,
                up_to_id=up_to_id)
            moved = self._apply_many_holding_keys(repo, transition, chosen,
                                                  transition.values(now_us=now))
            tx.made(transition, moved, actor=caller.name, now_us=now)
            return chosen, moved

        changed: list[Job] = []
        left, after_id, position = filters["limit"], 0, 0
        while left > 0:
            ids = None
            if named is not None:
                ids, position = named[position:position + batch_size], position + batch_size
                if not ids:
                    break
            limit = min(left, batch_size)
            chosen, moved = self.uow.run(functools.partial(
                transition_in, ids=ids, after_id=after_id, limit=limit))
            changed.extend(moved)
            left -= len(chosen)
            if ids is None and len(chosen) < limit:
                break  # no job left that the filters name
            after_id = chosen[-1] if ids is None else ids[-1]
        return changed

    @staticmethod
    def _apply_many_holding_keys(repo: JobRepository, transition: Transition,
                                 job_ids: list[int], values: dict[str, Any]) -> list[Job]:
        """A bulk transition; a job it would bring back into a unique key that a twin holds
        (a retry) is skipped, as jobs in other statuses are: one statement, which leaves out
        those jobs itself. On PostgreSQL a twin enqueued while it runs (committed after its
        snapshot) can still meet the index: then job by job, each in its own savepoint, as
        the batch is bounded."""
        try:
            with repo.conn.begin_nested():
                return repo.apply_transition_to_many(transition, job_ids, values)
        except IntegrityError as exc:
            if not _is_unique_scope_violation(exc):
                raise
        changed: list[Job] = []
        for job_id in job_ids:
            try:
                with repo.conn.begin_nested():
                    changed.extend(repo.apply_transition_to_many(transition, [job_id], values))
            except IntegrityError as exc:
                if not _is_unique_scope_violation(exc):
                    raise
        return changed

    def _admin_transition(self, caller: Caller, job_id: int, transition: Transition) -> Job:

        def transition_in(tx: JobsTx) -> Job:
            repo = self._confirmed(tx, caller).jobs
            now = self.clock.now_us()
            job = self._transition_holding_keys(repo, job_id, transition,
                                                transition.values(now_us=now))
            if job is None:
                current = repo.get_job(job_id)
                if current is None:
                    raise NotFound("No such job.")
                allowed = " or ".join(transition.from_statuses)
                raise Conflict(f"The job is {current.status}; this needs it {allowed}.")
            tx.made(transition, [job], actor=caller.name, now_us=now)
            return job

        return self.uow.run(transition_in)

    @staticmethod
    def _transition_holding_keys(repo: JobRepository, job_id: int, transition: Transition,
                                 values: dict[str, Any]) -> Job | None:
        """An admin's transition; a retry that would bring a job back into its while set
        while a twin holds its unique key is refused (409 naming the twin)."""
        if transition is not Transition.RETRY:
            return repo.apply_transition(transition, job_id, values)
        try:
            with repo.conn.begin_nested():
                return repo.apply_transition(transition, job_id, values)
        except IntegrityError as exc:
            if not _is_unique_scope_violation(exc):
                raise
        job = repo.get_job(job_id)
        twin = None if job is None else repo.find_unique_holder(job.producer,
                                                                 job.unique_scope or "")
        raise UniqueConflict("Another job holds this job's unique key; retry it once that "
                             "job has left its while statuses.", None if twin is None else twin.id)

    # -- retention ------------------------------------------------------------------------

    def purge(self, *, older_than_seconds: float, statuses: Collection[str] | None = None,
              batch_size: int | None = None) -> int:
        """Delete finished jobs last updated before the cutoff, one short transaction per
        batch (of QUEUELOG_BULK_BATCH_SIZE jobs unless told) so that writers are never held
        up long. Returns how many were deleted."""
        batch_size = batch_size or self.settings.bulk_batch_size
        chosen = set(statuses) if statuses else {s.value for s in TERMINAL_STATUSES}
        if not chosen <= {s.value for s in TERMINAL_STATUSES}:
            raise ValueError("only completed, failed and cancelled jobs can be purged")
        cutoff = self.clock.now_us() - round(older_than_seconds * MICROS)
        deleted, after_id = 0, 0
        while True:
            deleted_ids, last = self.uow.write_alone(functools.partial(
                self._purge_batch, statuses=sorted(chosen), cutoff=cutoff,
                after_id=after_id, limit=batch_size))
            count = len(deleted_ids)
            if last is None:
                return deleted
            deleted, after_id = deleted + count, last


    @staticmethod
    def _purge_batch(tx: JobsTx, *, statuses: list[str], cutoff: int, after_id: int,
                     limit: int) -> tuple[list[int], int | None]:
        deleted_ids, last = tx.jobs.delete_finished_jobs(
            statuses=statuses, updated_before_us=cutoff, after_id=after_id, limit=limit)
        # A job's attempts and events go with it, in the same transaction.
        tx.history.delete_history_of(deleted_ids)
        return deleted_ids, last
