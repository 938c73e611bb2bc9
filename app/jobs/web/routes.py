"""Thin handlers: authenticate, load with a schema, call the service, answer with the job."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request, url_for

from app.core.callers import Role
from app.core.errors import Forbidden, QueueError, ValidationFailed
from app.core.tracecontext import Trace, trace_of_headers
from app.jobs.domain.models import JobControls, JobDependencies, JobExtras
from app.jobs.domain.uniqueness import Deduplicated
from app.jobs.usecases.claim import Claimed
from app.jobs.usecases.enqueue import Enqueued
from app.jobs.usecases.reports import Progress
from app.jobs.usecases.service import JobService
from app.jobs.wake.waiting import NOT_WAITED_RETRY_AFTER_SECONDS, WaitAnswer
from app.jobs.web.answers import (
    BatchJobListSchema,
    ClaimedJobListSchema,
    CompleteManyResultSchema,
    DependencyListSchema,
    JobListSchema,
    JobSchema,
    render_job_page,
    represent,
    represent_dependency,
)
from app.jobs.web.fastload import load_batch
from app.jobs.web.requests import (
    BatchEnqueueSchema,
    BulkResultSchema,
    BulkSchema,
    ClaimManySchema,
    ClaimSchema,
    CompleteManySchema,
    CompleteSchema,
    EnqueueSchema,
    FailSchema,
    GetJobQuerySchema,
    HeartbeatSchema,
    ListQuerySchema,
)
from app.web.auth import current_caller, require_roles
from app.web.fields import EmptySchema
from app.web.http import idempotency_key_header, json_body, load_body, load_query, no_content
from app.web.openapi import Reply, documented
from app.web.problems import problem_body, problem_type_of

bp = Blueprint("jobs", __name__)

ANY_ROLE = (Role.PRODUCER, Role.WORKER, Role.ADMIN)
_JOB = Reply(200, "The job.", JobSchema)

_enqueue_schema = EnqueueSchema()
_list_query_schema = ListQuerySchema()
_get_query_schema = GetJobQuerySchema()
_claim_schema = ClaimSchema()
_heartbeat_schema = HeartbeatSchema()
_complete_schema = CompleteSchema()
_fail_schema = FailSchema()
_no_body_schema = EmptySchema()
_claim_many_schema = ClaimManySchema()
_complete_many_schema = CompleteManySchema()
_bulk_schema = BulkSchema()


# The query parameters each route takes; GET /jobs's own schema refuses unknown ones.
_QUERY_PARAMETERS = {"jobs.get_job": frozenset({"wait_seconds"})}


@bp.before_request
def _refuse_unknown_query_parameters() -> None:
    # A parameter a route does not take is a client's mistake, said at once rather than
    # silently ignored.
    if not request.args or request.endpoint == "jobs.list_jobs":
        return
    known = _QUERY_PARAMETERS.get(request.endpoint or "", frozenset())
    unknown = [name for name in request.args if name not in known]
    if unknown:
        raise ValidationFailed("This route takes no such query parameter.",
                               errors={name: ["Unknown query parameter."] for name in unknown})


def _service() -> JobService:
    service: JobService = current_app.extensions["queuelog"].jobs
    return service


_WAITS_FOR_NOTHING: dict[int, JobDependencies] = {}
_NO_CONTROLS: dict[int, JobControls] = {}


def _request_trace() -> Trace | None:
    """The request's W3C trace context (None: none, or not valid: ignored, never a 422)."""
    return trace_of_headers(request.headers)


