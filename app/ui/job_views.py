"""What the dashboard's pages show of jobs, their events and what was done to them: the dicts
and sentences the templates read (app/ui/routes.py asks; nothing here reads a request or the
database)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.core.clock import to_rfc3339
from app.core.statuses import TERMINAL_STATUSES, JobStatus
from app.core.tracecontext import Trace
from app.jobs.domain.models import Job, JobControls, JobDependencies
from app.jobs.sql.key_repository import KeyTurn
from app.jobs.usecases.admin import Cancelled
from app.jobs.usecases.horizon_watch import HorizonReport, what_to_do
from app.jobs.web.answers import represent
from app.ui.present import duration, utc


def horizon_shown(report: HorizonReport) -> dict[str, Any]:
    """The xmin horizon's holders, every one, once any has held it past the threshold
    (QUEUELOG_HORIZON_WARN_SECONDS); none otherwise: a snapshot held for a moment is every
    transaction's, and nothing to act on."""
    if not report.past_threshold():
        return {"horizon_holders": []}
    return {"horizon_holders": [(holder, to_rfc3339(holder.since_us), what_to_do(holder))
                                for holder in report.holders],
            "horizon_threshold": report.threshold_seconds}


def oldest_claimable(types: Sequence[Mapping[str, Any]]) -> tuple[float, str] | None:
    """The oldest claimable job's age across the types (as GET /types shows them) and its
    type; None when none is. A paused type's jobs are not claimable, whatever their age:
    left out."""
    ages = [(shown["oldest_claimable_age_seconds"], shown["type"]) for shown in types
            if not shown["paused"] and shown["oldest_claimable_age_seconds"] is not None]
    return max(ages, key=lambda age: age[0], default=None)


def oldest_claimable_text(types: Sequence[Mapping[str, Any]]) -> str:
    """The overview's oldest claimable job, as its page and its live figure write it:
    `3 min (email)`, or `none`."""
    oldest = oldest_claimable(types)
    return "none" if oldest is None else f"{duration(oldest[0])} ({oldest[1]})"


def blocked_shown(turn: KeyTurn) -> dict[str, Any]:
    return {"type": turn.type, "concurrency_key": turn.concurrency_key, "job_id": turn.job_id,
            "since": to_rfc3339(turn.since)}


def cancel_request(shown: dict[str, Any], controls: JobControls | None
                    ) -> dict[str, Any] | None:
    """Who asked a running job's cancel and when; None when none is pending. A request
    that outlived its job (a complete raced it) is moot, as the API's cancel_requested says."""
    if not shown.get("cancel_requested") or controls is None:
        return None
    return {"by": controls.cancel_requested_by,
            "at": to_rfc3339(controls.cancel_requested_at)}


def attempt_deadline(job: Job) -> str | None:
    """When the running attempt is over (its claim plus timeout_seconds); None otherwise."""
    if job.status != JobStatus.RUNNING:
        return None
    return to_rfc3339(job.attempt_deadline)


def event_shown(event: dict[str, Any], error: str | None) -> dict[str, Any]:
    # The error the page shows at its top is not said again in the event that recorded it.
    detail = event["detail"]
    if error and isinstance(detail, dict) and detail.get("error") == error:
        rest = {name: value for name, value in detail.items() if name != "error"}
        return event | {"detail": rest or None, "error_above": True}
    return event


def shown(job: Job, dependencies: Mapping[int, JobDependencies] | None = None,
           controls: Mapping[int, JobControls] | None = None,
           tags: Mapping[int, Sequence[str]] | None = None,
           traces: Mapping[int, Trace] | None = None,
           waiting_for: Mapping[int, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    # As the API shows it to an admin, with the producer too (the API's representation
    # leaves it out: a producer sees only its own jobs); with `dependencies` (a job's page),
    # its depends_on, waiting_on and on_dependency_failure too; with `controls`, its
    # progress and cancel_requested; with `tags` and `traces`, those; with `waiting_for`, a
    # suspended job's wait.
    # Finished is when a job reached its end: nothing but a retry changes it after that.
    finished = to_rfc3339(job.updated_at) if job.status in TERMINAL_STATUSES else None
    return represent(job, show_error=True, dependencies=dependencies, controls=controls,
                     tags=tags, traces=traces, waiting_for=waiting_for) | {
        "producer": job.producer, "finished_at": finished}


def cancel_said(cancelled: Cancelled) -> str:
    """What a cancel did: a pending or waiting job (or a failed one blocking its key) is
    cancelled at once; a running one's cancel is only requested of its worker."""
    if cancelled.controls is None:
        return "Released." if cancelled.released else "Cancelled."
    asked = cancelled.controls
    return (f"Cancel requested (by {asked.cancel_requested_by}, "
            f"{utc(to_rfc3339(asked.cancel_requested_at))}): the worker will be told at its "
            "next heartbeat; the job ends cancelled when it reports, or when its lease "
            "expires.")


def retried_said(changed: list[Job]) -> str:
    return f"{len(changed)} job{'' if len(changed) == 1 else 's'} sent back to pending."
