"""A workflow as read: its jobs by ref and the status they add up to. No SQL, no HTTP."""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from app.core.statuses import REMOVED, UNFINISHED_STATUSES, JobStatus


class WorkflowStatus(enum.StrEnum):
    """A workflow's status, from its jobs' (docs/WORKFLOWS.md)."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


def workflow_status(counts: Mapping[str, int]) -> WorkflowStatus:
    """running while any job is unfinished; then failed if one failed, else cancelled if
    one was cancelled, else completed. A job retention removed had finished: it counts
    under REMOVED, its outcome no longer known, and the status is the remaining jobs'."""
    if any(counts.get(status.value) for status in UNFINISHED_STATUSES):
        return WorkflowStatus.RUNNING
    if counts.get(JobStatus.FAILED.value):
        return WorkflowStatus.FAILED
    if counts.get(JobStatus.CANCELLED.value):
        return WorkflowStatus.CANCELLED
    return WorkflowStatus.COMPLETED


def count_statuses(statuses: Iterable[str]) -> dict[str, int]:
    """How many jobs are in each status, every status named (0 for none), and how many
    retention removed (REMOVED)."""
    counted = Counter(statuses)
    return {name: counted.get(name, 0) for name in [*(s.value for s in JobStatus), REMOVED]}


@dataclass(frozen=True, slots=True)
class Workflow:
    """One row of workflows. Times are microseconds since the epoch."""

    id: int
    name: str | None
    producer: str
    idempotency_key: str | None
    request_fingerprint: str | None
    created_at: int


@dataclass(frozen=True, slots=True)
class WorkflowJob:
    """One job of a workflow, as its page and GET /workflows/{id} show it."""

    ref: str
    id: int
    type: str | None  # None once retention removed it (status REMOVED)
    status: str
    depends_on: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class WorkflowView:
    """A workflow with its status and counts; `jobs` in request order (None: not read, as
    in a listing)."""

    workflow: Workflow
    status: WorkflowStatus
    counts: dict[str, int]
    jobs: tuple[WorkflowJob, ...] | None = None

    @property
    def job_ids(self) -> dict[str, int]:
        return {job.ref: job.id for job in self.jobs or ()}
