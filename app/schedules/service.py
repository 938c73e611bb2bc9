"""The schedule use cases: create, read, edit, delete, and fire the due slots.

Firing is set-wise: one write transaction of the job service (JobService.write) takes a
batch of due schedules (locked on PostgreSQL, skipping those another process or host holds;
under the write lock on SQLite), inserts their slots' jobs through the same intake and
history as POST /jobs in one statement, and moves every schedule of the batch on in one
more. Each (schedule, scheduled_for) is guarded by a unique index as well: the database is
the last word on one job per slot. A slot that enqueues no job (missed, its unique key
held, its template no longer valid) is logged and counted, never silently dropped.

A schedule whose template is a workflow fires one slot at a time, in the same transaction:
each slot's workflow (its jobs, their dependencies, the workflow row) is stored by the
graph path of POST /workflows (JobService.enqueue_graph_in) in a savepoint. Its first job
carries the slot (schedule, scheduled_for) and the others the schedule alone (scheduled_for
NULL, which the unique index never compares): the slot's guard is the first job's, so a
slot whose first job exists already stores nothing of its workflow.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

from sqlalchemy import Connection

from app.core.clock import MICROS, Clock, to_rfc3339
from app.core.errors import Conflict, NotFound, SlotTaken, ValidationFailed
from app.core.tracecontext import Trace
from app.jobs.domain.cursor import decode_name_cursor, encode_name_cursor
from app.jobs.domain.intake import IntakeRules, NewJob, new_job
from app.jobs.domain.uniqueness import Deduplicated
from app.jobs.tx.uow import JobsTx
from app.jobs.usecases.service import JobService
from app.schedules.cron import Cron, CronError, normalise_expression, parse_zone
from app.schedules.models import Firing, Schedule, plan_firing
from app.schedules.repository import ScheduleRepository
from app.schedules.schemas import (
    NAME_PATTERN,
    WORKFLOW_JOBS_FIELD,
    WORKFLOW_KEY,
)
from app.schedules.templates import (
    ScheduleTemplates,
    TemplateUnreadable,
    WorkflowTemplate,
    caller_of,
    graph_of_slot,
)
from app.storage.engine import Database
from app.workflows.repository import WorkflowRepository

log = logging.getLogger(__name__)

# Due schedules one write transaction takes: a tick takes batch after batch until none is
# left. Large enough that 2,000 slots at one minute's boundary need a handful of commits,
# small enough that SQLite's write lock is never held long (claims and enqueues go on
# between batches) and that PostgreSQL hosts share a boundary's work batch by batch.
FIRE_BATCH = 250
# Jobs of workflow templates one firing transaction stores beyond its first workflow: slots
# past it wait for the next transaction of the same tick (a schedule not yet begun is left as
# if its tick came later; one begun moves on to its first slot left). A firing of plain job
# templates stores at most FIRE_BATCH * CATCH_UP.max (25,000) jobs; without this, one
# schedule of 1,000-job workflows catching up 100 slots would hold SQLite's write lock for
# 100,000.
FIRE_WORKFLOW_JOBS = 10_000
_NAME = re.compile(NAME_PATTERN)
_PAGE_READ = 500  # schedules every_schedule reads per query

# Why a due slot enqueued no job (the skipped-slots metric's reason label: bounded).
SKIP_MISSED = "missed"  # catch_up latest or none passed over a missed slot
SKIP_UNIQUE = "unique"  # the template's unique key was held (reject, or return: no new job)
SKIP_INVALID = "invalid"  # the stored template no longer loads or validates


class FiringSink(Protocol):
    """Told after a firing's commit: each job enqueued (its lateness), each slot skipped."""

    def count_schedule_firing(self, lateness_seconds: float) -> None: ...

    def count_schedule_skip(self, reason: str, count: int) -> None: ...


class _IgnoreFirings:
    def count_schedule_firing(self, lateness_seconds: float) -> None:
        pass

    def count_schedule_skip(self, reason: str, count: int) -> None:
        pass


@dataclass
class _Batch:
    """What one firing transaction did, told once it has committed."""

    taken: int
    stored: list[int] = dataclasses.field(default_factory=list)  # each job's lateness, microseconds
    skipped: Counter[str] = dataclasses.field(default_factory=Counter)
    said: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (schedule, log message)
    more: bool = False  # due slots left for another transaction (FIRE_WORKFLOW_JOBS)


