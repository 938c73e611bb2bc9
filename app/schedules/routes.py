"""Thin handlers of /schedules (admins only): load with a schema, call the service, answer."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify, request, url_for

from app.core.callers import Role
from app.core.tracecontext import trace_of_headers
from app.schedules.schemas import (
    ScheduleCreateSchema,
    ScheduleListSchema,
    SchedulePatchSchema,
    ScheduleSchema,
    render_schedule_page,
    represent_schedule,
)
from app.schedules.service import ScheduleService
from app.web.auth import require_roles
from app.web.fields import PageQuerySchema
from app.web.http import load_body, load_query, no_content, refuse_query_parameters
from app.web.openapi import Reply, documented

bp = Blueprint("schedules", __name__)

_create_schema = ScheduleCreateSchema()
_patch_schema = SchedulePatchSchema()
_page_schema = PageQuerySchema()
# `job` is a POST /jobs body and `workflow` a POST /workflows body: a payload's depth is
# counted as those routes count it.
TEMPLATE_ENVELOPE = ("job", "workflow")


@bp.before_request
def _refuse_query_parameters() -> None:
    # Only the listing pages (limit, cursor); every other route takes none.
    if request.endpoint != "schedules.list_schedules":
        refuse_query_parameters()


def _service() -> ScheduleService:
    service: ScheduleService = current_app.extensions["queuelog"].schedules
    return service


@bp.post("/schedules")
@documented("Create a schedule: each slot of its cron expression enqueues one job (`job`) "
            "or creates one workflow (`workflow`).",
            body=ScheduleCreateSchema, body_required=True,
            replies=[Reply(201, "The new schedule.", ScheduleSchema, ("Location",))],
            errors=[409])
@require_roles(Role.ADMIN)
def create_schedule() -> Response:
    schedule = _service().create_schedule(load_body(_create_schema, TEMPLATE_ENVELOPE),
                                          trace_of_headers(request.headers))
    response = jsonify(represent_schedule(schedule))
    response.status_code = 201
    response.headers["Location"] = url_for("schedules.get_schedule", name=schedule.name)
    return response


@bp.get("/schedules")
@documented("List the schedules, by name, a page at a time (as GET /jobs pages).",
            query=PageQuerySchema,
            replies=[Reply(200, "A page of schedules and the cursor of the next page.",
                           ScheduleListSchema)])
@require_roles(Role.ADMIN)
def list_schedules() -> Response:
    query = load_query(_page_schema)
    page, next_cursor = _service().list_schedules(limit=query["limit"],
                                                  cursor=query.get("cursor"))
    return Response(render_schedule_page(page, next_cursor), mimetype="application/json")


@bp.get("/schedules/<name>")
@documented("A schedule.", replies=[Reply(200, "The schedule.", ScheduleSchema)], errors=[404])
@require_roles(Role.ADMIN)
def get_schedule(name: str) -> Response:
    return jsonify(represent_schedule(_service().get_schedule(name)))


@bp.patch("/schedules/<name>")
@documented("Change a schedule (cron, timezone, job or workflow, catch_up, paused); its "
            "next slot is computed again from now.",
            body=SchedulePatchSchema, body_required=True,
            replies=[Reply(200, "The schedule as changed.", ScheduleSchema)], errors=[404])
@require_roles(Role.ADMIN)
def update_schedule(name: str) -> Response:
    body = load_body(_patch_schema, TEMPLATE_ENVELOPE)
    return jsonify(represent_schedule(_service().update_schedule(name, body)))


@bp.delete("/schedules/<name>")
@documented("Delete a schedule; the jobs it enqueued stay.",
            replies=[Reply(204, "Deleted.")], errors=[404])
@require_roles(Role.ADMIN)
def delete_schedule(name: str) -> Response:
    _service().delete_schedule(name)
    return no_content()
