"""Reading a job's history: its attempts and its events, for the callers who may see them."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from app.core.callers import Caller, Role
from app.core.clock import MICROS, Clock
from app.core.errors import NotFound
from app.core.statuses import JobStatus
from app.history.explain import (
    Explanation,
    WorkerFacts,
    explain,
    flow_reasons,
    key_reasons,
    retry_budget_reasons,
)
from app.history.line import aging_interval_us, place_in_line
from app.jobs.domain.history import Attempt, JobEvent
from app.jobs.sql.dependency_repository import DependencyRepository
from app.jobs.sql.repository import JobRepository
from app.jobs.sql.wait_repository import WaitRepository
from app.jobs.timeline.instance_repository import InstanceRepository, InstanceRow
from app.jobs.timeline.instances import claimed_last_minute
from app.jobs.timeline.repository import HistoryRepository
from app.jobs.timeline.row_story import attempts_told, current_attempt, events_told
from app.jobs.usecases.service import JobService
from app.keys.service import KeyService
from app.storage.engine import Database
from app.types.repository import TypeRepository

# A timeline holds one event per change of the job and at most MAX_REFUSALS_KEPT refusals;
# an answer shows the newest this many all the same, so that none grows without bound (a job
# an admin retried and cancelled thousands of times).
MAX_EVENTS_SHOWN = 1000


# A key's instances shown: those seen within this long, and those holding jobs now; at
# most MAX_INSTANCES_SHOWN of them, the most recently seen.
INSTANCES_SHOWN_US = 3600 * MICROS
MAX_INSTANCES_SHOWN = 100


@dataclass(frozen=True, slots=True)
class WorkerInstance:
    """One instance of a worker key, by the label its worker sends (shown as reported): when
    it last claimed or heartbeat (to about a minute; None: not noted lately), the jobs its
    claims hold now, and the jobs it claimed in the latest whole minute counted."""

    label: str
    last_seen_at: int | None
    running: int
    claimed_per_minute: int


@dataclass(frozen=True, slots=True)
class Worker:
    """A live worker key: the types it may claim (None: every type), when it last claimed,
    heartbeat or reported and last claimed (to about a minute; None: never), how many
    jobs it holds, and its instances by label."""

    name: str
    types: frozenset[str] | None
    last_seen_at: int | None
    last_claim_at: int | None
    running: int
    instances: tuple[WorkerInstance, ...] = ()


def _instances_of(rows: list[InstanceRow], running: dict[str | None, int],
                  now_us: int) -> tuple[WorkerInstance, ...]:
    """A key's instances: its rows seen lately, and the labels its running jobs carry."""
    shown = {row.instance: WorkerInstance(
        row.instance, row.last_seen_at, running.get(row.instance, 0),
        claimed_last_minute(row.minute, row.claimed, now_us)) for row in rows}
    for label, count in running.items():
        if label is not None and label not in shown:
            shown[label] = WorkerInstance(label, None, count, 0)
    kept = sorted(shown.values(), key=lambda one: (one.running > 0, one.last_seen_at or 0),
                  reverse=True)[:MAX_INSTANCES_SHOWN]
    return tuple(sorted(kept, key=lambda one: one.label))


