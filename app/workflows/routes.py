"""Thin handlers of /workflows (producers and admins): schema in, service, schema out."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify, request, url_for

from app.core.callers import Role
from app.core.tracecontext import trace_of_headers
from app.web.auth import current_caller, require_roles
from app.web.fields import EmptySchema
from app.web.http import (
    idempotency_key_header,
    load_body,
    load_query,
    refuse_query_parameters,
)
from app.web.openapi import Reply, documented
from app.workflows.schemas import (
    WorkflowCreatedSchema,
    WorkflowCreateSchema,
    WorkflowListQuerySchema,
    WorkflowListSchema,
    WorkflowSchema,
    represent_created,
    represent_summary,
    represent_workflow,
)
from app.workflows.service import WorkflowService

bp = Blueprint("workflows", __name__)

_create_schema = WorkflowCreateSchema()
_list_query_schema = WorkflowListQuerySchema()
_no_body_schema = EmptySchema()
_WORKFLOW = Reply(200, "The workflow with its jobs.", WorkflowSchema)


@bp.before_request
def _refuse_query_parameters() -> None:
    if request.endpoint != "workflows.list_workflows":
        refuse_query_parameters()


def _service() -> WorkflowService:
    service: WorkflowService = current_app.extensions["queuelog"].workflows
    return service


@bp.post("/workflows")
@documented("Enqueue a graph of jobs in one transaction: each job's depends_on names other "
            "jobs of the workflow by ref, or existing jobs by id.",
            body=WorkflowCreateSchema, body_required=True, request_headers=["IdempotencyKey"],
            replies=[Reply(201, "The workflow; its jobs' ids by ref.", WorkflowCreatedSchema,
                           ("Location",)),
                     Reply(200, "A replay: the workflow this Idempotency-Key created before.",
                           WorkflowCreatedSchema, ("Location", "Idempotent-Replayed"))],
            errors=[409])
@require_roles(Role.PRODUCER, Role.ADMIN)
def create_workflow() -> Response:
    header_key = idempotency_key_header()
    body = load_body(_create_schema)
    view, replayed = _service().create(current_caller(), body, header_key,
                                       trace=trace_of_headers(request.headers))
    response = jsonify(represent_created(view))
    response.status_code = 200 if replayed else 201
    response.headers["Location"] = url_for("workflows.get_workflow",
                                           workflow_id=view.workflow.id)
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return response


@bp.get("/workflows")
@documented("List the workflows the caller may see, by id.",
            query=WorkflowListQuerySchema,
            replies=[Reply(200, "A page of workflows and the cursor of the next page.",
                           WorkflowListSchema)])
@require_roles(Role.PRODUCER, Role.ADMIN)
def list_workflows() -> Response:
    query = load_query(_list_query_schema)
    page, next_cursor = _service().list(current_caller(), status=query.get("status"),
                                        limit=query["limit"], cursor=query.get("cursor"))
    return jsonify({"workflows": [represent_summary(view) for view in page],
                    "next_cursor": next_cursor})


@bp.get("/workflows/<id:workflow_id>")
@documented("Read a workflow: its status and each job's ref, id, status and depends_on.",
            replies=[_WORKFLOW], errors=[404])
@require_roles(Role.PRODUCER, Role.ADMIN)
def get_workflow(workflow_id: int) -> Response:
    return jsonify(represent_workflow(_service().get(current_caller(), workflow_id)))


@bp.post("/workflows/<id:workflow_id>/cancel")
@documented("Cancel every waiting and pending job of a workflow; running ones finish.",
            body=EmptySchema, replies=[_WORKFLOW], errors=[404])
@require_roles(Role.PRODUCER, Role.ADMIN)
def cancel_workflow(workflow_id: int) -> Response:
    load_body(_no_body_schema)
    return jsonify(represent_workflow(_service().cancel(current_caller(), workflow_id)))
