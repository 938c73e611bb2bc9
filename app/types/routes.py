"""Thin handlers of /types: authenticate, load with a schema, call the service, answer."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify

from app.core.callers import Role
from app.types.schemas import TypeListSchema, TypePatchSchema, TypeSchema, represent_type
from app.types.service import TypeService
from app.web.auth import require_roles
from app.web.http import load_body, refuse_query_parameters
from app.web.openapi import Reply, documented

bp = Blueprint("types", __name__)

_patch_schema = TypePatchSchema()


bp.before_request(refuse_query_parameters)


def _service() -> TypeService:
    service: TypeService = current_app.extensions["queuelog"].types
    return service


@bp.get("/types")
@documented("Every configured job type with its settings, counts and last claim.",
            replies=[Reply(200, "The types, by name.", TypeListSchema)])
@require_roles(Role.ADMIN)
def list_types() -> Response:
    return jsonify({"types": [represent_type(view) for view in _service().list_types()]})


@bp.get("/types/<job_type>")
@documented("A job type's settings, counts and last claim.",
            replies=[Reply(200, "The type.", TypeSchema)], errors=[404])
@require_roles(Role.ADMIN)
def get_type(job_type: str) -> Response:
    return jsonify(represent_type(_service().get_type(job_type)))


@bp.patch("/types/<job_type>")
@documented("Change a job type's flow control (pause, running caps, rate), its key modes "
            "(fairness, ordering, on_failure) or push delivery; from the next claim on.",
            body=TypePatchSchema, body_required=True,
            replies=[Reply(200, "The type as changed.", TypeSchema)], errors=[404])
@require_roles(Role.ADMIN)
def update_type(job_type: str) -> Response:
    body = load_body(_patch_schema)
    return jsonify(represent_type(_service().update_type(job_type, body)))
