"""Thin handlers for a job's history."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify

from app.core.callers import Role
from app.history.schemas import (
    AttemptListSchema,
    EventListSchema,
    ExplanationSchema,
    WorkerListSchema,
    represent_attempt,
    represent_event,
    represent_explanation,
    represent_worker,
)
from app.history.service import HistoryService
from app.web.auth import current_caller, require_roles
from app.web.http import refuse_query_parameters
from app.web.openapi import Reply, documented

bp = Blueprint("history", __name__)


bp.before_request(refuse_query_parameters)


def _service() -> HistoryService:
    service: HistoryService = current_app.extensions["queuelog"].history
    return service


@bp.get("/jobs/<id:job_id>/attempts")
@documented("A job's attempts, oldest first, each with its own error (admins only).",
            replies=[Reply(200, "The attempts.", AttemptListSchema)], errors=[404])
@require_roles(Role.PRODUCER, Role.ADMIN)
def job_attempts(job_id: int) -> Response:
    caller = current_caller()
    return jsonify({"attempts": [represent_attempt(attempt, show_error=caller.is_admin)
                                 for attempt in _service().attempts(caller, job_id)]})


@bp.get("/jobs/<id:job_id>/events")
@documented("A job's timeline: one event per change, oldest first.",
            replies=[Reply(200, "The events.", EventListSchema)], errors=[404])
@require_roles(Role.ADMIN)
def job_events(job_id: int) -> Response:
    return jsonify({"events": [represent_event(event)
                               for event in _service().events(current_caller(), job_id)]})


@bp.get("/workers")
@documented("The live worker keys: when each was last seen and how many jobs it holds.",
            replies=[Reply(200, "The workers, by name.", WorkerListSchema)])
@require_roles(Role.ADMIN)
def list_workers() -> Response:
    return jsonify({"workers": [represent_worker(worker) for worker in _service().workers()]})


@bp.get("/jobs/<id:job_id>/explain")
@documented("Why the job is or is not running: reasons, most important first.",
            replies=[Reply(200, "The explanation.", ExplanationSchema)], errors=[404])
@require_roles(Role.PRODUCER, Role.ADMIN)
def explain_job(job_id: int) -> Response:
    return jsonify(represent_explanation(_service().explain(current_caller(), job_id)))