def _job_response(job: Any, status: int = 200, lease_token: str | None = None, *,
                  with_dependencies: bool = False,
                  dependencies: Mapping[int, JobDependencies] | None = None,
                  controls: Mapping[int, JobControls] | None = None,
                  checkpoint: str | bool | None = False,
                  tags: Mapping[int, Sequence[str]] | None = None,
                  traces: Mapping[int, Trace] | None = None,
                  waiting_for: Mapping[int, Mapping[str, Any]] | None = None) -> Response:
    """The job as the caller may see it; `with_dependencies` reads and shows what it waits
    for, its controls, tags and trace (reads and enqueues; a worker's claim and reports
    leave those out), or `dependencies`, `controls`, `tags` and `traces` say them.
    `checkpoint`: a claim's (False: none shown)."""
    if with_dependencies:
        extras = _service().extras_of([job])
        dependencies, controls = extras.dependencies, extras.controls
        tags, traces, waiting_for = extras.tags, extras.traces, extras.waiting_for
    response = jsonify(represent(job, show_error=current_caller().is_admin,
                                 lease_token=lease_token, dependencies=dependencies,
                                 controls=controls, checkpoint=checkpoint, tags=tags,
                                 traces=traces, waiting_for=waiting_for))
    response.status_code = status
    return response


def _claim(body: dict[str, Any], limit: int) -> WaitAnswer[list[Claimed]]:
    caller = current_caller()
    if body.get("worker_id", caller.name) != caller.name:
        raise Forbidden("worker_id must be this key's own name.")
    return _service().await_claim(caller, types=body.get("types"),
                                  lease_seconds=body.get("lease_seconds"), limit=limit,
                                  wait_seconds=body["wait_seconds"],
                                  instance=body.get("instance"))


def _say_not_waited(response: Response, answer: WaitAnswer[Any]) -> Response:
    # The answer alone (nothing yet) reads like a wait that ran out: without this a client
    # asks again at once, and keeps doing so for as long as the budget stays full.
    if answer.not_waited:
        response.headers["Retry-After"] = str(NOT_WAITED_RETRY_AFTER_SECONDS)
    return response


# The literal routes under /jobs/ are registered before /jobs/<id:job_id>, and ids are
# integers, so a literal segment is never taken for an id.
@bp.post("/jobs/claim")
@documented("Claim the most urgent claimable job, waiting up to wait_seconds for one.",
            body=ClaimSchema,
            replies=[Reply(200, "The claimed job, running, with its lease_token.", JobSchema),
                     Reply(204, "Nothing became claimable within wait_seconds; with "
                                "Retry-After, the server could not wait (its budget of "
                                "waiting claims is full).", headers=("Retry-After",))])
@require_roles(Role.WORKER)
def claim_job() -> Response:
    answer = _claim(load_body(_claim_schema), limit=1)
    if not answer.value:
        return _say_not_waited(no_content(), answer)
    claimed = answer.value[0]
    return _job_response(claimed.job, lease_token=claimed.lease_token,
                         checkpoint=claimed.checkpoint, traces=_traces_claimed([claimed]))


@bp.post("/jobs/claim-many")
@documented("Claim up to max_jobs claimable jobs in claim order, each with its own lease.",
            body=ClaimManySchema,
            replies=[Reply(200, "The claimed jobs (possibly none), each with its lease_token; "
                                "none with Retry-After: the server could not wait (its budget "
                                "of waiting claims is full).",
                           ClaimedJobListSchema, ("Retry-After",))])
@require_roles(Role.WORKER)
def claim_many_jobs() -> Response:
    body = load_body(_claim_many_schema)
    answer = _claim(body, limit=body["max_jobs"])
    traces = _traces_claimed(answer.value)
    return _say_not_waited(
        jsonify({"jobs": [represent(c.job, show_error=False, lease_token=c.lease_token,
                                    checkpoint=c.checkpoint, traces=traces)
                          for c in answer.value]}), answer)


def _traces_claimed(claimed: list[Claimed]) -> dict[int, Trace]:
    """The trace of each claimed job, read by the claim itself: no read of its own."""
    return {c.job.id: c.trace for c in claimed if c.trace is not None}


@bp.post("/jobs/batch")
@documented("Enqueue up to 1,000 jobs in one transaction, all or nothing.",
            body=BatchEnqueueSchema, body_required=True,
            replies=[Reply(201, "The jobs in request order, each marked replayed or not.",
                           BatchJobListSchema)],
            errors=[409])
