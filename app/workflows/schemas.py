"""marshmallow schemas of /workflows: the body, the listing's query, the workflow as shown."""

from __future__ import annotations

from typing import Any, ClassVar

from marshmallow import Schema, fields, validate

from app.core.clock import to_rfc3339
from app.core.limits import WORKFLOW_JOBS, WORKFLOW_NAME_CHARS
from app.core.statuses import REMOVED, JobStatus
from app.jobs.web.requests import GraphItemSchema, ref_field
from app.web.fields import (
    PRINTABLE_ASCII_TEXT,
    PageQuerySchema,
    StrictSchema,
    length_within,
)
from app.workflows.models import WorkflowStatus, WorkflowView

_WORKFLOW_STATUS = validate.OneOf([status.value for status in WorkflowStatus])


class WorkflowJobSchema(GraphItemSchema):
    """A job of a workflow: a POST /jobs body with its ref (required), depends_on naming
    other items' refs (in any order) and existing jobs' ids."""

    ref = ref_field(required=True, metadata={"description": "Unique in the workflow; other "
                                                            "jobs' depends_on name it."})


class WorkflowCreateSchema(StrictSchema):
    openapi_extra: ClassVar[dict[str, Any]] = {"example": {
        "name": "order-1001",
        "jobs": [{"ref": "charge", "type": "charge", "payload": {"order": 1001}},
                 {"ref": "mail", "type": "email", "depends_on": ["charge"]},
                 {"ref": "ship", "type": "ship", "depends_on": ["charge"]},
                 {"ref": "done", "type": "notify", "depends_on": ["mail", "ship"],
                  "on_dependency_failure": "run"}]}}

    name = fields.String(validate=[length_within(WORKFLOW_NAME_CHARS), PRINTABLE_ASCII_TEXT])
    jobs = fields.List(fields.Nested(WorkflowJobSchema), required=True,
                       validate=length_within(WORKFLOW_JOBS))


class WorkflowListQuerySchema(PageQuerySchema):
    status = fields.String(validate=_WORKFLOW_STATUS)


# A job's status, or removed: retention removed it (it had finished).
_STATUSES = [*(status.value for status in JobStatus), REMOVED]


class WorkflowJobShownSchema(Schema):
    ref = fields.String(required=True)
    id = fields.Integer(required=True)
    type = fields.String(required=True, allow_none=True,
                         metadata={"description": "null once the job was removed."})
    status = fields.String(required=True, validate=validate.OneOf(_STATUSES), metadata={
        "description": "removed: retention removed the job, which had finished."})
    depends_on = fields.List(fields.Integer(), required=True, metadata={
        "description": "[] once the job was removed."})


class WorkflowSummarySchema(Schema):
    id = fields.Integer(required=True)
    name = fields.String(required=True, allow_none=True)
    status = fields.String(required=True, validate=_WORKFLOW_STATUS)
    counts = fields.Dict(keys=fields.String(validate=validate.OneOf(_STATUSES)),
                         values=fields.Integer(), required=True, metadata={
        "description": "How many of its jobs are in each status (every status named, 0 for "
                       "none), and how many retention removed (removed): they add up to "
                       "its jobs."})
    created_at = fields.String(required=True, metadata={"format": "date-time"})


class WorkflowSchema(WorkflowSummarySchema):
    jobs = fields.List(fields.Nested(WorkflowJobShownSchema), required=True)


class WorkflowCreatedSchema(WorkflowSummarySchema):
    jobs = fields.Dict(keys=fields.String(), values=fields.Integer(), required=True,
                       metadata={"description": "Each job's id, by ref."})


class WorkflowListSchema(Schema):
    workflows = fields.List(fields.Nested(WorkflowSummarySchema), required=True)
    next_cursor = fields.String(required=True, allow_none=True)


def represent_summary(view: WorkflowView) -> dict[str, Any]:
    workflow = view.workflow
    return {"id": workflow.id, "name": workflow.name, "status": view.status,
            "counts": view.counts, "created_at": to_rfc3339(workflow.created_at)}


def represent_workflow(view: WorkflowView) -> dict[str, Any]:
    """GET /workflows/{id}: the workflow and each job's ref, id, type, status, depends_on."""
    return represent_summary(view) | {"jobs": [
        {"ref": job.ref, "id": job.id, "type": job.type, "status": job.status,
         "depends_on": list(job.depends_on)} for job in view.jobs or ()]}


def represent_created(view: WorkflowView) -> dict[str, Any]:
    """POST /workflows: the workflow and its jobs' ids by ref."""
    return represent_summary(view) | {"jobs": view.job_ids}