class HistoryService:
    def __init__(self, db: Database, clock: Clock, jobs: JobService, keys: KeyService, *,
                 ahead_limit: int, told_events: bool = True) -> None:
        self.db = db
        # Events are recorded (QUEUELOG_JOB_EVENTS): the rows' own are told with them.
        self.told_events = told_events
        self.clock = clock
        self.jobs = jobs
        self.keys = keys
        self.ahead_limit = ahead_limit  # QUEUELOG_EXPLAIN_AHEAD_LIMIT

    def workers(self, *, instances_shown: bool = True) -> list[Worker]:
        """Every live worker key, by name; with its instances unless `instances_shown` is
        false (explain's reasons need the keys alone)."""
        live = [key for key in self.keys.list_keys()
                if key.role == Role.WORKER and key.revoked_at is None]
        running: dict[str, dict[str | None, int]] = defaultdict(dict)
        for (name, label), count in self.jobs.running_by_worker().items():
            running[name][label] = count
        now = self.clock.now_us()
        instances: dict[str, list[InstanceRow]] = defaultdict(list)
        with self.db.read() as conn:
            activity = HistoryRepository(conn).activity()
            recent = (InstanceRepository(conn).seen_since(now - INSTANCES_SHOWN_US)
                      if instances_shown else [])
            for row in recent:
                instances[row.name].append(row)
        workers = []
        for key in sorted(live, key=lambda key: key.name):
            seen = activity.get(key.name)
            workers.append(Worker(
                name=key.name, types=key.allowed_types,
                last_seen_at=None if seen is None else seen.last_seen_at,
                last_claim_at=None if seen is None else seen.last_claim_at,
                running=sum(running[key.name].values()),
                instances=_instances_of(instances[key.name], running[key.name], now)
                if instances_shown else ()))
        return workers

    def attempts(self, caller: Caller, job_id: int) -> list[Attempt]:
        """The job's attempts, oldest first; NotFound when the caller may not see the job.
        Those stored, and the one its row holds (app/jobs/timeline/row_story.py)."""
        self.jobs.get_job(caller, job_id)
        with self.db.read() as conn:
            stored = HistoryRepository(conn).attempts_of(job_id)
            # The row after its history: a change in between (PostgreSQL reads each statement
            # afresh) then leaves an attempt out for a moment, never tells one twice.
            job = JobRepository(conn).get_job(job_id)
        return stored if job is None else attempts_told(job, stored)

    def events(self, caller: Caller, job_id: int) -> list[JobEvent]:
        """The job's events, oldest first; NotFound when the caller may not see the job.
        Those stored, and those its row tells (app/jobs/timeline/row_story.py) unless events
        are off (QUEUELOG_JOB_EVENTS=0)."""
        self.jobs.get_job(caller, job_id)
        with self.db.read() as conn:
            history = HistoryRepository(conn)
            stored = history.events_of(job_id, MAX_EVENTS_SHOWN)
            if not self.told_events:
                return stored
            current = current_attempt(history.attempts_of(job_id))
            job = JobRepository(conn).get_job(job_id)
        return stored if job is None else events_told(job, stored, current, MAX_EVENTS_SHOWN)

    def explain(self, caller: Caller, job_id: int) -> Explanation:
        """Why the job is or is not running; NotFound when the caller may not see it."""
        self.jobs.get_job(caller, job_id)
        workers = [WorkerFacts(worker.name, worker.types, worker.last_claim_at)
                   for worker in self.workers(instances_shown=False)]
        # A counting read (app/storage/engine.py): the jobs ahead are read up to the limit,
        # and the flow reasons count what runs, so it takes a slot of the budget kept for such
        # reads.
        with self.db.counting_read() as conn:
            job = JobRepository(conn).get_job(job_id)
            if job is None:  # purged in between
                raise NotFound("No such job.")
            now = self.clock.now_us()
            settings = TypeRepository(conn).settings_of([job.type]).get(job.type)
            ahead = ahead_of_type = None
            if job.status == JobStatus.PENDING and job.run_at <= now:
                repo = JobRepository(conn)
                ahead = repo.count_claimable_ahead(job, now, same_type=False,
                                                   cap=self.ahead_limit)
                ahead_of_type = repo.count_claimable_ahead(
                    job, now, same_type=True, cap=self.ahead_limit,
                    aging_us=aging_interval_us(settings))
            flow = flow_reasons(conn, job, now) if job.status == JobStatus.PENDING else []
            waiting_on = ([dep_id for dep_id, _cancel, resolved in DependencyRepository(conn)
                           .dependencies_of([job.id]).get(job.id, []) if not resolved]
                          if job.status == JobStatus.WAITING else [])
            keyed = key_reasons(conn, job, now, self.ahead_limit,
                                sees_every_producer=caller.is_admin)
            waiting_for = (WaitRepository(conn).waiting_for([job.id]).get(job.id)
                           if job.status == JobStatus.SUSPENDED else None)
            budget = retry_budget_reasons(conn, job, now)
            place = place_in_line(conn, job, now, settings)
        # Other keys' names are an admin's to see; a producer is told its own job's facts.
        explanation = explain(job, now, ahead=ahead, ahead_of_type=ahead_of_type,
                              workers=workers, flow=flow, names_workers=caller.is_admin,
                              waiting_on=waiting_on, keyed=keyed, waiting_for=waiting_for,
                              budget=budget)
        return replace(explanation, place=place)
