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
from app.core.statuses import TERMINAL_STATUSES, JobStatus
from app.core.tracecontext import Trace
from app.jobs.domain.graph import (
    Birth,
    Dependency,
    GraphItem,
    dependency_first,
    due_at_birth,
    field,
    resolve_graph,
    statuses_at_birth,
)
from app.jobs.domain.history import SERVICE_ACTOR
from app.jobs.domain.intake import (
    BatchPlan,
    IntakeRules,
    NewJob,
    new_job,
    plan_batch,
    replayed,
    resolve_unique_conflict,
)
from app.jobs.domain.models import Job
from app.jobs.domain.transitions import Transition
from app.jobs.domain.uniqueness import Deduplicated
from app.jobs.sql.repository import WriteConflict
from app.jobs.tx.uow import JobsTx, JobsUnitOfWork
from app.jobs.wake.waiting import JobSignal

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


@dataclass(frozen=True)
class GraphRequest:
    """Jobs enqueued together with dependencies (POST /jobs with depends_on, a batch naming
    refs or ids, a workflow), checked and resolved before any transaction: each item's new
    job, its place in the graph and its dependencies. `prefix` names the items' fields in
    errors (`jobs` → `jobs.3.depends_on`; None for a single job)."""

    items: list[NewJob]
    graph: list[GraphItem]
    deps: list[list[Dependency]]
    prefix: str | None


def graph_item_of(request: dict[str, Any]) -> GraphItem:
    return GraphItem(request.get("ref"), tuple(request.get("depends_on") or ()),
                     (request.get("on_dependency_failure") or "cancel") == "cancel")


