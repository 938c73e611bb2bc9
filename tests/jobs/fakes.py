"""An in-memory unit of work for the job use cases (cosmicpython's FakeUnitOfWork): the rules
of enqueue and of the reports, tested without a database.

FakeJobs keeps what JobRepository keeps for the calls those use cases make: the unique
indexes (idempotency key, unique scope in its while statuses, schedule slot) refuse as the
database's do, and a transition applies only from its statuses and, for a worker's report,
under the worker's live lease. A transaction that raises leaves the store as it found it.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TypeVar

from app.core.clock import Clock
from app.core.errors import IdempotencyKeyTaken, SlotTaken, UniqueScopeHeld
from app.jobs.domain.models import Job, JobControls
from app.jobs.domain.transitions import Transition
from app.jobs.domain.uniqueness import holds_key_in
from app.jobs.sql.fail_repository import JobToEnd
from app.jobs.tx.key_rules import KeyRules, no_modes
from app.jobs.tx.uow import FINISHED, JobsTx

T = TypeVar("T")

_FIELDS = [field.name for field in dataclasses.fields(Job)]


class FakeJobs:
    """The jobs table and the JobRepository calls the enqueue and report use cases make."""

    def __init__(self, controls: FakeControls | None = None) -> None:
        self.rows: dict[int, Job] = {}
        self.next_id = 1
        # The job controls the statements read beside the row (a cancel request).
        self.controls = controls or FakeControls()

    # -- the unique indexes ---------------------------------------------------------------

    def _refusal(self, job: Job) -> Exception | None:
        for other in self.rows.values():
            if other.id == job.id or other.producer != job.producer:
                continue
            if (job.idempotency_key is not None
                    and other.idempotency_key == job.idempotency_key):
                return IdempotencyKeyTaken(job.idempotency_key)
            if (job.unique_scope is not None and other.unique_scope == job.unique_scope
                    and holds_key_in(job.unique_while, job.status)
                    and holds_key_in(other.unique_while, other.status)):
                return UniqueScopeHeld(job.unique_scope)
        for other in self.rows.values():
            if (other.id != job.id and job.schedule is not None
                    and (other.schedule, other.scheduled_for)
                    == (job.schedule, job.scheduled_for)):
                return SlotTaken(job.schedule)
        return None

    def _store(self, job: Job) -> Job:
        refused = self._refusal(job)
        if refused is not None:
            raise refused
        self.rows[job.id] = job
        return job

    # -- creating -------------------------------------------------------------------------

    def insert_job(self, values: Mapping[str, Any]) -> Job:
        job = Job(**{"id": self.next_id, **{name: values.get(name) for name in _FIELDS
                                            if name != "id"}})
        stored = self._store(job)
        self.next_id += 1
        return stored

    def insert_jobs(self, rows: Sequence[Mapping[str, Any]]) -> list[Job]:
        return [self.insert_job(values) for values in rows]

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        before = dict(self.rows), self.next_id
        try:
            yield
        except Exception:
            self.rows, self.next_id = before
            raise

    def lock_idempotency_keys(self, producer: str, keys: Collection[str]) -> None:
        pass  # one writer at a time here, as on SQLite

    # -- reading --------------------------------------------------------------------------

    def get_job(self, job_id: int, *, for_update: bool = False) -> Job | None:
        return self.rows.get(job_id)

    def find_by_idempotency_key(self, producer: str, idempotency_key: str) -> Job | None:
        return next((job for job in self.rows.values() if job.producer == producer
                     and job.idempotency_key == idempotency_key), None)

    def find_by_idempotency_keys(self, producer: str, keys: Collection[str]) -> dict[str, Job]:
        return {job.idempotency_key: job for job in self.rows.values()
                if job.producer == producer and job.idempotency_key in keys
                and job.idempotency_key is not None}

    def find_unique_holder(self, producer: str, unique_scope: str) -> Job | None:
        return self.find_unique_holders(producer, [unique_scope]).get(unique_scope)

    def find_unique_holders(self, producer: str, scopes: Collection[str]) -> dict[str, Job]:
        return {job.unique_scope: job for job in self.rows.values()
                if job.producer == producer and job.unique_scope in scopes
                and job.unique_scope is not None and holds_key_in(job.unique_while, job.status)}

    # -- transitions ----------------------------------------------------------------------

    def apply_transition(self, transition: Transition, job_id: int,
                         values: Mapping[str, Any], *, lease_token: str | None = None,
                         worker: str | None = None, now_us: int | None = None) -> Job | None:
        job = self.rows.get(job_id)
        if job is None or job.status not in transition.from_statuses:
            return None
        if transition.by_lease_holder:
            assert worker is not None and now_us is not None
            if (job.worker_id != worker or job.lease_expires_at is None
                    or job.lease_expires_at <= now_us):
                return None
        if lease_token is not None and job.lease_token != lease_token:
            return None
        if (transition is Transition.COMPLETE
                and self.controls.cancel_requested_by(job_id) is not None):
            return None
        return self._store(dataclasses.replace(job, **values))

    def extend_lease(self, job_id: int, values: Mapping[str, Any], *, worker: str,
                     now_us: int, lease_token: str | None) -> tuple[Job, JobControls] | None:
        job = self.rows.get(job_id)
        deadline = None if job is None else job.attempt_deadline
        lease = dict(values)
        progress = {name: lease.pop(name) for name in list(lease) if name not in _FIELDS}
        if deadline is not None:
            lease["lease_expires_at"] = min(lease["lease_expires_at"], deadline)
        beat = self.apply_transition(Transition.HEARTBEAT, job_id, lease,
                                     lease_token=lease_token, worker=worker, now_us=now_us)
        if beat is None:
            return None
        if progress:  # columns of the row beside the Job record's
            self.controls.rows[job_id] = dataclasses.replace(
                self.controls.rows.get(job_id, JobControls(job_id)), **progress)
        return beat, self.controls.rows.get(job_id, JobControls(job_id))

    # -- for the tests: a job as a claim leaves it ----------------------------------------

    def claimed(self, job_id: int, *, worker: str, now_us: int, lease_us: int,
                token: str) -> Job:
        job = self.rows[job_id]
        self.rows[job_id] = dataclasses.replace(job, **Transition.CLAIM.values(
            now_us=now_us, worker=worker, lease_expires_at=now_us + lease_us,
            lease_token=token))
        return self.rows[job_id]


class FakeTimeline:
    """The history recorder's calls, kept in order: (what, job ids, details)."""

    def __init__(self) -> None:
        self.told: list[tuple[str, list[int], dict[str, Any]]] = []

    def transition(self, transition: Transition, jobs: Sequence[Job], *, actor: str,
                   now_us: int, held_by: str | None = None,
                   details: Mapping[int, Mapping[str, Any]] | None = None,
                   before: Mapping[int, Job] | None = None,
                   current_attempts: Mapping[int, str | None] | None = None) -> None:
        self.told.append((transition.name.lower(), [job.id for job in jobs], {"actor": actor}))

    def enqueued(self, jobs: Sequence[Job], *, actor: str | None = None,
                 actors: Sequence[str] | None = None) -> None:
        self.told.append(("enqueued", [job.id for job in jobs], {"actor": actor}))

    def deduplicated(self, jobs: Sequence[Job], *, actor: str, now_us: int) -> None:
        self.told.append(("deduplicated", [job.id for job in jobs], {"actor": actor}))

    def delivered(self, job: Job, status: int, *, actor: str, now_us: int) -> None:
        self.told.append(("delivered", [job.id], {"status": status}))

    def report_refused(self, job: Job, *, worker: str, report: str, reason: str,
                       now_us: int) -> None:
        self.told.append(("report_refused", [job.id], {"report": report, "reason": reason}))

    def seen(self, name: str, now_us: int, *, claimed: bool, instance: str | None = None,
             jobs: int = 0) -> None:
        pass  # a worker's last sign of life: no rule hangs on it


