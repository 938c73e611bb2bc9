"""Thin handlers of the failure groups (docs/OPERATIONS.md): admins only."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify

from app.core.callers import Role
from app.core.errors import NotFound
from app.core.fingerprint import FINGERPRINT_PATTERN
from app.history.failure_schemas import (
    FailureGroupDetailSchema,
    FailureGroupListSchema,
    FailureQuerySchema,
    represent_detail,
    represent_group,
)
from app.history.failures import FailureGroups
from app.web.auth import require_roles
from app.web.http import load_query, refuse_query_parameters
from app.web.openapi import Reply, documented

bp = Blueprint("failures", __name__)

_query_schema = FailureQuerySchema()


def _groups() -> FailureGroups:
    groups: FailureGroups = current_app.extensions["queuelog"].failures
    return groups


@bp.get("/failures")
@documented("Failed attempts grouped by what went wrong: one group per type and fingerprint "
            "of the (redacted) error, most recently seen first.",
            query=FailureQuerySchema,
            replies=[Reply(200, "The groups.", FailureGroupListSchema)])
@require_roles(Role.ADMIN)
def list_failures() -> Response:
    query = load_query(_query_schema)
    groups = _groups().groups(job_type=query.get("type"), since_us=query.get("since"),
                              limit=query["limit"])
    return jsonify({"groups": [represent_group(group) for group in groups]})


@bp.get("/failures/<job_type>/<fingerprint>")
@documented("One failure group: its failed attempts per hour over the last day and its "
            "newest jobs.",
            replies=[Reply(200, "The group.", FailureGroupDetailSchema)], errors=[404])
@require_roles(Role.ADMIN)
def get_failure_group(job_type: str, fingerprint: str) -> Response:
    refuse_query_parameters()
    if not FINGERPRINT_PATTERN.fullmatch(fingerprint):
        raise NotFound("No such failure group.")
    return jsonify(represent_detail(_groups().detail(job_type, fingerprint)))
