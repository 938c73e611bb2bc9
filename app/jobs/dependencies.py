"""What a job's end does to the jobs waiting on it, in the transaction of that end.

Every transition that leaves jobs completed, failed or cancelled hands them here (through
JobsTx.made). Their edges not yet applied are applied once each:
- a completed dependency, or a failed or cancelled one of a job that runs on failure
  (on_dependency_failure run), counts as finished: a waiting job with no unfinished
  dependency left becomes pending (RELEASE), claimable from its own run_at;
- a failed or cancelled dependency of a job that cancels on failure cancels it
  (DEPENDENCY_CANCEL), and that cancel is itself a dependency's end: the cascade goes on,
  level by level, in the same transaction, until no job is left to settle.

So no job is ever left waiting on a finished dependency, nor claimable while one of its
dependencies is unfinished, at any commit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from app.core.statuses import JobStatus
from app.jobs.dependency_repository import DependencyRepository
from app.jobs.models import Job
from app.jobs.repository import JobRepository
from app.jobs.transitions import Transition

# Records a transition made here: (transition, the jobs as it left them, each job's extra
# event detail by id).
Record = Callable[[Transition, list[Job], Mapping[int, Mapping[str, Any]]], None]


def settle_dependents(jobs: JobRepository, dependencies: DependencyRepository,
                      finished: Sequence[Job], now_us: int, record: Record) -> list[Job]:
    """Apply the end of the `finished` jobs to the jobs waiting on them, transitively;
    returns the jobs released to pending."""
    released_all: list[Job] = []
    level = [job for job in finished]
    while level:
        status_of = {job.id: job.status for job in level}
        edges = dependencies.resolve_edges(list(status_of))
        if not edges:
            break
        cancel_cause: dict[int, tuple[int, str]] = {}
        counted: set[int] = set()
        for edge in edges:
            status = status_of[edge.depends_on_id]
            if status != JobStatus.COMPLETED and edge.cancel_on_failure:
                cancel_cause.setdefault(edge.job_id, (edge.depends_on_id, status))
            else:
                counted.add(edge.job_id)
        waiting = set(dependencies.lock_waiting(counted | set(cancel_cause)))

        to_cancel = sorted(waiting & set(cancel_cause))
        cancelled = jobs.apply_transition_to_many(
            Transition.DEPENDENCY_CANCEL, to_cancel,
            Transition.DEPENDENCY_CANCEL.values(now_us=now_us))
        record(Transition.DEPENDENCY_CANCEL, cancelled, {
            job.id: {"dependency": cancel_cause[job.id][0],
                     "dependency_status": cancel_cause[job.id][1]} for job in cancelled})

        candidates = (waiting & counted) - set(cancel_cause)
        unfinished = dependencies.still_waiting_on(candidates)
        ready = sorted(candidates - set(unfinished))
        released = jobs.apply_transition_to_many(Transition.RELEASE, ready,
                                                 Transition.RELEASE.values(now_us=now_us))
        record(Transition.RELEASE, released, {})
        released_all.extend(released)
        level = cancelled
    return released_all
