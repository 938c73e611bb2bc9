"""How the job routes answer: a job as shown (its fields, its controls, its dependencies),
pages of jobs, and the answers of claims, completes and bulk actions; the same schemas
describe them in /openapi.json.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from marshmallow import Schema, fields, validate

from app.core.clock import to_rfc3339
from app.core.limits import (
    JOB_ID,
    PAGE_BYTES,
)
from app.core.priorities import PRIORITY_LABELS, Priority
from app.core.statuses import REMOVED, JobStatus
from app.core.tracecontext import TRACEPARENT_CHARS, TRACESTATE_CHARS, Trace
from app.jobs.domain.cursor import encode_cursor
from app.jobs.domain.models import Job, JobControls, JobDependencies
from app.jobs.web.requests import OnDependencyFailure
from app.web.fields import (
    render_page,
)
from app.web.problems import ProblemSchema


class ShownProgressSchema(Schema):
    # null while only a message was reported
    done = fields.Integer(required=True, allow_none=True)
    total = fields.Integer(required=True, allow_none=True)
    message = fields.String(required=True, allow_none=True)
    at = fields.String(required=True, metadata={"format": "date-time"})


class TraceSchema(Schema):
    """A job's W3C trace context, as the request that enqueued it sent it."""

    traceparent = fields.String(required=True, validate=validate.Length(max=TRACEPARENT_CHARS),
                                metadata={"example": "00-4bf92f3577b34da6a3ce929d0e0e4736-"
                                                     "00f067aa0ba902b7-01"})
    tracestate = fields.String(required=True, allow_none=True,
                               validate=validate.Length(max=TRACESTATE_CHARS))


class ResumedSchema(Schema):
    by = fields.String(required=True, validate=validate.OneOf(
        ["time", "event", "token", "timeout"]))
    data = fields.Dict(required=True, allow_none=True, metadata={
        "description": "The event's or the token's data; null for a sleep or a timeout."})
    at = fields.String(required=True, metadata={"format": "date-time"})


class WaitingForSchema(Schema):
    kind = fields.String(required=True, validate=validate.OneOf(["time", "event", "token"]))
    until = fields.String(required=True, metadata={
        "format": "date-time", "description": "A sleep's end, or the wait's timeout."})
    event = fields.String(metadata={"description": "An event wait's name."})
    key = fields.String(metadata={"description": "An event wait's key."})


class WaitpointShownSchema(Schema):
    token = fields.String(required=True)
    url = fields.String(required=True)


