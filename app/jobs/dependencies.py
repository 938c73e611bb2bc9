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

# Records a transition made here: (transition, the jobs as it left them, when, each job's
# extra event detail by id).
Record = Callable[[Transition, list[Job], int, Mapping[int, Mapping[str, Any]]], None]


def settle_dependents(jobs: JobRepository, dependencies: DependencyRepository,
                      finished: Sequence[Job], now_us: int, clock: Callable[[], int],
                      record: Record) -> list[Job]:
    """Apply the end of the `finished` jobs to the jobs waiting on them, transitively;
    returns the jobs released to pending. Its cost is that of the edges it applies, never
    of the dependents' other dependencies: the last of 100 dependencies to complete costs
    what the first did, plus its dependent's release."""
    released_all: list[Job] = []
    level = list(finished)
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
        dependencies.lock_dependents(counted | set(cancel_cause))
        # The time read again now that the dependents are held: a lock waited for was held by
        # another dependency's end, which has committed since, stamped with its own time. The
        # release is stamped (and claimable from) no earlier than that, so that no attempt of
        # the dependent is ever recorded before a dependency's end.
        now_us = max(now_us, clock())

        # Only waiting jobs move (each statement says so): a dependent cancelled or released
        # already is left as it is.
        cancelled = jobs.apply_transition_to_many(
            Transition.DEPENDENCY_CANCEL, sorted(cancel_cause),
            Transition.DEPENDENCY_CANCEL.values(now_us=now_us))
        if cancelled:
            record(Transition.DEPENDENCY_CANCEL, cancelled, now_us, {
                job.id: {"dependency": cancel_cause[job.id][0],
                         "dependency_status": cancel_cause[job.id][1]} for job in cancelled})

        released = jobs.release_ready(counted - set(cancel_cause), now_us)
        if released:
            record(Transition.RELEASE, released, now_us, {})
        released_all.extend(released)
        level = cancelled
    return released_all