def has_dependencies(request: dict[str, Any]) -> bool:
    return bool(request.get("depends_on")) or request.get("ref") is not None


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
                header_idempotency_key: str | None = None, *,
                trace: Trace | None = None) -> Enqueued:
        """Store a new job, replay the one this idempotency key made before, or meet the twin
        holding this request's unique key (return it, reject, or replace it). `trace`: the
        request's trace context, kept with a new job.

        Raises ValidationFailed, Forbidden, Conflict or UniqueConflict.
        """
        if request.get("depends_on"):
            [outcome] = self._enqueue_graph(caller, self.prepare_graph(
                caller, [request], prefix=None, earlier_only=True,
                header_idempotency_key=header_idempotency_key, trace=trace))
            return outcome
        now = self.clock.now_us()
        new = new_job(self.intake, caller, request, header_idempotency_key, now, trace)

        def enqueue_in(tx: JobsTx) -> Enqueued:
            if tx.one_statement and not tx.without_key_modes(new.values["type"]):
                tx.need_transaction()
            tx.jobs_confirming(caller)  # by the job's INSERT
            return insert_or_meet(tx, new)

        # A job that is its row alone is one statement: one round trip on PostgreSQL.
        outcome = (self.uow.run_statement if new.stored_alone else self.uow.run)(enqueue_in)
        if outcome.created or outcome.deduplicated is Deduplicated.REPLACED:
            self.signal.notify()  # a replacement may have moved its run_at closer
        return outcome

    def enqueue_many(self, caller: Caller, requests: list[dict[str, Any]], *,
                     trace: Trace | None = None) -> list[Enqueued]:
        """Store several jobs in one transaction, all or nothing; what each item made, in order.

        Every item is checked before anything is written; field errors are keyed by position
        (`jobs.3.type`). Idempotency keys and unique keys work per item, and an item meets an
        earlier item of the batch as it would a stored job. Every new job keeps `trace` (the
        batch request's trace context).
        """
        if any(has_dependencies(request) for request in requests):
            return self._enqueue_graph(caller, self.prepare_graph(
                caller, requests, prefix="jobs", earlier_only=True, trace=trace))
        items = self._new_jobs(caller, requests, prefix="jobs", trace=trace)

        def enqueue_in(tx: JobsTx) -> list[Enqueued]:
            tx.confirm(caller)
            return _insert_or_meet_many(tx, items)

        return self._run_batch(enqueue_in)

    def prepare_graph(self, caller: Caller, requests: list[dict[str, Any]], *,
                      prefix: str | None, earlier_only: bool,
                      header_idempotency_key: str | None = None,
                      trace: Trace | None = None) -> GraphRequest:
        """Check jobs enqueued with their dependencies, before any transaction: each job as
        an enqueue would, and the graph (see app/jobs/domain/graph.py). `earlier_only`: refs name
        earlier items only (a batch); `trace`: every job's trace context. Raises
        ValidationFailed naming every field at fault, or Forbidden."""
        items = self._new_jobs(caller, requests, prefix=prefix,
                               header_idempotency_key=header_idempotency_key, trace=trace)
        graph = [graph_item_of(request) for request in requests]
        return GraphRequest(items, graph, resolve_graph(graph, prefix=prefix,
                                                        earlier_only=earlier_only), prefix)

    def _enqueue_graph(self, caller: Caller, request: GraphRequest) -> list[Enqueued]:
        def enqueue_in(tx: JobsTx) -> list[Enqueued]:
            tx.confirm(caller)
            return self.enqueue_graph_in(tx, caller, request)

        return self._run_batch(enqueue_in)

    def _new_jobs(self, caller: Caller, requests: list[dict[str, Any]], *,
                  prefix: str | None, header_idempotency_key: str | None = None,
                  trace: Trace | None = None) -> list[NewJob]:
        """Each request's new job, at one moment; ValidationFailed names every field at
        fault by position (`jobs.3.type`), Forbidden the first item refused."""
        now = self.clock.now_us()
        items, errors = [], {}
        for position, request in enumerate(requests):
            try:
                items.append(new_job(self.intake, caller, request, header_idempotency_key,
                                     now, trace))
            except ValidationFailed as exc:
                errors.update({field(prefix, position, name): messages
                               for name, messages in (exc.errors or {}).items()})
            except Forbidden as exc:
                if prefix is None:
                    raise
                raise Forbidden(f"{prefix}.{position}: {exc.detail}") from None
        if errors:
            raise ValidationFailed("Some jobs did not validate; nothing was stored.",
                                   errors=errors)
        return items

    def _run_batch(self, work: Callable[[JobsTx], list[Enqueued]]) -> list[Enqueued]:
        """Run a batch's transaction, again when a concurrent request raced its keys."""
        for attempt in range(_BATCH_ATTEMPTS):
            try:
                results = self.uow.run(work)
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

    @staticmethod
    def enqueue_graph_in(tx: JobsTx, caller: Caller, request: GraphRequest) -> list[Enqueued]:
        """Store a graph of jobs inside the caller's job transaction, all or nothing; what
        each item made, in order.

        The dependencies named by id are locked first (DependencyRepository
        .lock_dependencies: a dependency finishing now is seen finished, one finishing later
        finds the edges stored here). Each new job is born waiting, pending, or cancelled
        (a dependency already failed or cancelled, under on_dependency_failure cancel), as
        app/jobs/domain/graph.py decides. An item that meets a stored job (an idempotency replay,
        a unique twin) names that job, which keeps its own dependencies."""
        existing = tx.dependencies.lock_dependencies(
            {dep.job_id for deps in request.deps for dep in deps if dep.job_id is not None})
        _refuse_unknown_dependencies(caller, request, existing)
        status_of = {job_id: row.status for job_id, row in existing.items()}
        ended_at = {i: r.updated_at for i, r in existing.items() if r.status in TERMINAL_STATUSES}
        decided: dict[int, Birth] = {}

        def born_as(plan: BatchPlan) -> None:
            fixed, aliases = _jobs_met(plan)
            decided.update(statuses_at_birth(request.deps, request.graph, status_of, fixed,
                                             aliases))
            for position, (kind, row, _how) in enumerate(plan.steps):
                if kind == "new":
                    new_row, status = plan.new_rows[row], decided[position].status
                    new_row["status"] = status.value
                    if status is JobStatus.PENDING:
                        new_row["run_at"] = due_at_birth(
                            new_row["run_at"], request.deps[position], ended_at)
            _store_dependencies_first(plan, dependency_first(request.deps, aliases))

        outcomes = _insert_or_meet_many(tx, request.items, before_insert=born_as)
        job_of = [outcome.job for outcome in outcomes]
        edges: list[dict[str, Any]] = []
        born_cancelled: list[Job] = []
        causes: dict[int, dict[str, Any]] = {}
        def named(dep: Dependency) -> tuple[int, str]:
            """The id and status (as stored now) of the job a dependency names."""
            if dep.job_id is not None:
                return dep.job_id, status_of[dep.job_id]
            job = job_of[dep.item if dep.item is not None else -1]
            return job.id, job.status

        for position, birth in decided.items():
            job = job_of[position]
            cancel_on_failure = request.graph[position].cancel_on_failure
            for order, dep in enumerate(request.deps[position]):
                dep_id, dep_status = named(dep)
                edges.append({"job_id": job.id, "position": order, "depends_on_id": dep_id,
                              "cancel_on_failure": int(cancel_on_failure),
                              "resolved": int(dep_status in TERMINAL_STATUSES)})
            if birth.status is JobStatus.CANCELLED and birth.cancelled_by is not None:
                cause_id, cause_status = named(birth.cancelled_by)
                born_cancelled.append(job)
                causes[job.id] = {"dependency": cause_id, "dependency_status": cause_status}
        tx.dependencies.add_edges(edges)
        if born_cancelled:
            tx.after_transition(Transition.DEPENDENCY_CANCEL, born_cancelled, actor=SERVICE_ACTOR,
                    now_us=born_cancelled[0].created_at, details=causes)
        return outcomes

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
                add_context(tx, [(job.id, items[position][0])
                                 for position, job in zip(plain, inserted, strict=True)])
                inserted = tx.join_keys(inserted, items[plain[0]][0].values["created_at"])
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