@require_roles(Role.PRODUCER, Role.ADMIN)
def enqueue_batch() -> Response:
    if request.headers.get("Idempotency-Key") is not None:
        raise ValidationFailed(
            "A batch takes an idempotency_key in each job, not the Idempotency-Key header.",
            errors={"Idempotency-Key": ["Put idempotency_key in each job instead."]})
    body = load_batch(json_body())
    trace = _request_trace()
    results = _service().enqueue_many(current_caller(), body["jobs"], trace=trace)
    show_error = current_caller().is_admin
    extras = _extras_of_enqueued(body["jobs"], results, trace)
    response = jsonify({"jobs": [represent(outcome.job, show_error=show_error,
                                           dependencies=extras.dependencies,
                                           controls=extras.controls, tags=extras.tags,
                                           traces=extras.traces)
                                 | {"replayed": outcome.replayed,
                                    "deduplicated": outcome.deduplicated.wire}
                                 for outcome in results]})
    response.status_code = 201
    return response


def _extras_of_enqueued(requests: list[dict[str, Any]], results: list[Enqueued],
                        trace: Trace | None) -> JobExtras:
    """What enqueued jobs show beside their rows (one enqueue's, or a batch's). A job made
    without depends_on waits for nothing and has the tags and trace it was sent with: only
    the jobs met (replays, unique twins) and a graph's are read."""
    if any(item.get("depends_on") for item in requests):
        return _service().extras_of([outcome.job for outcome in results])
    made = {outcome.job.id: item for item, outcome in zip(requests, results, strict=True)
            if outcome.created}
    extras = _service().extras_of([outcome.job for outcome in results
                                   if outcome.job.id not in made])
    tags = {**extras.tags, **{job_id: item["tags"] for job_id, item in made.items()
                              if item.get("tags")}}
    traces = dict(extras.traces)
    if trace is not None:
        traces.update(dict.fromkeys(made, trace))
    return JobExtras(extras.dependencies, extras.controls, tags, traces)


@bp.post("/jobs/complete-many")
@documented("Complete up to 100 held jobs; each item succeeds or fails on its own.",
            body=CompleteManySchema, body_required=True,
            replies=[Reply(200, "One result per item: the job, or the problem.",
                           CompleteManyResultSchema)])
@require_roles(Role.WORKER)
def complete_many_jobs() -> Response:
    body = load_body(_complete_many_schema)
    answers = _service().complete_many(current_caller(), body["items"])
    results = []
    for job_id, answer in answers:
        if isinstance(answer, QueueError):
            results.append({"id": job_id, "status": problem_type_of(answer).status,
                            "problem": problem_body(answer)})
        else:
            results.append({"id": job_id, "status": 200,
                            "job": represent(answer, show_error=False)})
    return jsonify({"results": results})


@bp.post("/jobs/retry-many")
@documented("Send every failed or cancelled job the filter names back to pending, in "
            "batches of QUEUELOG_BULK_BATCH_SIZE jobs, each its own transaction; jobs in other "
            "statuses, and jobs whose unique key another job holds, are skipped.",
            body=BulkSchema, replies=[Reply(200, "How many jobs changed, and their ids.",
                                            BulkResultSchema)])
@require_roles(Role.ADMIN)
def retry_many_jobs() -> Response:
    return _bulk_response(_service().retry_many(current_caller(), load_body(_bulk_schema)))


@bp.post("/jobs/cancel-many")
@documented("Cancel every pending job the filter names, in batches of "
            "QUEUELOG_BULK_BATCH_SIZE jobs, each its own transaction; jobs in other "
            "statuses are skipped.",
            body=BulkSchema, replies=[Reply(200, "How many jobs changed, and their ids.",
                                            BulkResultSchema)])
@require_roles(Role.ADMIN)
def cancel_many_jobs() -> Response:
    return _bulk_response(_service().cancel_many(current_caller(), load_body(_bulk_schema)))


def _bulk_response(changed: list[Any]) -> Response:
    return jsonify({"count": len(changed), "ids": [job.id for job in changed]})


