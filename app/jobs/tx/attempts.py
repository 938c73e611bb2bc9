"""The end of a failed attempt (a worker's fail, a rescue of an expired lease), shared by the
reports and the claim."""

from __future__ import annotations

from typing import Any

from app.core.errors import UniqueScopeHeld
from app.jobs.domain.models import Job
from app.jobs.domain.transitions import Transition
from app.jobs.domain.uniqueness import holds_key_in
from app.jobs.sql.repository import JobRepository


def end_attempt(repo: JobRepository, transition: Transition, job: Job, values: dict[str, Any],
                *, worker: str | None = None, now_us: int | None = None) -> Job | None:
    """Apply a failed attempt's `values` (FAIL or RESCUE) to the running `job` (None if it
    changed).

    Under a while set without running, a job sent back to pending enters its while set
    again; when a twin enqueued meanwhile holds the key, this job lets go of it rather
    than have the worker's report refused: the twin stands for the work, and this job
    still runs its retry.
    """
    def move(changes: dict[str, Any]) -> Job | None:
        return repo.apply_transition(transition, job.id, changes, lease_token=job.lease_token,
                                     worker=worker, now_us=now_us)

    if not (holds_key_in(job.unique_while, values["status"])
            and not holds_key_in(job.unique_while, job.status)):
        return move(values)
    try:
        with repo.savepoint():
            return move(values)
    except UniqueScopeHeld:
        pass
    return move(values | {"unique_while": None})