class FakeControls:
    """The jobs' controls (cancel requests, progress) and checkpoints, by job id."""

    def __init__(self) -> None:
        self.rows: dict[int, JobControls] = {}
        self.checkpoints: dict[int, str] = {}

    def controls_of(self, job_ids: Collection[int]) -> dict[int, JobControls]:
        return {job_id: self.rows[job_id] for job_id in job_ids if job_id in self.rows}

    def cancel_requested_by(self, job_id: int) -> str | None:
        controls = self.rows.get(job_id)
        return None if controls is None else controls.cancel_requested_by

    def request_cancel(self, job_id: int, *, by: str, now_us: int) -> bool:
        if self.cancel_requested_by(job_id) is not None:
            return False
        self.rows[job_id] = dataclasses.replace(
            self.rows.get(job_id, JobControls(job_id)), cancel_requested_at=now_us,
            cancel_requested_by=by)
        return True

    def forget_cancel_requests(self, job_ids: Collection[int]) -> None:
        for job_id in job_ids:
            if job_id in self.rows:
                self.rows[job_id] = dataclasses.replace(
                    self.rows[job_id], cancel_requested_at=None, cancel_requested_by=None)

    def save_checkpoint(self, job_id: int, checkpoint: str, now_us: int) -> None:
        self.checkpoints[job_id] = checkpoint


class FakeDependencies:
    """A store without dependencies between jobs: no job's end concerns another."""

    def resolve_edges(self, finished_ids: Collection[int], limit: int) -> list[Any]:
        return []


