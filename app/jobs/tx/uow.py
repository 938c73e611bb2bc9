"""The job use cases' unit of work: the transaction's repositories, and what a transition
entails besides its UPDATE.

app/storage/uow.py runs the work; this module says what a job transaction holds (`bind_jobs`
builds it on the transaction's connection) and counts, in `JobsTx.after_transition`, what every
transition made records and tells once committed.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection

from app.core.callers import Caller
from app.core.clock import Clock
from app.core.statuses import TERMINAL_STATUSES
from app.jobs.domain.history import SERVICE_ACTOR
from app.jobs.domain.models import Job
from app.jobs.domain.transitions import Transition
from app.jobs.sql.complete_many import CompleteManyRepository
from app.jobs.sql.context_repository import JobContextRepository
from app.jobs.sql.control_repository import ControlRepository
from app.jobs.sql.dependency_repository import DependencyRepository
from app.jobs.sql.fail_repository import FailRepository
from app.jobs.sql.key_repository import KeyRepository
from app.jobs.sql.repository import JobRepository
from app.jobs.sql.reservation_repository import ReservationRepository
from app.jobs.sql.wait_repository import WaitRepository
from app.jobs.timeline.failure_repository import FailureRepository
from app.jobs.timeline.instance_repository import InstanceRepository
from app.jobs.timeline.recorder import FailHistory, HistoryRecorder
from app.jobs.timeline.repository import HistoryRepository
from app.jobs.timeline.stats_buffer import StatsBuffer
from app.jobs.timeline.stats_repository import CountKey, minute_of
from app.jobs.tx.dependencies import settle_dependents
from app.jobs.tx.key_rules import KeyRules, ModeSource, PlainType, never_plain, no_modes
from app.keys.repository import KeyToConfirm
from app.storage.uow import Transaction, UnitOfWork

# Not a metric event: the count of jobs a transaction left completed, failed or cancelled,
# which wakes the reads waiting for a job to finish once it has committed (a signal of the
# unit of work).
FINISHED = "finished"
# Likewise: jobs that became claimable other than by an enqueue (a waiting job released by
# its last dependency's end), which wakes this process's waiting claims.
CLAIMABLE = "claimable"
# Likewise: a job's end left edges to apply (app/jobs/tx/dependencies.py), which the cascade's
# next steps, in transactions of their own, apply once this one has committed.
CASCADE_LEFT = "cascade_left"

# Confirms, inside a transaction, that the caller's key is still live (raises otherwise).
CallerCheck = Callable[[Connection, Caller], None]


def trust_caller(_conn: Connection, _caller: Caller) -> None:
    pass


class Timeline:
    """The job's history (app/jobs/timeline/recorder.py) written on one transaction's connection."""

    def __init__(self, recorder: HistoryRecorder, conn: Connection) -> None:
        self._recorder = recorder
        self._conn = conn
        # What the transaction's changes add to the minute's stats, handed over once it has
        # committed (JobsTx.committed).
        self.counts: Counter[CountKey] = Counter()

    def transition(self, transition: Transition, jobs: Sequence[Job], *, actor: str,
                   now_us: int, held_by: str | None = None,
                   details: Mapping[int, Mapping[str, Any]] | None = None,
                   before: Mapping[int, Job] | None = None,
                   current_attempts: Mapping[int, str | None] | None = None) -> None:
        self._recorder.transition(self._conn, transition, jobs, actor=actor, now_us=now_us,
                                  held_by=held_by, details=details, counts=self.counts,
                                  before=before, current_attempts=current_attempts)

    def enqueued(self, jobs: Sequence[Job], *, actor: str | None = None,
                 actors: Sequence[str] | None = None) -> None:
        self._recorder.enqueued(self._conn, jobs, actor=actor, actors=actors,
                                counts=self.counts)

    def deduplicated(self, jobs: Sequence[Job], *, actor: str, now_us: int) -> None:
        self._recorder.deduplicated(self._conn, jobs, actor=actor, now_us=now_us)

    def delivered(self, job: Job, status: int, *, actor: str, now_us: int) -> None:
        self._recorder.delivered(self._conn, job, status, actor=actor, now_us=now_us)

    def cancel_requested(self, job: Job, *, actor: str, now_us: int) -> None:
        self._recorder.cancel_requested(self._conn, job, actor=actor, now_us=now_us)

    def report_refused(self, job: Job, *, worker: str, report: str, reason: str,
                       now_us: int) -> None:
        self._recorder.report_refused(self._conn, job, worker=worker, report=report,
                                      reason=reason, now_us=now_us)

    def seen(self, name: str, now_us: int, *, claimed: bool, instance: str | None = None,
             jobs: int = 0) -> None:
        self._recorder.seen(self._conn, name, now_us, claimed=claimed, instance=instance,
                            jobs=jobs)

    def counted(self, transition: Transition, jobs: Sequence[Job], *, now_us: int) -> None:
        self._recorder.counted(self._conn, transition, jobs, now_us=now_us, counts=self.counts)

    def fail_history(self, error: str) -> FailHistory:
        return self._recorder.fail_history(error)


class JobsTx(Transaction):
    """A job transaction: `jobs` (JobRepository), `completes` (complete-many's one
    statement), `dependencies` (DependencyRepository),
    `controls` (ControlRepository: running jobs' cancel requests, progress, checkpoints),
    `reservations` (ReservationRepository: reserved jobs),
    `failures` (FailureRepository: failure groups),
    `instances` (InstanceRepository: worker keys' instances),
    `context` (JobContextRepository: jobs' tags and trace context),
    `waits` (WaitRepository: suspended jobs' waits and posted events),
    `keys` (the rules of fair and ordered keys, app/jobs/tx/key_rules.py), `history`
    (HistoryRepository) and `timeline` (the history recorder), all on the transaction's one
    connection."""

    def __init__(self, conn: Connection, recorder: HistoryRecorder,
                 confirm_caller: CallerCheck, clock: Clock | None = None,
                 key_modes: ModeSource = no_modes, plain: PlainType = never_plain,
                 stats: StatsBuffer | None = None) -> None:
        super().__init__(conn)
        # Read again once a transaction holds the rows it waited for (a dependents' release).
        self.clock = clock or Clock()
        self._recorder = recorder
        self._key_modes = key_modes
        self._plain = plain
        self._confirm_caller = confirm_caller
        self._stats = stats

    # Each built when first used: on SQLite a transaction is built inside the write lock
    # (app/storage/group_commit.py), where a repository no step uses would cost every writer.

    @functools.cached_property
    def jobs(self) -> JobRepository:
        return JobRepository(self.conn)

    @functools.cached_property
    def fails(self) -> FailRepository:
        return FailRepository(self.jobs)

    @functools.cached_property
    def completes(self) -> CompleteManyRepository:
        return CompleteManyRepository(self.jobs)

    @functools.cached_property
    def dependencies(self) -> DependencyRepository:
        return DependencyRepository(self.conn)

    @functools.cached_property
    def controls(self) -> ControlRepository:
        return ControlRepository(self.conn)

    @functools.cached_property
    def reservations(self) -> ReservationRepository:
        return ReservationRepository(self.conn)

    @functools.cached_property
    def history(self) -> HistoryRepository:
        return HistoryRepository(self.conn)

    @functools.cached_property
    def instances(self) -> InstanceRepository:
        return InstanceRepository(self.conn)

    @functools.cached_property
    def failures(self) -> FailureRepository:
        return FailureRepository(self.conn)

    @functools.cached_property
    def context(self) -> JobContextRepository:
        return JobContextRepository(self.conn)

    @functools.cached_property
    def waits(self) -> WaitRepository:
        return WaitRepository(self.conn)

    @functools.cached_property
    def timeline(self) -> Timeline:
        return Timeline(self._recorder, self.conn)

    @functools.cached_property
    def keys(self) -> KeyRules:
        return KeyRules(self.jobs, KeyRepository(self.conn), self._key_modes,
                        lambda made, changed, at, extra: self._record(
                            made, changed, actor=SERVICE_ACTOR, now_us=at, details=extra),
                        self._plain)

    def join_keys(self, new: Sequence[Job], now_us: int) -> list[Job]:
        """Jobs this transaction just inserted, before their enqueue is recorded: their
        ordered key's turn (or held back behind it) and their fair round. Returns them as
        they are now."""
        return self.keys.join_keys(new, now_us)

    def before_commit(self) -> None:
        """Confirm the caller's key if no statement of the step did (jobs_confirming): a
        revoked key changes nothing, even on a request already under way."""
        key = self.jobs.key_to_confirm
        if key is not None:
            self.jobs.key_to_confirm = None
            key.confirm()

    def committed(self) -> None:
        """Hand the stats this work counted (docs/OPERATIONS.md) to the process, which writes
        them within a second (app/jobs/timeline/stats_buffer.py): in the minute the clock
        reads at the commit, and only once committed (`isolated` takes a failed block's
        counts back)."""
        if self._stats is not None and self.timeline.counts:
            self._stats.add(minute_of(self.clock.now_us()), self.timeline.counts)

    def confirm(self, caller: Caller) -> None:
        """Raise unless the caller's key is still live, in this transaction: a revoked key
        changes nothing, even on a request already under way."""
        self._confirm_caller(self.conn, caller)

    @contextmanager
    def isolated(self) -> Iterator[None]:
        """Run the block in a savepoint: should it fail, what it wrote and counted is undone
        and the transaction goes on (a sweep's failure is no claim's)."""
        events, counts = Counter(self.events), Counter(self.timeline.counts)
        try:
            with self.conn.begin_nested():
                yield
        except Exception:
            self.events.clear()
            self.events.update(events)
            self.timeline.counts.clear()
            self.timeline.counts.update(counts)
            raise

    def jobs_for(self, caller: Caller) -> JobRepository:
        """The job repository, once the caller's key is confirmed live (see confirm)."""
        self.confirm(caller)
        return self.jobs

    def without_key_modes(self, job_type: str) -> bool:
        """Whether this process's copy of the type settings shows `job_type` with no key
        modes (app/types/settings_copy.py): a keyless job of it touches no key's rows."""
        return self._plain(job_type)

    def jobs_confirming(self, caller: Caller) -> JobRepository:
        """The job repository, the caller's key to be confirmed live by the step's own
        statement rather than by one of its own: the next of its statements that folds the
        key in (app/keys/repository.py, KeyToConfirm) changes nothing for a revoked key, and
        if it changes nothing, asks why (Unauthorized when the key is revoked). Use it only
        where that statement is the step's first change; a step that runs none confirms the
        key before its commit. A revoked key changes nothing, as with confirm."""
        if not caller.live_checked and not caller.internal:
            def found_live() -> None:
                caller.live_checked = True

            self.jobs.key_to_confirm = KeyToConfirm(
                caller.token_digest, lambda: self.confirm(caller), found_live)
        return self.jobs

    def after_transition(self, transition: Transition, jobs: list[Job], *, actor: str, now_us: int,
             held_by: str | None = None,
             details: Mapping[int, Mapping[str, Any]] | None = None,
             before: Mapping[int, Job] | None = None,
             current_attempts: Mapping[int, str | None] | None = None,
             whole_in_statement: bool = False) -> None:
        """Called in the transaction of every transition made, with the jobs as it left
        them: what a transition entails besides its UPDATE — the job's history (its attempts
        and events), the events counted for metrics, and for the jobs it finished, what
        their end does to the jobs waiting on them (app/jobs/tx/dependencies.py). `actor` is
        who made it; `held_by` the worker whose lease a rescue took back; `details` extra
        event detail by job id; `before`, by job id, the rows as they were before an
        attempt's end that clears its claim (the history keeps it); `current_attempts`, by
        job id, the outcome of its stored current attempt as read with that row (None: none
        stored; app/jobs/timeline/recorder.py). `whole_in_statement`: the transition's own
        statement did all it entails, its history written and no dependents, key or fair
        round to see to (app/jobs/sql/fail_repository.py): it is only counted."""
        self._record(transition, jobs, actor=actor, now_us=now_us, held_by=held_by,
                     details=details, before=before, current_attempts=current_attempts,
                     history_written=whole_in_statement)
        if whole_in_statement:
            return
        moves: list[tuple[Transition, Sequence[Job]]] = [(transition, jobs)]
        # Only a job some edge waits on has dependents to settle: the end of any other sends
        # nothing about dependencies.
        finished = {job.id: job.status for job in jobs
                    if job.status in TERMINAL_STATUSES and job.has_dependents}
        if finished:
            self._settle(finished, now_us, moves)
        # Their keys' turns and rounds (app/jobs/tx/key_rules.py), the cascade's moves included.
        self.events[CLAIMABLE] += len(self.keys.after(moves, now_us))

    def go_on_with_cascades(self, limit: int, now_us: int) -> int:
        """The next step of up to `limit` cascades under way (app/jobs/tx/dependencies.py):
        their jobs' edges left, applied as the jobs' end would have; returns how many
        cascades it took (0: none is under way, or another process holds them)."""
        ended = self.dependencies.take_cascades(limit)
        if not ended:
            return 0
        moves: list[tuple[Transition, Sequence[Job]]] = []
        left = self._settle(ended, now_us, moves)
        self.dependencies.forget_cascades([job_id for job_id in ended if job_id not in left])
        self.events[CLAIMABLE] += len(self.keys.after(moves, now_us))
        return len(ended)

    def _settle(self, ended: Mapping[int, str], now_us: int,
                moves: list[tuple[Transition, Sequence[Job]]]) -> dict[int, str]:
        """One step of what these jobs' end (id: the status each ended with) does to the
        jobs waiting on them; the cascade's moves are added to `moves`, and what it left is
        remembered for the next steps (and returned)."""

        def record(made: Transition, changed: list[Job], at: int,
                   extra: Mapping[int, Mapping[str, Any]]) -> None:
            moves.append((made, changed))
            self._record(made, changed, actor=SERVICE_ACTOR, now_us=at, details=extra)

        settled = settle_dependents(self.jobs, self.dependencies, ended, now_us,
                                    self.clock.now_us, record)
        self.events[CLAIMABLE] += len(settled.released)
        if settled.left:
            self.dependencies.queue_cascades(settled.left, now_us)
            self.events[CASCADE_LEFT] += 1
        return settled.left

    def _record(self, transition: Transition, jobs: list[Job], *, actor: str, now_us: int,
                held_by: str | None = None,
                details: Mapping[int, Mapping[str, Any]] | None = None,
                before: Mapping[int, Job] | None = None,
                current_attempts: Mapping[int, str | None] | None = None,
                history_written: bool = False) -> None:
        if not jobs:
            return
        if history_written:
            self.timeline.counted(transition, jobs, now_us=now_us)
        else:
            self.timeline.transition(transition, jobs, actor=actor, now_us=now_us,
                                     held_by=held_by, details=details, before=before,
                                     current_attempts=current_attempts)
        events = self.events
        # Not a metric: wakes the reads waiting for a job to finish (GET ?wait_seconds).
        events[FINISHED] += sum(1 for job in jobs if job.status in TERMINAL_STATUSES)
        transition.count_metrics(jobs, events)


JobsUnitOfWork = UnitOfWork[JobsTx]


def bind_jobs(recorder: HistoryRecorder, confirm_caller: CallerCheck = trust_caller,
              clock: Clock | None = None, key_modes: ModeSource = no_modes,
              plain: PlainType = never_plain,
              stats: StatsBuffer | None = None) -> Callable[[Connection], JobsTx]:
    """The factory app/storage/uow.py builds each job transaction with; `key_modes` reads
    which types are fair or ordered (app/types), `plain` says which types this process's
    copy of the settings shows without key modes (app/jobs/tx/key_rules.py); `stats` keeps the
    committed transactions' counts (without: they are not kept)."""
    return lambda conn: JobsTx(conn, recorder, confirm_caller, clock, key_modes, plain, stats)