@dataclass(frozen=True)
class ScheduleSettings:
    allow_seconds: bool = False  # QUEUELOG_SCHEDULE_SECONDS: six-field expressions
    grace_seconds: float = 60.0  # QUEUELOG_SCHEDULE_GRACE_SECONDS: late, not yet missed


class ScheduleService:
    def __init__(self, db: Database, clock: Clock, jobs: JobService, intake: IntakeRules,
                 settings: ScheduleSettings | None = None,
                 on_fired: FiringSink | None = None) -> None:
        self.db = db
        self.clock = clock
        self.jobs = jobs
        # The rules of POST /jobs, which a template's jobs pass as any other.
        self.intake = intake
        self.settings = settings or ScheduleSettings()
        self.on_fired: FiringSink = on_fired or _IgnoreFirings()
        self.templates = ScheduleTemplates(jobs, intake)
        # Schedules whose zone this host's zone database does not know (saved where it did):
        # said once, then passed over by this process's due queries (its zone database does
        # not change while it runs). Another host that knows the zone fires them.
        self._unreadable: set[str] = set()
        # The earliest slot of the active schedules at the last firing's look (None: none),
        # for a ticker that sleeps until then (app/schedules/ticker.py).
        self.next_slot_at: int | None = None

    # -- admins ---------------------------------------------------------------------------

    def create_schedule(self, body: dict[str, Any], trace: Trace | None = None) -> Schedule:
        """Store a new schedule (body as ScheduleCreateSchema loaded it: job or workflow),
        with `trace`, the trace context every job it enqueues carries (a PATCH keeps it).
        Raises ValidationFailed (cron, timezone, job, workflow) or Conflict (the name is
        taken)."""
        now = self.clock.now_us()
        cron = self._cron(body["cron"], body["timezone"])
        if body.get(WORKFLOW_KEY) is not None:
            job = self.templates.checked_workflow(body[WORKFLOW_KEY], body["name"])
        else:
            job = self.templates.checked_job(body["job"], body["name"], now)
        values = {
            "name": body["name"], "cron": cron.expression, "timezone": body["timezone"],
            "job": job, "catch_up": body["catch_up"], "paused": body["paused"],
            "next_run_at": cron.next_after(now), "last_run_at": None, "last_job_id": None,
            "created_at": now, "updated_at": now,
            "traceparent": None if trace is None else trace.traceparent,
            "tracestate": None if trace is None else trace.tracestate,
        }
        created = self.db.run_write(lambda conn: ScheduleRepository(conn).insert_schedule(values))
        if created is None:
            raise Conflict(f"A schedule named {body['name']!r} exists; choose another name or "
                           "change that one (PATCH).")
        return created

    def list_schedules(self, *, limit: int, cursor: str | None = None
                       ) -> tuple[list[Schedule], str | None]:
        """A page of the schedules by name, and the cursor of the next page (None on the
        last); the cursor is GET /jobs's kind, the limit its rule (PageQuerySchema)."""
        after = None if cursor is None else decode_name_cursor(cursor, _NAME)
        with self.db.read() as conn:
            page = _with_workflows(
                conn, ScheduleRepository(conn).list_schedules(after_name=after,
                                                              limit=limit + 1))
        now = self.clock.now_us()
        shown = [self._as_shown(schedule, now) for schedule in page[:limit]]
        return shown, (encode_name_cursor(shown[-1].name) if len(page) > limit else None)

    def every_schedule(self) -> Iterator[Schedule]:
        """All the schedules by name, read a page at a time (the CLI's listing)."""
        cursor: str | None = None
        while True:
            page, cursor = self.list_schedules(limit=_PAGE_READ, cursor=cursor)
            yield from page
            if cursor is None:
                return

    def get_schedule(self, name: str) -> Schedule:
        self._require_name(name)
        with self.db.read() as conn:
            schedule = ScheduleRepository(conn).get_schedule(name)
            if schedule is not None:
                [schedule] = _with_workflows(conn, [schedule])
        if schedule is None:
            raise NotFound("No such schedule.")
        return self._as_shown(schedule, self.clock.now_us())

    def _as_shown(self, schedule: Schedule, now: int) -> Schedule:
        """A paused schedule's stored next_run_at stays where pausing left it (firing never
        writes it): shown is the slot it would fire next if resumed now, which resuming
        computes and stores."""
        if not schedule.paused or schedule.next_run_at > now:
            return schedule
        try:
            cron = self._cron(schedule.cron, schedule.timezone)
        except ValidationFailed:
            return schedule
        return replace(schedule, next_run_at=cron.next_after(now))

    def update_schedule(self, name: str, patch: dict[str, Any]) -> Schedule:
        """Change the fields in `patch`; next_run_at is computed again from now (a slot due
        at the moment of the edit is not enqueued). A resumed schedule fires at its next
        slot, not the ones it skipped while paused."""
        if not patch:
            raise ValidationFailed(
                "Nothing to change: give at least one of cron, timezone, job, workflow, "
                "catch_up, paused.",
                errors={"_body": ["Give at least one field to change."]})
        current = self.get_schedule(name)
        now = self.clock.now_us()
        cron = self._cron(patch.get("cron", current.cron),
                          patch.get("timezone", current.timezone))
        values: dict[str, Any] = {"cron": cron.expression, "timezone": cron.zone.key,
                                  "next_run_at": cron.next_after(now), "updated_at": now}
        if "job" in patch:
            values["job"] = self.templates.checked_job(patch["job"], name, now)
        elif patch.get(WORKFLOW_KEY) is not None:
            values["job"] = self.templates.checked_workflow(patch[WORKFLOW_KEY], name)
        for field in ("catch_up", "paused"):
            if field in patch:
                values[field] = patch[field]

        def update(conn: Connection) -> Schedule | None:
            updated = ScheduleRepository(conn).update_schedule(name, values)
            return None if updated is None else _with_workflows(conn, [updated])[0]

        updated = self.db.run_write(update)
        if updated is None:
            raise NotFound("No such schedule.")
        return updated

    def delete_schedule(self, name: str) -> None:
        """Delete the schedule; the jobs it enqueued stay, still naming it."""
        self._require_name(name)
        if not self.db.run_write(lambda conn: ScheduleRepository(conn).delete_schedule(name)):
            raise NotFound("No such schedule.")

    # -- firing ---------------------------------------------------------------------------

    def fire_due(self, now_us: int | None = None) -> int:
        """Fire every active schedule whose next slot has come (at `now_us`, default the
        clock's now), FIRE_BATCH schedules per write transaction; returns how many slots this
        process fired (a job each, or a workflow each). Database errors propagate."""
        first = self.clock.now_us() if now_us is None else now_us
        with self.db.read() as conn:
            self.next_slot_at = ScheduleRepository(conn).earliest_slot(
                passing_over=self._unreadable)
        if self.next_slot_at is None or self.next_slot_at > first:
            return 0  # the common tick: one index probe, no write transaction
        enqueued = 0
        while True:
            # Each batch is stamped (created_at, the lateness metric) with its own time: a
            # later batch's jobs are truly that much later.
            batch = self.jobs.write(functools.partial(
                self._fire_batch, now=self.clock.now_us() if now_us is None else now_us))
            self._tell(batch)
            enqueued += len(batch.stored)
            if batch.taken < FIRE_BATCH and not batch.more:
                return enqueued

    def _fire_batch(self, tx: JobsTx, *, now: int) -> _Batch:
        """Take up to FIRE_BATCH due schedules on `conn` (locked: no other process fires them),
        enqueue their slots' jobs set-wise (a workflow template's slots: one workflow at a
        time, _fire_workflow) and move each on, in one transaction. What to tell
        once it commits goes in the returned _Batch (the writer may run this again after a
        rollback: it keeps no state of its own)."""
        repo = ScheduleRepository(tx.conn)
        taken = repo.take_due(now, FIRE_BATCH, passing_over=self._unreadable)
        batch = _Batch(taken=len(taken))
        grace = round(self.settings.grace_seconds * MICROS)
        slots: list[tuple[Schedule, int, NewJob]] = []
        workflows: list[tuple[Schedule, Firing, WorkflowTemplate]] = []
        moves: dict[str, dict[str, Any]] = {}
        for schedule in taken:
            move = {"name": schedule.name, "last_run_at": schedule.last_run_at,
                    "last_job_id": schedule.last_job_id}
            moves[schedule.name] = move
            cron = self._readable_cron(schedule, batch)
            if cron is None:
                # Nothing can be computed: left as it is, and out of this process's due
                # queries from now on (see _unreadable), so it never fills a batch.
                del moves[schedule.name]
                continue
            firing = plan_firing(schedule, cron, now, grace)
            move["next_run_at"] = firing.next_run_at
            template = self._loaded_template(schedule, batch)
            if isinstance(template, WorkflowTemplate):
                workflows.append((schedule, firing, template))  # after the plain ones
                continue
            if firing.skipped:
                batch.skipped[SKIP_MISSED] += firing.skipped
            if template is None:
                batch.skipped[SKIP_INVALID] += len(firing.slots)
                continue
            caller = caller_of(schedule.name)
            for position, slot in enumerate(firing.slots):
                try:
                    new = new_job(self.intake, caller, template, None, now, schedule.trace)
                except ValidationFailed as exc:
                    # The template passed when it was saved; the configuration changed since
                    # (a type no longer configured, a smaller payload limit).
                    batch.said.append((schedule.name,
                                       f"slot skipped, its job does not validate: {exc.detail}"))
                    batch.skipped[SKIP_INVALID] += len(firing.slots) - position
                    break
                slots.append((schedule, slot, replace(new, values={
                    **new.values, "schedule": schedule.name, "scheduled_for": slot})))
        outcomes = self.jobs.enqueue_slots_in(
            tx, [(new, schedule.actor) for schedule, _slot, new in slots])
        for (schedule, slot, _new), outcome in zip(slots, outcomes, strict=True):
            if isinstance(outcome, Conflict):
                # The template's unique key is held by a job of an earlier slot (reject, or
                # replace of a job no longer pending): this slot has no job. Said without the
                # payload (the twin's id only).
                batch.skipped[SKIP_UNIQUE] += 1
                batch.said.append((schedule.name, f"slot {to_rfc3339(slot)} skipped: "
                                                  f"{outcome.detail}"))
            elif outcome is not None and outcome.deduplicated is Deduplicated.RETURNED:
                # unique with `return`: the held job stands for this slot; none was enqueued.
                batch.skipped[SKIP_UNIQUE] += 1
                batch.said.append((schedule.name, f"slot {to_rfc3339(slot)} skipped: job "
                                                  f"{outcome.job.id} holds its unique key"))
            elif outcome is not None:
                batch.stored.append(now - slot)
                moves[schedule.name].update(last_run_at=slot, last_job_id=outcome.job.id)
        stored_jobs = 0
        for schedule, firing, workflow in workflows:
            if stored_jobs and stored_jobs + len(workflow.jobs) > FIRE_WORKFLOW_JOBS:
                # Not begun: left as it is, planned afresh by the next transaction.
                del moves[schedule.name]
                batch.more = True
                continue
            if firing.skipped:
                batch.skipped[SKIP_MISSED] += firing.skipped
            stored_jobs = self._fire_workflow(tx, schedule, firing.slots, workflow, now=now,
                                              batch=batch, move=moves[schedule.name],
                                              stored_jobs=stored_jobs)
        repo.move_on(list(moves.values()))
        return batch

    def _fire_workflow(self, tx: JobsTx, schedule: Schedule, slots: list[int],
                       template: WorkflowTemplate, *, now: int, batch: _Batch,
                       move: dict[str, Any], stored_jobs: int) -> int:
        """Create the workflow of each of `slots` (oldest first) in `tx`, one slot at a time,
        each in a savepoint: its jobs and their edges by the graph path of POST /workflows,
        as the schedule's producer, and its workflow row. A slot whose first job exists
        already (the unique index: another process fired it) stores nothing. Slots past
        FIRE_WORKFLOW_JOBS (`stored_jobs` stored in `tx` so far) are left to the next
        transaction; returns the jobs stored in `tx` so far."""
        if not slots:
            return stored_jobs
        caller = caller_of(schedule.name)
        try:
            graph = self.jobs.prepare_graph(caller, template.jobs, prefix=WORKFLOW_JOBS_FIELD,
                                            earlier_only=False, trace=schedule.trace)
        except ValidationFailed as exc:
            # Valid when saved; the configuration changed since. Said by field (never the
            # payload).
            batch.said.append((schedule.name, "slot skipped, its workflow does not validate: "
                                              f"{', '.join(sorted(exc.errors or {}))}"))
            batch.skipped[SKIP_INVALID] += len(slots)
            return stored_jobs
        refs = [job["ref"] for job in template.jobs]
        for slot in slots:
            if stored_jobs and stored_jobs + len(refs) > FIRE_WORKFLOW_JOBS:
                # The rest from this slot on: the schedule moves on to it, still due.
                move["next_run_at"] = slot
                batch.more = True
                return stored_jobs
            try:
                with tx.jobs.savepoint():
                    outcomes = self.jobs.enqueue_graph_in(
                        tx, caller, graph_of_slot(graph, schedule.name, slot))
                    job_ids = [outcome.job.id for outcome in outcomes]
                    WorkflowRepository(tx.conn).add_workflow(
                        name=template.name, producer=caller.name, created_at=now,
                        refs=[(ref, job_id, False)
                              for ref, job_id in zip(refs, job_ids, strict=True)])
            except SlotTaken:
                continue  # the slot's workflow exists, made by another process or host
            except ValidationFailed as exc:
                # Only a template stored otherwise than through the API names job ids (and
                # one of them is gone): said, counted, and the batch goes on.
                batch.said.append((schedule.name, f"slot {to_rfc3339(slot)} skipped: "
                                                  f"{', '.join(sorted(exc.errors or {}))}"))
                batch.skipped[SKIP_INVALID] += 1
                continue
            stored_jobs += len(job_ids)
            batch.stored.append(now - slot)
            move.update(last_run_at=slot, last_job_id=job_ids[0])
        return stored_jobs

    def _tell(self, batch: _Batch) -> None:
        """What a committed batch did, to the log and the metrics (app/storage/group_commit.py:
        the work itself has no effect outside the database)."""
        for name, message in batch.said:
            log.warning("schedule %s: %s", name, message)
        for lateness in batch.stored:
            self.on_fired.count_schedule_firing(max(0.0, lateness / MICROS))
        for reason, count in batch.skipped.items():
            self.on_fired.count_schedule_skip(reason, count)

    def _readable_cron(self, schedule: Schedule, batch: _Batch) -> Cron | None:
        try:
            return self._cron(schedule.cron, schedule.timezone)
        except ValidationFailed:
            # A zone this host's zone database does not know (the schedule was saved where it
            # did): said once per process, not every time it is looked at.
            if schedule.name not in self._unreadable:
                self._unreadable.add(schedule.name)
                batch.said.append((schedule.name, f"cannot compute its slots (cron "
                                                  f"{schedule.cron!r}, zone "
                                                  f"{schedule.timezone!r})"))
            return None

    # -- rules ----------------------------------------------------------------------------

    def _cron(self, expression: str, timezone: str) -> Cron:
        try:
            return _parsed_cron(expression, timezone, self.settings.allow_seconds)
        except _ZoneError as exc:
            raise ValidationFailed(f"timezone: {exc}.", errors={"timezone": [f"{exc}."]}) from None
        except CronError as exc:
            raise ValidationFailed(f"cron: {exc}.", errors={"cron": [f"{exc}."]}) from None

    def _loaded_template(self, schedule: Schedule, batch: _Batch
                         ) -> dict[str, Any] | WorkflowTemplate | None:
        try:
            return self.templates.loaded(schedule.job)
        except TemplateUnreadable:
            batch.said.append((schedule.name,
                               "its stored job template does not load; slot skipped"))
            return None

    @staticmethod
    def _require_name(name: str) -> None:
        # A name no schedule can have is answered without a query (PostgreSQL refuses text
        # holding NUL, say, with an error of its own).
        if not _NAME.match(name):
            raise NotFound("No such schedule.")


class _ZoneError(CronError):
    """The time zone, not the expression, is what is wrong."""


@functools.lru_cache(maxsize=4096)
def _parsed_cron(expression: str, timezone: str, allow_seconds: bool) -> Cron:
    """The Cron of a stored (expression, zone), parsed once per process rather than at every
    firing (a Cron is immutable). Errors are not cached: they raise again each time."""
    try:
        zone = parse_zone(timezone)
    except CronError as exc:
        raise _ZoneError(str(exc)) from None
    return Cron(normalise_expression(expression, seconds=allow_seconds), zone)


def _with_workflows(conn: Connection, schedules: list[Schedule]) -> list[Schedule]:
    """The schedules with last_workflow_id: the workflow their last job is part of (a
    workflow template's slot), read in one query on `conn`."""
    workflow_of = WorkflowRepository(conn).workflows_of_jobs(
        {schedule.last_job_id for schedule in schedules if schedule.last_job_id is not None})
    if not workflow_of:
        return schedules
    return [replace(schedule, last_workflow_id=workflow_of.get(schedule.last_job_id or 0))
            for schedule in schedules]
