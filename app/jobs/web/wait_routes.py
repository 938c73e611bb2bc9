"""The routes of waits (docs/WAITS.md): a worker suspends the job it holds; a producer posts
an event; whoever holds a waitpoint token answers it. Thin: load, call the service, answer."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app, jsonify, url_for

from app.core.callers import Role
from app.core.clock import MICROS, to_rfc3339
from app.core.errors import Forbidden, ValidationFailed
from app.core.limits import WAIT_SECONDS
from app.jobs.domain.waits import Wait, WaitKind
from app.jobs.usecases.service import JobService
from app.jobs.web.answers import JobSchema, represent
from app.jobs.web.wait_requests import (
    EventPostedSchema,
    PostEventSchema,
    SuspendSchema,
    WaitpointAnswerSchema,
    WaitpointCompletedSchema,
)
from app.web.auth import current_caller, require_roles
from app.web.http import idempotency_key_header, load_body
from app.web.openapi import Reply, documented

bp = Blueprint("waits", __name__)

_suspend_schema = SuspendSchema()
_event_schema = PostEventSchema()
_waitpoint_schema = WaitpointAnswerSchema()


def _service() -> JobService:
    service: JobService = current_app.extensions["queuelog"].jobs
    return service


def _wait_of(body: dict[str, Any], now_us: int) -> Wait:
    """The suspend's wait; its moment checked against now (422, naming the field)."""
    if "seconds" in body:
        return Wait(WaitKind.TIME, until_us=now_us + body["seconds"] * MICROS)
    if "until" in body:
        until = body["until"]
        if not now_us < until <= now_us + WAIT_SECONDS.max * MICROS:
            raise ValidationFailed("The request has invalid fields.", errors={
                "until": ["Must be in the future, and at most a year ahead."]})
        return Wait(WaitKind.TIME, until_us=until)
    wait_for = body["wait_for"]
    if wait_for.get("token"):
        return Wait(WaitKind.TOKEN, timeout_seconds=wait_for["timeout_seconds"])
    return Wait(WaitKind.EVENT, event=wait_for["event"], key=wait_for["key"],
                timeout_seconds=wait_for["timeout_seconds"])


@bp.post("/jobs/<id:job_id>/suspend")
@documented("Suspend a held job until a moment, an event of its producer or a waitpoint "
            "token's answer (docs/WAITS.md): it holds no lease meanwhile, and its next claim "
            "carries `resumed`. A token wait's answer carries the waitpoint, shown once.",
            body=SuspendSchema, body_required=True,
            replies=[Reply(200, "The job, suspended (or pending: a kept event resumed it).",
                           JobSchema)], errors=[404, 409])
@require_roles(Role.WORKER)
def suspend_job(job_id: int) -> Response:
    body = load_body(_suspend_schema)
    service = _service()
    wait = _wait_of(body, service.clock.now_us())
    suspended = service.waits.suspend(current_caller(), job_id,
                                      lease_token=body.get("lease_token"), wait=wait,
                                      checkpoint=body.get("checkpoint"))
    waiting = {} if suspended.waiting_for is None else {job_id: suspended.waiting_for}
    shown = represent(suspended.job, show_error=current_caller().is_admin,
                      waiting_for=waiting)
    if suspended.token is not None:
        shown["waitpoint"] = {
            "token": suspended.token,
            "url": url_for("waits.answer_waitpoint", token=suspended.token)}
    return jsonify(shown)


@bp.post("/events")
@documented("Post an event: every suspended job of the producer waiting for its name and key "
            "resumes with its data; when none waits, it is kept for the first wait for it. "
            "Producers for their own jobs; admins for theirs, or for the producer they name. "
            "An Idempotency-Key makes a re-sent event the same one.",
            body=PostEventSchema, body_required=True, request_headers=["EventIdempotencyKey"],
            replies=[Reply(200, "How many jobs it resumed (on a repeat, as the first "
                           "answered).", EventPostedSchema, ("Idempotent-Replayed",))],
            errors=[403])
@require_roles(Role.PRODUCER, Role.ADMIN)
def post_event() -> Response:
    body = load_body(_event_schema)
    caller = current_caller()
    # An event is for the jobs of one key (docs/WAITS.md): the caller's own (an admin's
    # enqueues are its own too), or, for an admin, the producer it names.
    producer = body.get("producer", caller.name)
    if producer != caller.name and not caller.is_admin:
        raise Forbidden("A producer posts events for its own jobs only.")
    posted = _service().waits.post_event(
        caller, producer, body["name"], body["key"], body["data"],
        idempotency_key=idempotency_key_header())
    response = jsonify({"woken": posted.woken})
    if posted.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return response


@bp.post("/waitpoints/<token>")
@documented("Answer a waitpoint token (docs/WAITS.md): the job waiting on it resumes with "
            "the data. No API key: the token is the capability. Once: a second answer is a "
            "409 naming when the wait ended; an unknown token is a 404.",
            body=WaitpointAnswerSchema,
            replies=[Reply(200, "The job it resumed, and when.", WaitpointCompletedSchema)],
            errors=[404, 409])
def answer_waitpoint(token: str) -> Response:
    body = load_body(_waitpoint_schema)
    completed = _service().waits.complete_token(token, body["data"])
    return jsonify({"job_id": completed.job_id, "completed_at": to_rfc3339(completed.at_us)})