class FakeFails:
    """The fail's read of the job it ends (FailRepository.job_to_end), on the fakes: no
    attempt is stored here."""

    def __init__(self, jobs: FakeJobs) -> None:
        self.jobs = jobs

    def job_to_end(self, job_id: int) -> JobToEnd | None:
        job = self.jobs.get_job(job_id, for_update=True)
        if job is None:
            return None
        return JobToEnd(job, self.jobs.controls.cancel_requested_by(job_id), None)


class FakeCompletes:
    """complete-many's one statement (CompleteManyRepository.complete_held) on the fakes:
    each item's job completed as a lone complete's statement would (no type has key modes
    here), every piece of work being a transaction."""

    def __init__(self, jobs: FakeJobs) -> None:
        self.jobs = jobs

    def complete_held(self, items: Sequence[tuple[int, str, str | None]], *, worker: str,
                      now_us: int, all_or_nothing: bool) -> list[Job]:
        assert not all_or_nothing
        done = []
        for job_id, token, result in items:
            row = self.jobs.rows.get(job_id)
            if row is None or row.has_dependents:
                continue
            job = self.jobs.apply_transition(
                Transition.COMPLETE, job_id,
                Transition.COMPLETE.values(now_us=now_us, result=result),
                lease_token=token, worker=worker, now_us=now_us)
            if job is not None:
                done.append(job)
        return sorted(done, key=lambda job: job.id)


class FakeTx(JobsTx):
    """A JobsTx on the fakes: `confirm` trusts every caller, `made` is the real one."""

    def __init__(self, jobs: FakeJobs, timeline: FakeTimeline) -> None:
        # No connection: nothing here may reach for one.
        self.conn = None  # type: ignore[assignment]
        self.events = Counter()
        self.jobs = jobs  # type: ignore[assignment]
        self.controls = jobs.controls  # type: ignore[assignment]
        self.fails = FakeFails(jobs)  # type: ignore[assignment]
        self.completes = FakeCompletes(jobs)  # type: ignore[assignment]
        self.timeline = timeline  # type: ignore[assignment]
        self.dependencies = FakeDependencies()  # type: ignore[assignment]
        self.clock = Clock()
        self._confirm_caller = lambda _conn, _caller: None
        # No type is fair or ordered here: the key rules never reach for their repository.
        self.keys = KeyRules(jobs, _NoKeyRepository(), no_modes,  # type: ignore[arg-type]
                             lambda *_recorded: None)

    def statement_of_its_own(self) -> AbstractContextManager[None]:
        return nullcontext()  # no connection, so nothing to tell apart

    @property
    def one_statement(self) -> bool:
        return False  # every piece of work is a transaction here

    def without_key_modes(self, job_type: str) -> bool:
        return True  # no type has key modes here


class _NoKeyRepository:
    conn = None


class FakeUnitOfWork:
    """UnitOfWork's run/read on the fakes. A transaction that raises is rolled back (the
    store as before it, its events and timeline entries dropped); `told` holds the events
    of the committed ones, in order, as the metrics would have been told them, and
    `finished` counts the jobs they finished."""

    def __init__(self) -> None:
        self.jobs = FakeJobs()
        self.timeline = FakeTimeline()
        self.told: list[tuple[str, int]] = []
        self.on_event: Callable[[str, int], None] = lambda name, count: self.told.append(
            (name, count))
        self.finished = 0  # jobs the committed transactions finished

    def run(self, work: Callable[[FakeTx], T]) -> T:
        rows, next_id = dict(self.jobs.rows), self.jobs.next_id
        controls = self.jobs.controls
        kept = dict(controls.rows), dict(controls.checkpoints)
        told = list(self.timeline.told)
        tx = FakeTx(self.jobs, self.timeline)
        try:
            result = work(tx)
        except Exception:
            self.jobs.rows, self.jobs.next_id = rows, next_id
            controls.rows, controls.checkpoints = kept
            self.timeline.told = told
            raise
        # As UnitOfWork.publish: FINISHED is a signal (it wakes waiting reads), no metric.
        self.finished += tx.events.pop(FINISHED, 0)
        for name, count in tx.events.items():
            if count:
                self.on_event(name, count)
        return result

    def run_statement(self, work: Callable[[FakeTx], T]) -> T:
        """As UnitOfWork.run_statement: for the fakes, a write as any other."""
        return self.run(work)

    def read(self, work: Callable[[FakeTx], T]) -> T:
        snapshot = copy.copy(self.jobs.rows)
        try:
            return work(FakeTx(self.jobs, self.timeline))
        finally:
            assert self.jobs.rows == snapshot, "a read changed the store"

    def write_alone(self, work: Callable[[FakeTx], T]) -> T:
        return self.run(work)