@bp.post("/jobs")
@documented("Enqueue a job.",
            body=EnqueueSchema, body_required=True, request_headers=["IdempotencyKey"],
            replies=[Reply(201, "The new job, pending.", JobSchema, ("Location",)),
                     Reply(200, "A replay (the job this idempotency key created before), or "
                                "the twin holding this request's unique key, returned or "
                                "replaced.",
                           JobSchema, ("Location", "Idempotent-Replayed", "Deduplicated"))],
            errors=[409])
@require_roles(Role.PRODUCER, Role.ADMIN)
def enqueue_job() -> Response:
    header_key = idempotency_key_header()
    body = load_body(_enqueue_schema)
    trace = _request_trace()
    outcome = _service().enqueue(current_caller(), body, header_key, trace=trace)
    extras = _extras_of_enqueued([body], [outcome], trace)
    response = _job_response(outcome.job, 201 if outcome.created else 200,
                             dependencies=extras.dependencies, controls=extras.controls,
                             tags=extras.tags, traces=extras.traces)
    response.headers["Location"] = url_for("jobs.get_job", job_id=outcome.job.id)
    if outcome.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    _say_deduplicated(response, outcome)
    return response


def _say_deduplicated(response: Response, outcome: Enqueued) -> None:
    if outcome.deduplicated is Deduplicated.RETURNED:
        response.headers["Deduplicated"] = "true"
    elif outcome.deduplicated is Deduplicated.REPLACED:
        response.headers["Deduplicated"] = "replaced"


@bp.get("/jobs")
@documented("List the jobs the caller may see, by id.",
            query=ListQuerySchema,
            replies=[Reply(200, "A page of jobs and the cursor of the next page.",
                           JobListSchema)])
@require_roles(*ANY_ROLE)
def list_jobs() -> Response:
    query = load_query(_list_query_schema)
    page, next_cursor = _service().list_jobs(
        current_caller(), status=query.get("status"), job_type=query.get("type"),
        limit=query["limit"], cursor=query.get("cursor"), tag=query.get("tag"))
    extras = _service().extras_of(page)
    return Response(render_job_page(page, next_cursor, show_error=current_caller().is_admin,
                                    dependencies=extras.dependencies, controls=extras.controls,
                                    tags=extras.tags, traces=extras.traces,
                                    waiting_for=extras.waiting_for),
                    mimetype="application/json")


@bp.get("/jobs/<id:job_id>")
@documented("Read a job, waiting up to wait_seconds for it to finish.",
            query=GetJobQuerySchema,
            replies=[Reply(200, "The job; unfinished with Retry-After: the server could not "
                                "wait (its budget of waiting requests is full).",
                           JobSchema, ("Retry-After",))],
            errors=[404])
@require_roles(*ANY_ROLE)
def get_job(job_id: int) -> Response:
    query = load_query(_get_query_schema)
    answer = _service().await_job(current_caller(), job_id, query["wait_seconds"])
    return _say_not_waited(_job_response(answer.value, with_dependencies=True), answer)


@bp.get("/jobs/<id:job_id>/dependencies")
@documented("Read what a job's dependencies produced: for the worker holding it, its "
            "producer and admins.",
            replies=[Reply(200, "Its dependencies in depends_on order, every one of them: one "
                                "retention removed says so (status removed).",
                           DependencyListSchema)],
            errors=[404])
@require_roles(*ANY_ROLE)
def job_dependencies(job_id: int) -> Response:
    shown = _service().dependencies_shown(current_caller(), job_id)
    return jsonify({"dependencies": [represent_dependency(dep_id, job)
                                     for dep_id, job in shown]})


@bp.post("/jobs/<id:job_id>/heartbeat")
@documented("Extend the lease on a job the caller holds (never past its timeout_seconds), "
            "and report its progress and checkpoint; the answer says whether its cancel was "
            "requested. A job takes one heartbeat a second (one checkpoint a second); one "
            "sent sooner is a 429 that writes nothing (docs/JOBS.md).",
            body=HeartbeatSchema, replies=[_JOB], errors=[404, 409, 429])