def _held(tx: JobsTx, twin: Job) -> Job:
    """The twin a unique enqueue met, read again and held: its timeline tells its story up to
    now before the deduplicated event (app/jobs/timeline/recorder.py), which no report of
    its holder writes at the same time."""
    return tx.jobs.get_job(twin.id, for_update=True) or twin


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
            add_context(tx, [(job.id, new)])
            if new.reservation is None:
                [job] = tx.join_keys([job], values["created_at"])
            else:  # it joins its key and its round once confirmed (usecases/reservations.py)
                tx.reservations.add(job.id, producer=values["producer"],
                                    confirm_by=new.reservation.confirm_by,
                                    check_url=new.reservation.check_url)
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
                replacement = resolve_unique_conflict(holder, new)
                now = values["created_at"]
                if replacement is None:
                    tx.timeline.deduplicated([_held(tx, holder)], actor=actor, now_us=now)
                    return Enqueued(holder, deduplicated=Deduplicated.RETURNED)
                replaced = repo.apply_transition(Transition.REPLACE, holder.id, replacement)
                if replaced is not None:
                    tx.timeline.transition(Transition.REPLACE, [replaced], actor=actor,
                                           now_us=now)
                    return Enqueued(replaced, deduplicated=Deduplicated.REPLACED)
        # The job that stood in the way moved on between the insert and the look-up.
    raise Conflict("A request with this idempotency or unique key is in flight; retry.")


def add_context(tx: JobsTx, made: Sequence[tuple[int, NewJob]]) -> None:
    """The tags and trace context of jobs just inserted (job id, the NewJob it was made
    of): one INSERT per table for them all, none for jobs without any (docs/API.md)."""
    tags = [(job_id, tag) for job_id, new in made for tag in new.tags]
    traces = [(job_id, new.trace) for job_id, new in made if new.trace is not None]
    if tags:
        tx.context.add_tags(tags)
    if traces:
        tx.context.add_traces(traces)


