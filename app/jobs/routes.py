"""Thin handlers: authenticate, load with a schema, call the service, answer with the job."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request, url_for

from app.auth import current_caller, require_roles
from app.errors import Forbidden, ValidationFailed
from app.http import load_body, load_query
from app.jobs.schemas import (
    ClaimSchema,
    CompleteSchema,
    EmptySchema,
    EnqueueSchema,
    FailSchema,
    HeartbeatSchema,
    JobListSchema,
    JobSchema,
    ListQuerySchema,
    represent,
)
from app.jobs.service import Claimed, JobService
from app.keys.models import Role
from app.openapi import Reply, documented

bp = Blueprint("jobs", __name__)

ANY_ROLE = (Role.PRODUCER, Role.WORKER, Role.ADMIN)
_JOB = Reply(200, "The job.", JobSchema)

_enqueue_schema = EnqueueSchema()
_list_query_schema = ListQuerySchema()
_claim_schema = ClaimSchema()
_heartbeat_schema = HeartbeatSchema()
_complete_schema = CompleteSchema()
_fail_schema = FailSchema()
_no_body_schema = EmptySchema()


def _service() -> JobService:
    return current_app.extensions["queuelog"].jobs


def _job_response(job: Any, status: int = 200, lease_token: str | None = None) -> Response:
    response = jsonify(represent(job, show_error=current_caller().is_admin,
                                 lease_token=lease_token))
    response.status_code = status
    return response


def _idempotency_key_header() -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    if not 1 <= len(key) <= 255 or not all(" " <= ch <= "~" for ch in key):
        raise ValidationFailed(
            "The Idempotency-Key header must be 1-255 printable ASCII characters.",
            errors={"Idempotency-Key": ["Must be 1-255 printable ASCII characters."]})
    return key


# /jobs/claim is registered before /jobs/<int:job_id>, and ids are integers, so the literal
# segment is never taken for an id.
@bp.post("/jobs/claim")
@documented("Claim the most urgent claimable job.",
            body=ClaimSchema,
            replies=[Reply(200, "The claimed job, running, with its lease_token.", JobSchema),
                     Reply(204, "Nothing is claimable now.")])
@require_roles(Role.WORKER)
def claim_job() -> Response:
    body = load_body(_claim_schema)
    caller = current_caller()
    if body.get("worker_id", caller.name) != caller.name:
        raise Forbidden("worker_id must be this key's own name.")
    claimed: list[Claimed] = _service().claim(
        caller, types=body.get("types"), lease_seconds=body.get("lease_seconds"))
    if not claimed:
        return Response(status=204)
    return _job_response(claimed[0].job, lease_token=claimed[0].lease_token)


@bp.post("/jobs")
@documented("Enqueue a job.",
            body=EnqueueSchema, body_required=True, request_headers=["IdempotencyKey"],
            replies=[Reply(201, "The new job, pending.", JobSchema, ("Location",)),
                     Reply(200, "A replay: the job this idempotency key created before.",
                           JobSchema, ("Location", "Idempotent-Replayed"))],
            errors=[409])
@require_roles(Role.PRODUCER, Role.ADMIN)
def enqueue_job() -> Response:
    header_key = _idempotency_key_header()
    body = load_body(_enqueue_schema)
    job, replayed = _service().enqueue(current_caller(), body, header_key)
    response = _job_response(job, 200 if replayed else 201)
    response.headers["Location"] = url_for("jobs.get_job", job_id=job.id)
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return response


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
        limit=query["limit"], cursor=query.get("cursor"))
    show_error = current_caller().is_admin
    return jsonify({"jobs": [represent(job, show_error=show_error) for job in page],
                    "next_cursor": next_cursor})


@bp.get("/jobs/<int:job_id>")
@documented("Read a job.", replies=[_JOB], errors=[404])
@require_roles(*ANY_ROLE)
def get_job(job_id: int) -> Response:
    return _job_response(_service().get_job(current_caller(), job_id))


@bp.post("/jobs/<int:job_id>/heartbeat")
@documented("Extend the lease on a job the caller holds.",
            body=HeartbeatSchema, replies=[_JOB], errors=[404, 409])
@require_roles(Role.WORKER)
def heartbeat_job(job_id: int) -> Response:
    body = load_body(_heartbeat_schema)
    return _job_response(_service().heartbeat(
        current_caller(), job_id, lease_token=body.get("lease_token"),
        lease_seconds=body.get("lease_seconds")))


@bp.post("/jobs/<int:job_id>/complete")
@documented("Report a held job done.",
            body=CompleteSchema, replies=[_JOB], errors=[404, 409])
@require_roles(Role.WORKER)
def complete_job(job_id: int) -> Response:
    body = load_body(_complete_schema)
    return _job_response(_service().complete(
        current_caller(), job_id, lease_token=body.get("lease_token"), result=body["result"]))


@bp.post("/jobs/<int:job_id>/fail")
@documented("Report a failed attempt: pending again after a backoff, or failed.",
            body=FailSchema, body_required=True, replies=[_JOB], errors=[404, 409])
@require_roles(Role.WORKER)
def fail_job(job_id: int) -> Response:
    body = load_body(_fail_schema)
    return _job_response(_service().fail(
        current_caller(), job_id, lease_token=body.get("lease_token"), error=body["error"],
        retry_in_seconds=body.get("retry_in_seconds")))


@bp.post("/jobs/<int:job_id>/cancel")
@documented("Cancel a pending job.",
            body=EmptySchema, replies=[_JOB], errors=[404, 409])
@require_roles(Role.ADMIN)
def cancel_job(job_id: int) -> Response:
    load_body(_no_body_schema)
    return _job_response(_service().cancel(job_id))


@bp.post("/jobs/<int:job_id>/retry")
@documented("Send a failed or cancelled job back to pending, with a fresh retry budget.",
            body=EmptySchema, replies=[_JOB], errors=[404, 409])
@require_roles(Role.ADMIN)
def retry_job(job_id: int) -> Response:
    load_body(_no_body_schema)
    return _job_response(_service().retry(job_id))
