"""marshmallow schemas of the schedule routes: the bodies, and the schedule as shown.

A schedule's template is a job (`job`, a POST /jobs body) or a workflow (`workflow`, a POST
/workflows body), exactly one. Both are stored in the schedules table's `job` column as
compact JSON: a job template as its body, a workflow template as {"workflow": <its body>}
(no job template is an object with that key alone: a job's `type` is required).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from app.core.clock import to_rfc3339
from app.core.limits import CRON_CHARS, NAME_CHARS, TIMEZONE_CHARS, WORKFLOW_JOBS
from app.core.priorities import Priority
from app.jobs.domain.cursor import encode_name_cursor
from app.jobs.web.requests import EnqueueSchema
from app.schedules.models import CatchUp, Schedule
from app.web.fields import NO_NUL, StrictBoolean, StrictSchema, length_within, render_page
from app.workflows.schemas import WorkflowCreateSchema, WorkflowJobSchema

NAME_PATTERN = rf"^[A-Za-z0-9._-]{{{NAME_CHARS.min},{NAME_CHARS.max}}}\Z"
_CATCH_UP = [policy.value for policy in CatchUp]
_EXAMPLE_JOB = {"type": "email", "payload": {"report": "daily"}, "priority": "low",
                "max_retries": 3}
_EXAMPLE_WORKFLOW = {"name": "nightly-export",
                     "jobs": [{"ref": "export", "type": "export", "payload": {"table": "orders"}},
                              {"ref": "mail", "type": "email", "depends_on": ["export"]}]}
# The key a workflow template is stored under (module docstring), and the prefix of its
# jobs' fields in errors (`workflow.jobs.1.depends_on`).
WORKFLOW_KEY = "workflow"
WORKFLOW_JOBS_FIELD = "workflow.jobs"


class JobTemplateSchema(EnqueueSchema):
    """The job each slot enqueues: a POST /jobs body without run_at and delay_seconds (the
    slot is the job's time; so, without expires_at: expires_in_seconds counts from the
    slot's enqueue), without idempotency_key (each slot is a job of its own; the
    schedule and slot are its key) and without depends_on (a job that waits for others is a
    workflow template's: its jobs name each other)."""

    class Meta:
        exclude = ("run_at", "delay_seconds", "idempotency_key", "depends_on",
                   "on_dependency_failure", "expires_at", "reserve")

    openapi_extra: ClassVar[dict[str, Any]] = {"example": _EXAMPLE_JOB}


class WorkflowJobTemplateSchema(WorkflowJobSchema):
    """A job of a workflow template: a POST /workflows job without run_at, delay_seconds and
    idempotency_key (as a job template), and without unique (each slot's workflow is work of
    its own: a unique key met would put an earlier slot's job into this slot's workflow).
    depends_on names refs of the template; the service refuses job ids (each slot would wait
    on the same job, long finished or purged)."""

    class Meta:
        exclude = ("run_at", "delay_seconds", "idempotency_key", "unique", "expires_at")

    openapi_extra: ClassVar[dict[str, Any]] = {"example": _EXAMPLE_WORKFLOW["jobs"][1]}


class WorkflowTemplateSchema(WorkflowCreateSchema):
    """The workflow each slot creates: a POST /workflows body, its jobs as above."""

    openapi_extra: ClassVar[dict[str, Any]] = {"example": _EXAMPLE_WORKFLOW}

    jobs = fields.List(fields.Nested(WorkflowJobTemplateSchema), required=True,
                       validate=length_within(WORKFLOW_JOBS))


def _refuse_unless_one_template(data: dict[str, Any], *, required: bool) -> None:
    """job or workflow: both is a 422 on workflow; neither (on create) a 422 on job."""
    if "job" in data and WORKFLOW_KEY in data:
        raise ValidationError("Give job or workflow, not both.", WORKFLOW_KEY)
    if required and "job" not in data and WORKFLOW_KEY not in data:
        raise ValidationError("Missing data for required field: give job (a POST /jobs "
                              "body) or workflow (a POST /workflows body).", "job")


def _cron_field(**options: Any) -> fields.String:
    return fields.String(validate=[length_within(CRON_CHARS), NO_NUL], metadata={
        "description": "Five fields (minute hour day-of-month month day-of-week) or @hourly, "
                       "@daily, @weekly, @monthly, @yearly.", "example": "0 3 * * *"},
        **options)


def _timezone_field(**options: Any) -> fields.String:
    return fields.String(validate=[length_within(TIMEZONE_CHARS), NO_NUL], metadata={
        "description": "An IANA time zone name.", "example": "Europe/Berlin"}, **options)


class ScheduleCreateSchema(StrictSchema):
    """job or workflow, exactly one (said in JSON Schema as `oneOf`)."""

    openapi_extra: ClassVar[dict[str, Any]] = {"example": {
        "name": "nightly-report", "cron": "0 3 * * *", "timezone": "Europe/Berlin",
        "job": _EXAMPLE_JOB, "catch_up": "latest"},
        "oneOf": [{"required": ["job"]}, {"required": [WORKFLOW_KEY]}]}

    name = fields.String(required=True, validate=validate.Regexp(
        NAME_PATTERN, error=f"{NAME_CHARS.min} to {NAME_CHARS.max} letters, digits, '.', '_' "
                            "or '-'."))
    cron = _cron_field(required=True)
    timezone = _timezone_field(load_default="UTC")
    job = fields.Nested(JobTemplateSchema)
    workflow = fields.Nested(WorkflowTemplateSchema)
    catch_up = fields.String(load_default=CatchUp.LATEST.value,
                             validate=validate.OneOf(_CATCH_UP))
    paused = StrictBoolean(load_default=False)

    @validates_schema
    def _one_template(self, data: dict[str, Any], **_: Any) -> None:
        _refuse_unless_one_template(data, required=True)


class SchedulePatchSchema(StrictSchema):
    """Any of the fields; the others stay. Any change computes next_run_at again from now.
    job or workflow replaces the template, whichever it was (not both at once)."""

    openapi_extra: ClassVar[dict[str, Any]] = {"example": {"cron": "30 4 * * *"},
                                               "minProperties": 1,
                                               "not": {"required": ["job", WORKFLOW_KEY]}}

    cron = _cron_field()
    timezone = _timezone_field()
    job = fields.Nested(JobTemplateSchema)
    workflow = fields.Nested(WorkflowTemplateSchema)
    catch_up = fields.String(validate=validate.OneOf(_CATCH_UP))
    paused = StrictBoolean()

    @validates_schema
    def _one_template(self, data: dict[str, Any], **_: Any) -> None:
        _refuse_unless_one_template(data, required=False)


class ScheduleSchema(Schema):
    """The schedule as the API shows it (docs/SCHEDULES.md)."""

    name = fields.String(required=True)
    cron = fields.String(required=True)
    timezone = fields.String(required=True)
    job = fields.Dict(required=True, allow_none=True,
                      metadata={"description": "The job template; null for a workflow's."})
    workflow = fields.Dict(required=True, allow_none=True,
                           metadata={"description": "The workflow template; null for a job's."})
    catch_up = fields.String(required=True, validate=validate.OneOf(_CATCH_UP))
    paused = fields.Boolean(required=True)
    next_run_at = fields.String(required=True, metadata={"format": "date-time"})
    last_run_at = fields.String(required=True, allow_none=True,
                                metadata={"format": "date-time"})
    last_job_id = fields.Integer(required=True, allow_none=True, metadata={
        "description": "The newest slot's job (of a workflow template: its first job)."})
    last_workflow_id = fields.Integer(required=True, allow_none=True, metadata={
        "description": "The newest slot's workflow; null for a job template."})
    created_at = fields.String(required=True, metadata={"format": "date-time"})
    updated_at = fields.String(required=True, metadata={"format": "date-time"})


class ScheduleListSchema(Schema):
    schedules = fields.List(fields.Nested(ScheduleSchema), required=True)
    next_cursor = fields.String(required=True, allow_none=True)


def _job_body(template: dict[str, Any]) -> dict[str, Any]:
    """A loaded job (of a template) as the JSON body it stands for."""
    body = {name: value for name, value in template.items() if value is not None}
    if isinstance(body.get("priority"), Priority):
        body["priority"] = body["priority"].label
    return body


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def template_json(template: dict[str, Any]) -> str:
    """A loaded JobTemplateSchema as the compact JSON body it stands for (stored, and loaded
    through the same schema again at each firing)."""
    return _compact(_job_body(template))


def workflow_template_json(workflow: dict[str, Any]) -> str:
    """A loaded WorkflowTemplateSchema as stored: {"workflow": <the POST /workflows body it
    stands for>} (loaded through the same schema again at each firing)."""
    body: dict[str, Any] = {} if workflow.get("name") is None else {"name": workflow["name"]}
    body["jobs"] = [_job_body(job) for job in workflow["jobs"]]
    return _compact({WORKFLOW_KEY: body})


def stored_workflow(stored: Any) -> dict[str, Any] | None:
    """The workflow body of a stored template (parsed), None when it is a job template."""
    if isinstance(stored, dict) and len(stored) == 1:
        workflow = stored.get(WORKFLOW_KEY)
        if isinstance(workflow, dict):
            return workflow
    return None


def represent_schedule(schedule: Schedule) -> dict[str, Any]:
    template = json.loads(schedule.job)
    workflow = stored_workflow(template)
    return {
        "name": schedule.name,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "job": template if workflow is None else None,
        "workflow": workflow,
        "catch_up": schedule.catch_up,
        "paused": schedule.paused,
        "next_run_at": to_rfc3339(schedule.next_run_at),
        "last_run_at": to_rfc3339(schedule.last_run_at),
        "last_job_id": schedule.last_job_id,
        "last_workflow_id": schedule.last_workflow_id,
        "created_at": to_rfc3339(schedule.created_at),
        "updated_at": to_rfc3339(schedule.updated_at),
    }


def render_schedule_page(page: list[Schedule], next_cursor: str | None) -> bytes:
    """GET /schedules's body (ScheduleListSchema), cut to GET /jobs's byte budget as
    render_page says (a template may hold a payload up to the payload limit)."""
    return render_page("schedules", page, represent_schedule,
                       lambda schedule: encode_name_cursor(schedule.name), next_cursor,
                       longest_cursor=encode_name_cursor("x" * NAME_CHARS.max))
