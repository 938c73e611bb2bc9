"""Enqueueing: a new job, a replay of an idempotency key, or a unique twin met (return,
replace, reject); one at a time, in batches, and inside another service's transaction
(schedules' slots)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from app.core.callers import Caller
from app.core.clock import Clock
from app.core.errors import (
    Conflict,
    Forbidden,
    IdempotencyKeyTaken,
    SlotTaken,
    UniqueIndexRefused,
    UniqueScopeHeld,
    ValidationFailed,
)
from app.jobs.intake import IntakeRules, NewJob, meet_stored_twin, new_job, plan_batch, replayed
from app.jobs.models import Job
from app.jobs.repository import WriteConflict
from app.jobs.transitions import Transition
from app.jobs.uniqueness import Deduplicated
from app.jobs.uow import JobsTx, JobsUnitOfWork
from app.jobs.waiting import JobSignal

T = TypeVar("T")

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


class Enqueuing:
    """`signal` is told when jobs may have become claimable (claims waiting in this process
    wake)."""

    def __init__(self, uow: JobsUnitOfWork, clock: Clock, intake: IntakeRules,
                 signal: JobSignal) -> None:
        self.uow = uow
        self.clock = clock
        self.intake = intake
        self.signal = signal

    def enqueue(self, caller: Caller, request: dict[str, Any],
                header_idempotency_key: str | None = None) -> Enqueued:
        """Store a new job, replay the one this idempotency key made before, or meet the twin
        holding this request's unique key (return it, reject, or replace it).

        Raises ValidationFailed, Forbidden, Conflict or UniqueConflict.
        """
        now = self.clock.now_us()
        new = new_job(self.intake, caller, request, header_idempotency_key, now)

        def enqueue_in(tx: JobsTx) -> Enqueued:
            tx.confirm(caller)
            return insert_or_meet(tx, new)

        outcome = self.uow.run(enqueue_in)
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

        def enqueue_in(tx: JobsTx) -> list[Enqueued]:
            tx.confirm(caller)
            return _insert_or_meet_many(tx, items)

        for attempt in range(_BATCH_ATTEMPTS):
            try:
                results = self.uow.run(enqueue_in)
                break
            except (IdempotencyKeyTaken, UniqueScopeHeld, WriteConflict, _TwinMoved):
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

    def write(self, work: Callable[[JobsTx], T]) -> T:
        """Run `work` in a job transaction (app/storage/uow.py, whose rule it keeps); for
        other services whose writes create jobs (schedules). Claims waiting in this process
        are woken when it has enqueued."""
        result = self.uow.run(work)
        self.signal.notify()
        return result

    @staticmethod
    def enqueue_in(tx: JobsTx, new: NewJob, *, actor: str) -> Enqueued | None:
        """Store `new` (built by intake's new_job) inside the caller's job transaction (see
        `write`), recording `actor` on its timeline; None when the job's schedule slot has
        its job already (the unique index said so). A unique twin is met as on POST /jobs:
        its UniqueConflict (reject) propagates."""
        try:
            return insert_or_meet(tx, new, actor=actor)
        except SlotTaken:
            # The slot's job exists, enqueued by another process or host.
            return None

    @classmethod
    def enqueue_slots_in(cls, tx: JobsTx, items: Sequence[tuple[NewJob, str]]
                         ) -> list[Enqueued | Conflict | None]:
        """Store schedule slots' jobs (each built by new_job, with its actor) inside the
        caller's job transaction, set-wise: the jobs without a unique or idempotency key in
        one INSERT and one history INSERT. Per item, in order: what it made; None when its
        slot has its job already; the UniqueConflict its unique twin answered (reject), or
        the Conflict of a twin that kept moving while it was met.

        Should a slot's job exist after all (a process firing otherwise than by locking the
        schedule rows, say during an upgrade), the one INSERT is undone and every item goes
        through enqueue_in, where the unique index answers for each."""
        results: list[Enqueued | Conflict | None] = [None] * len(items)
        plain = [position for position, (new, _actor) in enumerate(items)
                 if new.unique is None and new.values["idempotency_key"] is None]
        chosen = set(plain)
        one_by_one = [position for position in range(len(items)) if position not in chosen]
        if plain:
            try:
                with tx.jobs.savepoint():
                    inserted = tx.jobs.insert_jobs([items[position][0].values
                                                    for position in plain])
            except UniqueIndexRefused:
                one_by_one = list(range(len(items)))
            else:
                tx.timeline.enqueued(inserted, actors=[items[position][1] for position in plain])
                tx.events["enqueued"] += len(inserted)
                for position, job in zip(plain, inserted, strict=True):
                    results[position] = Enqueued(job)
        for position in one_by_one:
            new, actor = items[position]
            try:
                results[position] = cls.enqueue_in(tx, new, actor=actor)
            except Conflict as refused:  # UniqueConflict (reject) among them
                results[position] = refused
        return results


def insert_or_meet(tx: JobsTx, new: NewJob, actor: str | None = None) -> Enqueued:
    """Insert `new`, or meet the job that stands in the way: the idempotency key's job (a
    replay) or the unique key's holder (return, replace, reject). SlotTaken propagates."""
    values = new.values
    actor = actor or values["producer"]
    repo = tx.jobs
    for _attempt in range(_TWIN_ATTEMPTS):
        try:
            job = repo.insert_job(values)
        except (IdempotencyKeyTaken, UniqueScopeHeld):
            pass
        else:
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
                replaced = repo.apply_transition(Transition.REPLACE, holder.id, replacement)
                if replaced is not None:
                    tx.timeline.transition(Transition.REPLACE, [replaced], actor=actor,
                                           now_us=now)
                    return Enqueued(replaced, deduplicated=Deduplicated.REPLACED)
        # The job that stood in the way moved on between the insert and the look-up.
    raise Conflict("A request with this idempotency or unique key is in flight; retry.")


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