class JobSchema(Schema):
    """The job as the API shows it (docs/API.md, The job). Documents what `represent` builds."""

    id = fields.Integer(required=True)
    type = fields.String(required=True)
    payload = fields.Dict(required=True)
    priority = fields.String(required=True, validate=validate.OneOf(PRIORITY_LABELS))
    status = fields.String(required=True, validate=validate.OneOf([s.value for s in JobStatus]))
    retry_count = fields.Integer(required=True)
    max_retries = fields.Integer(required=True)
    idempotency_key = fields.String(required=True, allow_none=True)
    concurrency_key = fields.String(required=True, allow_none=True)
    run_at = fields.String(required=True, metadata={"format": "date-time"})
    claimed_at = fields.String(required=True, allow_none=True, metadata={"format": "date-time"})
    worker_id = fields.String(required=True, allow_none=True)
    lease_expires_at = fields.String(required=True, allow_none=True,
                                     metadata={"format": "date-time"})
    lease_token = fields.String(metadata={"description": "Only in the claim response."})
    result = fields.Dict(required=True, allow_none=True)
    error = fields.String(allow_none=True, metadata={"description": "Admins only."})
    created_at = fields.String(required=True, metadata={"format": "date-time"})
    updated_at = fields.String(required=True, metadata={"format": "date-time"})
    unique_key = fields.String(required=True, allow_none=True,
                               metadata={"description": "Set on jobs enqueued with unique."})
    schedule = fields.String(required=True, allow_none=True,
                             metadata={"description": "The schedule that enqueued the job."})
    scheduled_for = fields.String(required=True, allow_none=True, metadata={
        "format": "date-time", "description": "The schedule's slot the job was enqueued for."})
    depends_on = fields.List(fields.Integer(), metadata={
        "description": "The jobs it waits for, in the order given. Shown on reads and "
                       "enqueues; a worker's claim and reports leave it out (GET "
                       "/jobs/{id}/dependencies)."})
    waiting_on = fields.Integer(metadata={
        "description": "While waiting: how many dependencies have not finished; else 0."})
    on_dependency_failure = fields.String(allow_none=True, metadata={
        "enum": [*(choice.value for choice in OnDependencyFailure), None],
        "description": "null without dependencies."})
    timeout_seconds = fields.Integer(required=True, allow_none=True)
    expires_at = fields.String(required=True, allow_none=True, metadata={"format": "date-time"})
    cancel_requested = fields.Boolean(metadata={
        "description": "A running job whose cancel was asked for: its worker should stop. "
                       "Shown on reads, enqueues, the cancel's and the heartbeat's answers."})
    progress = fields.Nested(ShownProgressSchema, allow_none=True, metadata={
        "description": "The last progress its worker reported (null: none). Shown where "
                       "cancel_requested is."})
    checkpoint = fields.Dict(allow_none=True, metadata={
        "description": "Only in a claim's answer: what the previous attempt saved."})
    tags = fields.List(fields.String(), metadata={
        "description": "Its tags, sorted ([]: none). Shown on reads, listings and enqueues."})
    resumed = fields.Nested(ResumedSchema, metadata={
        "description": "How its last wait ended (docs/WAITS.md): shown once it has resumed, "
                       "on every claim until it suspends again."})
    waitpoint = fields.Nested(WaitpointShownSchema, metadata={
        "description": "Only in the answer of a suspend that waits for a token: the token "
                       "(shown this once) and the path to answer it at."})
    waiting_for = fields.Nested(WaitingForSchema, metadata={
        "description": "A suspended job's wait. Shown on reads, listings and the suspend's "
                       "answer."})
    trace = fields.Nested(TraceSchema, allow_none=True, metadata={
        "description": "The traceparent and tracestate headers of the request that enqueued "
                       "it (null: none, or not valid W3C trace context). Shown on reads, "
                       "listings, enqueues and claims."})


class BatchJobSchema(JobSchema):
    replayed = fields.Boolean(required=True)
    deduplicated = fields.Raw(required=True, metadata={
        "description": "false: a new job (or a replay); true: the item met a twin holding "
                       "its unique key and returned it; \"replaced\": it replaced the twin.",
        "enum": [False, True, "replaced"]})


class BatchJobListSchema(Schema):
    jobs = fields.List(fields.Nested(BatchJobSchema), required=True)


class ClaimedJobListSchema(Schema):
    jobs = fields.List(fields.Nested(JobSchema), required=True)


class CompleteResultSchema(Schema):
    id = fields.Integer(required=True)
    status = fields.Integer(required=True, validate=validate.OneOf([200, 404, 409]))
    job = fields.Nested(JobSchema)
    problem = fields.Nested(ProblemSchema)


class CompleteManyResultSchema(Schema):
    results = fields.List(fields.Nested(CompleteResultSchema), required=True)


class DependencySchema(Schema):
    id = fields.Integer(required=True)
    type = fields.String(required=True, allow_none=True,
                         metadata={"description": "null once the job was removed."})
    status = fields.String(required=True, validate=validate.OneOf(
        [*(s.value for s in JobStatus), REMOVED]), metadata={
            "description": "removed: retention removed the job (it had finished); its type "
                           "and result are gone (null)."})
    result = fields.Dict(required=True, allow_none=True)


class DependencyListSchema(Schema):
    dependencies = fields.List(fields.Nested(DependencySchema), required=True)


def represent_dependency(job_id: int, job: Job | None) -> dict[str, Any]:
    """A dependency as GET /jobs/{id}/dependencies shows it (DependencySchema); `job` None:
    removed by retention, shown by its id alone."""
    if job is None:
        return {"id": job_id, "type": None, "status": REMOVED, "result": None}
    return {"id": job.id, "type": job.type, "status": job.status,
            "result": None if job.result is None else json.loads(job.result)}


class JobListSchema(Schema):
    jobs = fields.List(fields.Nested(JobSchema), required=True)
    next_cursor = fields.String(required=True, allow_none=True)


