"""Reading jobs: one (now, or once it has finished), a page of them, what each worker holds;
each as the caller may see it."""

from __future__ import annotations

import time
from collections.abc import Collection

from app.core.callers import Caller, Role
from app.core.clock import Clock
from app.core.errors import NotFound
from app.core.statuses import TERMINAL_STATUSES, JobStatus
from app.jobs.domain.cursor import decode_cursor, encode_cursor
from app.jobs.domain.models import Job, JobDependencies, JobExtras
from app.jobs.tx.uow import JobsTx, JobsUnitOfWork
from app.jobs.wake.waiting import JobSignal, WaitAnswer, WaitingBudget


def visible_to(caller: Caller, job: Job) -> bool:
    """An admin sees every job, a producer the jobs it enqueued, a worker those it holds or
    held last."""
    if caller.role is Role.ADMIN:
        return True
    if caller.role is Role.PRODUCER:
        return job.producer == caller.name
    return job.worker_id == caller.name


class JobReads:
    """`finished` is told when a job of this process may have finished (the unit of work's
    FINISHED signal); `result_waits` bounds the reads waiting for one at once."""

    def __init__(self, uow: JobsUnitOfWork, clock: Clock, finished: JobSignal,
                 result_waits: WaitingBudget) -> None:
        self.uow = uow
        self.clock = clock
        self.finished = finished
        self._result_waits = result_waits

    def get_job(self, caller: Caller, job_id: int) -> Job:
        """The job, if the caller may see it; NotFound otherwise (the two look alike)."""
        return self._read_visible(caller, job_id)

    def await_job(self, caller: Caller, job_id: int, wait_seconds: float) -> WaitAnswer[Job]:
        """The job as get_job reads it, once it is finished or `wait_seconds` have passed.

        An unfinished job is read again as soon as a job finishes in this process, or in
        another that tells it (app/jobs/wake/waiting.py), and every `peek_seconds` otherwise,
        until it is completed, failed or cancelled or the time is up (or the process stops);
        then it is answered as it is. Past
        the process's budget of waiting requests it is answered at once, marked `not_waited`.
        """
        if wait_seconds <= 0:
            return WaitAnswer(self._read_visible(caller, job_id))
        with self.finished.watching():
            self.finished.before_wait()
            seen = self.finished.generation
            job = self._read_visible(caller, job_id)
            if job.status in TERMINAL_STATUSES:
                return WaitAnswer(job)
            with self._result_waits.slot() as granted:
                deadline = time.monotonic() + wait_seconds
                while (granted and job.status not in TERMINAL_STATUSES
                       and not self.finished.waits_ended
                       and (remaining := deadline - time.monotonic()) > 0):
                    self.finished.wait(seen, timeout=min(self.finished.peek_seconds, remaining))
                    seen = self.finished.generation
                    job = self._read_visible(caller, job_id)
        return WaitAnswer(job, not_waited=not granted)

    def _read_visible(self, caller: Caller, job_id: int) -> Job:
        job = self.uow.read(lambda tx: tx.jobs_for(caller).get_job(job_id))
        if job is None or not visible_to(caller, job):
            raise NotFound("No such job.")
        return job

    def extras_of(self, jobs: list[Job]) -> JobExtras:
        """What these jobs' representations show beside their rows (dependencies, controls,
        tags, trace context), in one read transaction: a page costs one, not four."""
        if not jobs:
            return JobExtras({}, {}, {}, {})
        ids = [job.id for job in jobs]
        ran = _ran(jobs)

        suspended = [job.id for job in jobs if job.status == JobStatus.SUSPENDED]

        def read(tx: JobsTx) -> JobExtras:
            return JobExtras(_dependencies(tx, ids),
                             tx.controls.controls_of(ran) if ran else {},
                             tx.context.tags_of(ids), tx.context.traces_of(ids),
                             tx.waits.waiting_for(suspended) if suspended else {})

        return self.uow.read(read)

    def dependencies_shown(self, caller: Caller, job_id: int) -> list[tuple[int, Job | None]]:
        """The jobs `job_id` depends on, in depends_on order, for the worker holding it (or
        that held it last), its producer and admins; NotFound otherwise. Each is (its id, the
        job), the job None when retention has removed it since: every entry of depends_on
        stays, so a handler unpacking them by position keeps working."""
        job = self._read_visible(caller, job_id)

        def read(tx: JobsTx) -> list[tuple[int, Job | None]]:
            edges = tx.dependencies.dependencies_of([job.id]).get(job.id, [])
            return [(dep_id, tx.jobs.get_job(dep_id)) for dep_id, _cancel, _resolved in edges]

        return self.uow.read(read)

    def running_by_worker(self) -> dict[tuple[str, str | None], int]:
        """How many jobs each worker holds now, by the worker's name and the instance label
        its claims sent (None: none)."""
        return self.uow.read(lambda tx: tx.jobs.count_running_by_worker())

    def list_jobs(self, caller: Caller, *, status: str | None, job_type: str | None,
                  limit: int, cursor: str | None, producer: str | None = None,
                  newest_first: bool = False, backward: bool = False,
                  scheduled: bool = False, tag: str | None = None,
                  failure_groups: Collection[tuple[str, str]] | None = None
                  ) -> tuple[list[Job], str | None]:
        """A page of the jobs the caller may see, by id, and the cursor of the next page.
        `producer` narrows an admin's listing to one producer's jobs (a producer sees only
        its own whatever it asks). `newest_first` lists by id downwards; `backward` gives the
        page before `cursor` (in the listing's order) and the cursor of the one before that;
        `scheduled` keeps the pending jobs whose run_at is still ahead; `tag` the jobs
        carrying it (through its index, ix_job_tags_tag_job_id); `failure_groups` ((type,
        fingerprint) pairs) the jobs with an attempt in one of them (through the attempts'
        fingerprint index)."""
        after_id = decode_cursor(cursor) if cursor is not None else 0
        # A page backwards is read forwards in the other order, then turned round.
        descending = newest_first != backward
        page = self.uow.read(lambda tx: tx.jobs_for(caller).list_jobs(
                after_id=after_id,
                limit=limit + 1,
                producer=caller.name if caller.role is Role.PRODUCER else producer,
                worker=caller.name if caller.role is Role.WORKER else None,
                status=JobStatus.PENDING.value if scheduled else status,
                job_type=job_type,
                run_after=self.clock.now_us() if scheduled else None,
                descending=descending,
                tag=tag,
                failure_groups=failure_groups,
            ))
        more = len(page) > limit
        page = page[:limit]
        following = encode_cursor(page[-1].id) if more else None
        if backward:
            page.reverse()
        return page, following


def _ran(jobs: list[Job]) -> list[int]:
    """The jobs that may have controls: only a job in (or after) an attempt does, which its
    claimed_at or retry_count says (an admin's retry starts it afresh)."""
    return [job.id for job in jobs if job.claimed_at is not None or job.retry_count > 0]


def _dependencies(tx: JobsTx, job_ids: list[int]) -> dict[int, JobDependencies]:
    found = tx.dependencies.dependencies_of(job_ids)
    return {job_id: JobDependencies(
                tuple(dep_id for dep_id, _cancel, _resolved in edges),
                sum(1 for _id, _cancel, resolved in edges if not resolved),
                edges[0][1])
            for job_id, edges in found.items()}
