"""What a job's end does to the jobs waiting on it, in bounded steps.

Every transition that leaves jobs completed, failed or cancelled hands them here (through
JobsTx.after_transition). Their edges not yet applied are applied once each:
- a completed dependency, or a failed or cancelled one of a job that runs on failure
  (on_dependency_failure run), counts as finished: a waiting job with no unfinished
  dependency left becomes pending (RELEASE), claimable from its own run_at;
- a failed or cancelled dependency of a job that cancels on failure cancels it
  (DEPENDENCY_CANCEL), and that cancel is itself a dependency's end: the cascade goes on,
  level by level.

A step applies at most STEP_EDGES edges over at most STEP_LEVELS levels, so that no
transaction's size (nor, on SQLite, the time it holds the write lock) grows with the number
of dependents a producer stored. The end's own transaction takes the first step, which is
the whole cascade for nearly every graph; what is left is remembered (the ended jobs whose
edges are not all applied, with the status each ended with) and maintenance takes the next
steps (app/jobs/usecases/cascades.py). Between steps the promise holds: a dependent not reached yet
is still waiting, and a waiting job is never claimed; a dependent is released only once its
every edge is applied, so never while a dependency it needs is unfinished.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core.statuses import JobStatus
from app.jobs.domain.models import Job
from app.jobs.domain.transitions import Transition
from app.jobs.sql.dependency_repository import DependencyRepository
from app.jobs.sql.repository import JobRepository

# Records a transition made here: (transition, the jobs as it left them, when, each job's
# extra event detail by id).
Record = Callable[[Transition, list[Job], int, Mapping[int, Mapping[str, Any]]], None]

# One step of a cascade: the edges it applies, and the levels (jobs a cancel reached, whose
# own dependents follow) it goes down, at most. A step costs about what a retention batch
# does (app/jobs/usecases/retention.py): a few milliseconds of the write lock.
STEP_EDGES = 200
STEP_LEVELS = 16


@dataclass
class Settled:
    """What a step did: the jobs it released to pending, and the ended jobs (id: the status
    each ended with) whose edges it may not all have applied, for the next step."""

    released: list[Job] = field(default_factory=list)
    left: dict[int, str] = field(default_factory=dict)


def settle_dependents(jobs: JobRepository, dependencies: DependencyRepository,
                      ended: Mapping[int, str], now_us: int, clock: Callable[[], int],
                      record: Record, *, max_edges: int = STEP_EDGES,
                      max_levels: int = STEP_LEVELS) -> Settled:
    """Apply the end of the `ended` jobs (id: the status they ended with) to the jobs
    waiting on them, transitively, for one step. Its cost is that of the edges it applies,
    never of the dependents' other dependencies: the last of 100 dependencies to complete
    costs what the first did, plus its dependent's release."""
    settled = Settled()
    level = dict(ended)
    budget = max_edges
    for _depth in range(max_levels):
        if not level:
            return settled
        edges = dependencies.resolve_edges(list(level), budget)
        if not edges:
            return settled
        budget -= len(edges)
        cancel_cause: dict[int, tuple[int, str]] = {}
        counted: set[int] = set()
        for edge in edges:
            status = level[edge.depends_on_id]
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
        settled.released.extend(released)
        next_level = {job.id: job.status for job in cancelled}
        if budget <= 0:
            # This level may have edges left, and the next has not begun.
            settled.left = _with_edges_left(dependencies, {**level, **next_level})
            return settled
        level = next_level
    settled.left = _with_edges_left(dependencies, level)
    return settled


def _with_edges_left(dependencies: DependencyRepository,
                     ended: Mapping[int, str]) -> dict[int, str]:
    """Of these ended jobs, those with edges not applied yet: the cascade's next steps."""
    left = dependencies.with_edges_left(ended)
    return {job_id: status for job_id, status in ended.items() if job_id in left}