@require_roles(Role.WORKER)
def heartbeat_job(job_id: int) -> Response:
    body = load_body(_heartbeat_schema)
    progress = body.get("progress")
    beat = _service().heartbeat(
        current_caller(), job_id, lease_token=body.get("lease_token"),
        lease_seconds=body.get("lease_seconds"), progress=Progress(
            None if progress is None else (progress["done"], progress["total"]),
            body.get("message"), body.get("checkpoint")), instance=body.get("instance"))
    return _job_response(beat.job, controls={job_id: beat.controls})


@bp.post("/jobs/<id:job_id>/complete")
@documented("Report a held job done.",
            body=CompleteSchema, replies=[_JOB], errors=[404, 409])
@require_roles(Role.WORKER)
def complete_job(job_id: int) -> Response:
    body = load_body(_complete_schema)
    return _job_response(_service().complete(
        current_caller(), job_id, lease_token=body.get("lease_token"), result=body["result"]))


@bp.post("/jobs/<id:job_id>/fail")
@documented("Report a failed attempt: pending again after a backoff, or failed.",
            body=FailSchema, body_required=True, replies=[_JOB], errors=[404, 409])
@require_roles(Role.WORKER)
def fail_job(job_id: int) -> Response:
    body = load_body(_fail_schema)
    return _job_response(_service().fail(
        current_caller(), job_id, lease_token=body.get("lease_token"), error=body["error"],
        retry_in_seconds=body.get("retry_in_seconds"), checkpoint=body.get("checkpoint")))


@bp.post("/jobs/<id:job_id>/cancel")
@documented("Cancel a pending or waiting job; for a running one, ask its worker to stop "
            "(cancel_requested): its report, or its lease's expiry, ends it cancelled. "
            "Admins, and the producer of the job.",
            body=EmptySchema, replies=[_JOB], errors=[404, 409])
@require_roles(Role.PRODUCER, Role.ADMIN)
def cancel_job(job_id: int) -> Response:
    load_body(_no_body_schema)
    cancelled = _service().cancel(current_caller(), job_id)
    if cancelled.controls is None:
        return _job_response(cancelled.job, with_dependencies=True)
    # Its controls as the cancel left them (a request recorded); the rest as stored.
    extras = _service().extras_of([cancelled.job])
    return _job_response(cancelled.job, dependencies=extras.dependencies,
                         controls={job_id: cancelled.controls}, tags=extras.tags,
                         traces=extras.traces, waiting_for=extras.waiting_for)


@bp.post("/jobs/<id:job_id>/confirm")
@documented("Confirm a reserved job after your own commit: pending (a repeat: 200 again).",
            body=EmptySchema, replies=[_JOB], errors=[404, 409])
@require_roles(Role.PRODUCER, Role.ADMIN)
def confirm_job(job_id: int) -> Response:
    load_body(_no_body_schema)
    # A reserved job names no dependency and never ran: nothing more to read for its answer.
    return _job_response(_service().confirm(current_caller(), job_id),
                         dependencies=_WAITS_FOR_NOTHING, controls=_NO_CONTROLS)


@bp.post("/jobs/<id:job_id>/release")
@documented("Release a reserved job (your transaction rolled back): cancelled (a repeat: "
            "200 again).",
            body=EmptySchema, replies=[_JOB], errors=[404, 409])
@require_roles(Role.PRODUCER, Role.ADMIN)
def release_job(job_id: int) -> Response:
    load_body(_no_body_schema)
    return _job_response(_service().release(current_caller(), job_id),
                         dependencies=_WAITS_FOR_NOTHING, controls=_NO_CONTROLS)


@bp.post("/jobs/<id:job_id>/retry")
@documented("Send a failed or cancelled job back to pending, with a fresh retry budget.",
            body=EmptySchema, replies=[_JOB], errors=[404, 409])
@require_roles(Role.ADMIN)
def retry_job(job_id: int) -> Response:
    load_body(_no_body_schema)
    return _job_response(_service().retry(current_caller(), job_id), with_dependencies=True)
