"""The schedule use cases: create, read, edit, delete, and fire the due slots.

A slot's firing is one write transaction of the job service (JobService.write): it moves the
schedule's next_run_at on, conditional on the value this process saw (only one process or
host can), and inserts the slot's job through the same intake and history as POST /jobs, its
(schedule, scheduled_for) guarded by a unique index. A racer that lost finds nothing to do
and says nothing.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from marshmallow import ValidationError
from sqlalchemy import Connection

from app.clock import MICROS, Clock
from app.db import Database
from app.errors import Conflict, NotFound, ValidationFailed
from app.jobs.intake import new_job
from app.jobs.models import Priority
from app.jobs.service import Events, JobService
from app.keys.models import Caller, Role
from app.schedules.cron import Cron, CronError, normalise_expression, parse_zone
from app.schedules.models import Firing, Schedule, plan_firing, producer_of
from app.schedules.repository import ScheduleRepository
from app.schedules.schemas import NAME_PATTERN, JobTemplateSchema, template_json

log = logging.getLogger(__name__)

# Due schedules one tick fires at most; the rest wait for the next tick.
DUE_BATCH = 100
_NAME = re.compile(NAME_PATTERN)

# Told after a firing's commit: the schedule's name and each job's lateness in seconds.
FiringSink = Callable[[str, float], None]


def _ignore_firing(_name: str, _lateness: float) -> None:
    pass


@dataclass(frozen=True)
class ScheduleSettings:
    allow_seconds: bool = False  # QUEUELOG_SCHEDULE_SECONDS: six-field expressions
    grace_seconds: float = 60.0  # QUEUELOG_SCHEDULE_GRACE_SECONDS: late, not yet missed


class ScheduleService:
    def __init__(self, db: Database, clock: Clock, jobs: JobService,
                 settings: ScheduleSettings | None = None,
                 on_fired: FiringSink = _ignore_firing) -> None:
        self.db = db
        self.clock = clock
        self.jobs = jobs
        self.settings = settings or ScheduleSettings()
        self.on_fired = on_fired
        self._template = JobTemplateSchema()
        self._unreadable: set[str] = set()  # schedules whose zone this host does not know

    # -- admins ---------------------------------------------------------------------------

    def create_schedule(self, body: dict[str, Any]) -> Schedule:
        """Store a new schedule (body as ScheduleCreateSchema loaded it). Raises
        ValidationFailed (cron, timezone, job) or Conflict (the name is taken)."""
        now = self.clock.now_us()
        cron = self._cron(body["cron"], body["timezone"])
        job = self._checked_template(body["job"], body["name"], now)
        values = {
            "name": body["name"], "cron": cron.expression, "timezone": body["timezone"],
            "job": job, "catch_up": body["catch_up"], "paused": body["paused"],
            "next_run_at": cron.next_after(now), "last_run_at": None, "last_job_id": None,
            "created_at": now, "updated_at": now,
        }
        created = self.db.run_write(lambda conn: ScheduleRepository(conn).insert_schedule(values))
        if created is None:
            raise Conflict(f"A schedule named {body['name']!r} exists; choose another name or "
                           "change that one (PATCH).")
        return created

    def list_schedules(self) -> list[Schedule]:
        with self.db.read() as conn:
            return ScheduleRepository(conn).list_schedules()

    def get_schedule(self, name: str) -> Schedule:
        self._require_name(name)
        with self.db.read() as conn:
            schedule = ScheduleRepository(conn).get_schedule(name)
        if schedule is None:
            raise NotFound("No such schedule.")
        return schedule

    def update_schedule(self, name: str, patch: dict[str, Any]) -> Schedule:
        """Change the fields in `patch`; next_run_at is computed again from now (a slot due
        at the moment of the edit is not enqueued). A resumed schedule fires at its next
        slot, not the ones it skipped while paused."""
        if not patch:
            raise ValidationFailed(
                "Nothing to change: give at least one of cron, timezone, job, catch_up, paused.",
                errors={"_body": ["Give at least one field to change."]})
        current = self.get_schedule(name)
        now = self.clock.now_us()
        cron = self._cron(patch.get("cron", current.cron),
                          patch.get("timezone", current.timezone))
        values: dict[str, Any] = {"cron": cron.expression, "timezone": cron.zone.key,
                                  "next_run_at": cron.next_after(now), "updated_at": now}
        if "job" in patch:
            values["job"] = self._checked_template(patch["job"], name, now)
        for field in ("catch_up", "paused"):
            if field in patch:
                values[field] = patch[field]
        updated = self.db.run_write(
            lambda conn: ScheduleRepository(conn).update_schedule(name, values))
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
        """Fire every schedule whose next slot has come (at `now_us`, default the clock's
        now); returns how many jobs this process enqueued. Database errors propagate."""
        now = self.clock.now_us() if now_us is None else now_us
        with self.db.read() as conn:
            due = ScheduleRepository(conn).find_due(now, DUE_BATCH)
        return sum(self._fire(schedule, now) for schedule in due)

    def _fire(self, schedule: Schedule, now: int) -> int:
        try:
            cron = self._cron(schedule.cron, schedule.timezone)
        except ValidationFailed:
            # A zone this host's zone database does not know (the schedule was saved where it
            # did): nothing can be computed; said once per process, not every tick.
            if schedule.name not in self._unreadable:
                self._unreadable.add(schedule.name)
                log.warning("schedule %s: cannot compute its slots (cron %r, zone %r)",
                            schedule.name, schedule.cron, schedule.timezone)
            return 0
        firing = plan_firing(schedule, cron, now, round(self.settings.grace_seconds * MICROS))
        template = self._loaded_template(schedule)
        refused: list[str] = []

        def fire_in(conn: Connection, events: Events) -> list[tuple[int, int]]:
            refused.clear()  # the writer may run this again after a rollback
            repo = ScheduleRepository(conn)
            if not repo.take_due_slot(schedule.name, schedule.next_run_at, firing.next_run_at):
                return []  # another process or host fired it (or an edit moved it): its turn
            return self._enqueue_slots(conn, events, schedule, template, firing, now, refused)

        enqueued = self.jobs.write(fire_in)
        # Told once committed (app/writer.py: the work itself has no effect outside the
        # database).
        for reason in refused:
            log.warning("schedule %s: slot skipped, its job does not validate: %s",
                        schedule.name, reason)
        for slot, _job_id in enqueued:
            self.on_fired(schedule.name, max(0.0, (now - slot) / MICROS))
        return len(enqueued)

    def _enqueue_slots(self, conn: Connection, events: Events, schedule: Schedule,
                       template: dict[str, Any] | None, firing: Firing, now: int,
                       refused: list[str]) -> list[tuple[int, int]]:
        """Insert the firing's jobs on `conn`; the (slot, job id) of each one stored. Why a
        template no longer validates goes to `refused`."""
        if template is None:
            return []
        caller = _caller_of(schedule.name)
        stored: list[tuple[int, int]] = []
        for slot in firing.slots:
            try:
                new = new_job(self.jobs.intake, caller, template, None, now)
            except ValidationFailed as exc:
                # The template passed when it was saved; the configuration changed since (a
                # type no longer configured, a smaller payload limit).
                refused.append(exc.detail)
                break
            new = replace(new, values={**new.values, "schedule": schedule.name,
                                       "scheduled_for": slot})
            outcome = self.jobs.enqueue_in(conn, events, new, actor=schedule.actor)
            if outcome is not None:
                stored.append((slot, outcome.job.id))
        if stored:
            ScheduleRepository(conn).record_fired(schedule.name, stored[-1][0], stored[-1][1])
        return stored

    # -- rules ----------------------------------------------------------------------------

    def _cron(self, expression: str, timezone: str) -> Cron:
        try:
            zone = parse_zone(timezone)
        except CronError as exc:
            raise ValidationFailed(f"timezone: {exc}.", errors={"timezone": [f"{exc}."]}) from None
        try:
            return Cron(normalise_expression(expression, seconds=self.settings.allow_seconds),
                        zone)
        except CronError as exc:
            raise ValidationFailed(f"cron: {exc}.", errors={"cron": [f"{exc}."]}) from None

    def _checked_template(self, template: dict[str, Any], name: str, now: int) -> str:
        """The loaded template as stored, once it passes the rules of POST /jobs (the type
        configured, the payload's size). Raises ValidationFailed naming job.<field>."""
        stored = template_json(template)
        caller = _caller_of(name)
        try:
            new_job(self.jobs.intake, caller, template, None, now)
        except ValidationFailed as exc:
            raise ValidationFailed(
                exc.detail, errors={f"job.{field}": messages
                                    for field, messages in (exc.errors or {}).items()}) from None
        return stored

    def _loaded_template(self, schedule: Schedule) -> dict[str, Any] | None:
        try:
            loaded: dict[str, Any] = self._template.load(json.loads(schedule.job))
        except (ValueError, ValidationError):
            log.warning("schedule %s: its stored job template does not load; slot skipped",
                        schedule.name)
            return None
        return loaded

    @staticmethod
    def _require_name(name: str) -> None:
        # A name no schedule can have is answered without a query (PostgreSQL refuses text
        # holding NUL, say, with an error of its own).
        if not _NAME.match(name):
            raise NotFound("No such schedule.")


def _caller_of(name: str) -> Caller:
    """Who a schedule's jobs are enqueued as: its own producer, with an admin's reach (only
    admins create schedules)."""
    return Caller(name=producer_of(name), role=Role.ADMIN, max_priority=Priority.CRITICAL,
                  allowed_types=None)