def _refuse_unknown_dependencies(caller: Caller, request: GraphRequest,
                                 existing: dict[int, Any]) -> None:
    """ValidationFailed naming each item's dependencies that do not exist or that the caller
    may not name (another producer's job): the two answered alike, so that no producer
    learns of another's jobs (V-09)."""
    errors: dict[str, list[str]] = {}
    for position, deps in enumerate(request.deps):
        unknown = [dep.job_id for dep in deps if dep.job_id is not None and (
            dep.job_id not in existing
            or not (caller.is_admin or existing[dep.job_id].producer == caller.name))]
        if unknown:
            errors[field(request.prefix, position, "depends_on")] = [
                f"No job {job_id} that this key may name." for job_id in unknown]
    if errors:
        raise ValidationFailed("Some dependencies name no job this key may name; nothing "
                               "was stored.", errors=errors)


def _store_dependencies_first(plan: BatchPlan, order: Sequence[int]) -> None:
    """The plan's new rows put in `order` (item positions): inserted so, each job's id is
    above those of the jobs it depends on."""
    rows: list[dict[str, Any]] = []
    row_of_item: dict[int, int] = {}
    for position in order:
        kind, row, _how = plan.steps[position]
        if kind == "new":
            row_of_item[position] = len(rows)
            rows.append(plan.new_rows[row])
    plan.new_rows[:] = rows
    plan.steps[:] = [(kind, row_of_item[position], how) if kind == "new" else (kind, row, how)
                     for position, (kind, row, how) in enumerate(plan.steps)]


def _jobs_met(plan: BatchPlan) -> tuple[dict[int, str], dict[int, int]]:
    """The items of a planned batch that make no job of their own, by position: those that met
    a stored job (a replay, a unique twin), with that job's status; and those that met an
    earlier item's job, with the position of the item whose job is theirs."""
    fixed: dict[int, str] = {}
    aliases: dict[int, int] = {}
    for position, (kind, ref, _how) in enumerate(plan.steps):
        if kind in ("replay", "twin"):
            fixed[position] = ref.status
        elif kind in ("replay_item", "twin_item"):
            if ref in fixed:
                fixed[position] = fixed[ref]
            else:
                aliases[position] = aliases.get(ref, ref)
    return fixed, aliases


def _insert_or_meet_many(tx: JobsTx, items: list[NewJob],
                         before_insert: Callable[[BatchPlan], None] | None = None
                         ) -> list[Enqueued]:
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
    if before_insert is not None:
        before_insert(plan)
    inserted = repo.insert_jobs(plan.new_rows)
    add_context(tx, [(inserted[row].id, items[position])
                     for position, (kind, row, _how) in enumerate(plan.steps) if kind == "new"])
    now = items[0].values["created_at"]
    inserted = tx.join_keys(inserted, now)
    tx.timeline.enqueued(inserted)
    outcomes = [Enqueued(job, replayed=was_replayed, deduplicated=how)
                for job, was_replayed, how in plan.results(inserted, replaced)]
    # The twins met are held in id order, as the replaced ones were (no deadlock between
    # batches); then, in request order, each item that met a twin is told on its timeline.
    met = {outcome.job.id: outcome.job for outcome in outcomes
           if not outcome.replayed and outcome.deduplicated is Deduplicated.RETURNED}
    held = {job_id: _held(tx, job) for job_id, job in sorted(met.items())}
    for outcome in outcomes:
        if outcome.replayed:
            continue
        if outcome.deduplicated is Deduplicated.RETURNED:
            tx.timeline.deduplicated([held[outcome.job.id]], actor=producer, now_us=now)
        elif outcome.deduplicated is Deduplicated.REPLACED:
            tx.timeline.transition(Transition.REPLACE, [outcome.job], actor=producer,
                                   now_us=now)
    tx.events["enqueued"] += sum(1 for outcome in outcomes if outcome.created)
    return outcomes
