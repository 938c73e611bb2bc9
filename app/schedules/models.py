"""The schedule record and the rule of a firing: which due slots enqueue a job (or, for a
workflow template, create a workflow: below, "enqueue" says both). Pure.

A slot is due once the clock reaches it. Only the newest due slot can be on time: a slot
that a newer one has overtaken, or one more than `grace` old (a tick, a busy database make
a slot late, not that late), was missed (no server process ran, or the database was down)
and follows the schedule's catch_up:
- latest: one job for the newest missed slot, the other missed slots skipped;
- none: every missed slot is skipped;
- all: every missed slot enqueues, oldest first, within the newest CATCH_UP.max due slots;
and the slot on time, if any, enqueues under each. So an every-second schedule back from a
minute's outage enqueues two jobs under latest (the newest missed slot, the current one) and
one under none, not one per second of the grace window. Either way the schedule moves on to
its first slot after now. A paused schedule is never fired (the due query leaves it out):
resumed, it fires at its next slot, never a backlog.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass

from app.core.limits import CATCH_UP, NAME_CHARS
from app.core.tracecontext import Trace
from app.schedules.cron import Cron

# The history's actor, and the producer of a schedule's jobs, is `schedule:<name>`. No key
# name holds a colon, so no producer ever sees (or collides with) a schedule's jobs.
ACTOR_PREFIX = "schedule:"
_PRODUCER_LENGTH = NAME_CHARS.max  # the jobs.producer column holds a key's name


class CatchUp(enum.StrEnum):
    LATEST = "latest"
    NONE = "none"
    ALL = "all"


@dataclass(frozen=True, slots=True)
class Schedule:
    """One row of the schedules table. Times are microseconds since the epoch."""

    name: str
    cron: str
    timezone: str
    job: str  # the template: compact JSON of a POST /jobs body, or {"workflow": <a POST
    # /workflows body>} (see app/schedules/schemas.py)
    catch_up: str
    paused: bool
    next_run_at: int
    last_run_at: int | None
    last_job_id: int | None  # of a workflow template: the first job of the slot's workflow
    created_at: int
    updated_at: int
    # The trace context of the request that created it (docs/TRACING.md; columns traceparent
    # and tracestate): every job it enqueues carries it. None: none was sent.
    trace: Trace | None = None
    # Not a column: the workflow last_job_id is part of, read with the schedule (see
    # ScheduleService); None for a job template.
    last_workflow_id: int | None = None

    @property
    def actor(self) -> str:
        return f"{ACTOR_PREFIX}{self.name}"

    @property
    def producer(self) -> str:
        return producer_of(self.name)


def producer_of(name: str) -> str:
    """The producer of a schedule's jobs: `schedule:<name>`, shortened with a digest of the
    name where it would not fit the producer column (one producer per schedule whatever the
    length of its name)."""
    producer = f"{ACTOR_PREFIX}{name}"
    if len(producer) <= _PRODUCER_LENGTH:
        return producer
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:16]
    keep = _PRODUCER_LENGTH - len(ACTOR_PREFIX) - len(digest) - 1
    return f"{ACTOR_PREFIX}{name[:keep]}~{digest}"


@dataclass(frozen=True)
class Firing:
    """What one firing does: enqueue a job for each of `slots` (oldest first), skip
    `skipped` due slots, and move the schedule's next_run_at to `next_run_at`."""

    slots: list[int]
    skipped: int
    next_run_at: int


def plan_firing(schedule: Schedule, cron: Cron, now_us: int, grace_us: int) -> Firing:
    """The firing of `schedule` at `now_us`, its next_run_at being due."""
    following = cron.next_after(schedule.next_run_at)
    if following > now_us:
        # The common firing: only next_run_at itself is due (one cron walk, not two).
        due, next_run_at = [schedule.next_run_at], following
    else:
        due = cron.slots_between(schedule.next_run_at, now_us, CATCH_UP.max)
        next_run_at = cron.next_after(now_us)
    if not due:
        return Firing([], 0, next_run_at)
    on_time = due[-1:] if now_us - due[-1] <= grace_us else []
    missed = due[:len(due) - len(on_time)]
    if schedule.catch_up == CatchUp.ALL:
        slots = due
    elif schedule.catch_up == CatchUp.LATEST:
        slots = missed[-1:] + on_time
    else:
        slots = on_time
    return Firing(slots, len(due) - len(slots), next_run_at)