def represent(job: Job, *, show_error: bool, lease_token: str | None = None,
              dependencies: Mapping[int, JobDependencies] | None = None,
              controls: Mapping[int, JobControls] | None = None,
              checkpoint: str | bool | None = False,
              tags: Mapping[int, Sequence[str]] | None = None,
              traces: Mapping[int, Trace] | None = None,
              waiting_for: Mapping[int, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The job as JobSchema describes it. Built by hand: this runs on every response.
    `dependencies` (by job id; a job without any is not in it) adds depends_on, waiting_on
    and on_dependency_failure; without it, as on the worker's claim and reports, they are
    left out. `controls` likewise adds cancel_requested and progress, `tags` (sorted, by
    job id) tags, and `traces` (by job id) trace. `checkpoint` (compact JSON, or None) is a
    claim's: False leaves it out. `waiting_for` (by job id) adds a suspended job's wait;
    `resumed` is the row's own, shown once set."""
    shown: dict[str, Any] = {
        "id": job.id,
        "type": job.type,
        "payload": json.loads(job.payload),
        "priority": Priority(job.priority).label,
        "status": job.status,
        "retry_count": job.retry_count,
        "max_retries": job.max_retries,
        "idempotency_key": job.idempotency_key,
        "concurrency_key": job.concurrency_key,
        "run_at": to_rfc3339(job.run_at),
        "claimed_at": to_rfc3339(job.claimed_at),
        "worker_id": job.worker_id,
        "lease_expires_at": to_rfc3339(job.lease_expires_at),
        "result": None if job.result is None else json.loads(job.result),
        "created_at": to_rfc3339(job.created_at),
        "updated_at": to_rfc3339(job.updated_at),
        "unique_key": job.unique_key,
        "schedule": job.schedule,
        "scheduled_for": to_rfc3339(job.scheduled_for),
        "timeout_seconds": job.timeout_seconds,
        "expires_at": to_rfc3339(job.expires_at),
    }
    if controls is not None:
        shown.update(_shown_controls(job, controls.get(job.id)))
    if checkpoint is not False:
        shown["checkpoint"] = None if checkpoint is None else json.loads(str(checkpoint))
    if dependencies is not None:
        waits = dependencies.get(job.id)
        if waits is None:
            shown.update(depends_on=[], waiting_on=0, on_dependency_failure=None)
        else:
            shown.update(
                depends_on=list(waits.depends_on),
                waiting_on=waits.unfinished if job.status == JobStatus.WAITING else 0,
                on_dependency_failure=(OnDependencyFailure.CANCEL if waits.cancel_on_failure
                                       else OnDependencyFailure.RUN).value)
    if job.resumed is not None:
        shown["resumed"] = json.loads(job.resumed)
    if waiting_for is not None and job.id in waiting_for:
        shown["waiting_for"] = dict(waiting_for[job.id])
    if tags is not None:
        shown["tags"] = list(tags.get(job.id, ()))
    if traces is not None:
        trace = traces.get(job.id)
        shown["trace"] = None if trace is None else trace.as_json()
    if lease_token is not None:
        shown["lease_token"] = lease_token
    if show_error:
        shown["error"] = job.error
    return shown


def _shown_controls(job: Job, controls: JobControls | None) -> dict[str, Any]:
    if controls is None:
        return {"cancel_requested": False, "progress": None}
    progress = None
    if controls.progress_at is not None:
        progress = {"done": controls.progress_done, "total": controls.progress_total,
                    "message": controls.progress_message,
                    "at": to_rfc3339(controls.progress_at)}
    # A request outlives the job only where a complete raced it (PostgreSQL): it is moot then.
    requested = controls.cancel_requested and job.status == JobStatus.RUNNING
    return {"cancel_requested": requested, "progress": progress}


def render_job_page(page: list[Job], next_cursor: str | None, *, show_error: bool,
                    dependencies: Mapping[int, JobDependencies],
                    controls: Mapping[int, JobControls],
                    tags: Mapping[int, Sequence[str]] | None = None,
                    traces: Mapping[int, Trace] | None = None,
                    waiting_for: Mapping[int, Mapping[str, Any]] | None = None,
                    max_bytes: int = PAGE_BYTES.max) -> bytes:
    """GET /jobs's body (JobListSchema), cut to `max_bytes` as render_page says."""
    return render_page("jobs", page, lambda job: represent(job, show_error=show_error,
                                                           dependencies=dependencies,
                                                           controls=controls, tags=tags,
                                                           traces=traces,
                                                           waiting_for=waiting_for),
                       lambda job: encode_cursor(job.id), next_cursor,
                       longest_cursor=encode_cursor(JOB_ID.max), max_bytes=max_bytes)
