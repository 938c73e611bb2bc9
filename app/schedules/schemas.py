"""marshmallow schemas of the schedule routes: the bodies, and the schedule as shown."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from marshmallow import Schema, fields, validate

from app.core.clock import to_rfc3339
from app.core.limits import CRON_CHARS, NAME_CHARS, TIMEZONE_CHARS
from app.core.priorities import Priority
from app.jobs.cursor import encode_name_cursor
from app.jobs.schemas import EnqueueSchema
from app.schedules.models import CatchUp, Schedule
from app.web.fields import StrictBoolean, StrictSchema, length_within, render_page

NAME_PATTERN = rf"^[A-Za-z0-9._-]{{{NAME_CHARS.min},{NAME_CHARS.max}}}\Z"
_NO_NUL = validate.Regexp(r"^[^\x00]*\Z", error="Must not contain NUL characters.")
_CATCH_UP = [policy.value for policy in CatchUp]
_EXAMPLE_JOB = {"type": "email", "payload": {"report": "daily"}, "priority": "low",
                "max_retries": 3}


class JobTemplateSchema(EnqueueSchema):
    """The job each slot enqueues: a POST /jobs body without run_at and delay_seconds (the
    slot is the job's time) and without idempotency_key (each slot is a job of its own; the
    schedule and slot are its key)."""

    class Meta:
        exclude = ("run_at", "delay_seconds", "idempotency_key")

    openapi_extra: ClassVar[dict[str, Any]] = {"example": _EXAMPLE_JOB}


def _cron_field(**options: Any) -> fields.String:
    return fields.String(validate=[length_within(CRON_CHARS), _NO_NUL], metadata={
        "description": "Five fields (minute hour day-of-month month day-of-week) or @hourly, "
                       "@daily, @weekly, @monthly, @yearly.", "example": "0 3 * * *"},
        **options)


def _timezone_field(**options: Any) -> fields.String:
    return fields.String(validate=[length_within(TIMEZONE_CHARS), _NO_NUL], metadata={
        "description": "An IANA time zone name.", "example": "Europe/Berlin"}, **options)


class ScheduleCreateSchema(StrictSchema):
    openapi_extra: ClassVar[dict[str, Any]] = {"example": {
        "name": "nightly-report", "cron": "0 3 * * *", "timezone": "Europe/Berlin",
        "job": _EXAMPLE_JOB, "catch_up": "latest"}}

    name = fields.String(required=True, validate=validate.Regexp(
        NAME_PATTERN, error=f"{NAME_CHARS.min} to {NAME_CHARS.max} letters, digits, '.', '_' "
                            "or '-'."))
    cron = _cron_field(required=True)
    timezone = _timezone_field(load_default="UTC")
    job = fields.Nested(JobTemplateSchema, required=True)
    catch_up = fields.String(load_default=CatchUp.LATEST.value,
                             validate=validate.OneOf(_CATCH_UP))
    paused = StrictBoolean(load_default=False)


class SchedulePatchSchema(StrictSchema):
    """Any of the fields; the others stay. Any change computes next_run_at again from now."""

    openapi_extra: ClassVar[dict[str, Any]] = {"example": {"cron": "30 4 * * *"},
                                               "minProperties": 1}

    cron = _cron_field()
    timezone = _timezone_field()
    job = fields.Nested(JobTemplateSchema)
    catch_up = fields.String(validate=validate.OneOf(_CATCH_UP))
    paused = StrictBoolean()


class ScheduleSchema(Schema):
    """The schedule as the API shows it (contract section 11)."""

    name = fields.String(required=True)
    cron = fields.String(required=True)
    timezone = fields.String(required=True)
    job = fields.Dict(required=True)
    catch_up = fields.String(required=True, validate=validate.OneOf(_CATCH_UP))
    paused = fields.Boolean(required=True)
    next_run_at = fields.String(required=True, metadata={"format": "date-time"})
    last_run_at = fields.String(required=True, allow_none=True,
                                metadata={"format": "date-time"})
    last_job_id = fields.Integer(required=True, allow_none=True)
    created_at = fields.String(required=True, metadata={"format": "date-time"})
    updated_at = fields.String(required=True, metadata={"format": "date-time"})


class ScheduleListSchema(Schema):
    schedules = fields.List(fields.Nested(ScheduleSchema), required=True)
    next_cursor = fields.String(required=True, allow_none=True)


def template_json(template: dict[str, Any]) -> str:
    """A loaded JobTemplateSchema as the compact JSON body it stands for (stored, and loaded
    through the same schema again at each firing)."""
    body = {name: value for name, value in template.items() if value is not None}
    if isinstance(body.get("priority"), Priority):
        body["priority"] = body["priority"].label
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


def represent_schedule(schedule: Schedule) -> dict[str, Any]:
    return {
        "name": schedule.name,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "job": json.loads(schedule.job),
        "catch_up": schedule.catch_up,
        "paused": schedule.paused,
        "next_run_at": to_rfc3339(schedule.next_run_at),
        "last_run_at": to_rfc3339(schedule.last_run_at),
        "last_job_id": schedule.last_job_id,
        "created_at": to_rfc3339(schedule.created_at),
        "updated_at": to_rfc3339(schedule.updated_at),
    }


def render_schedule_page(page: list[Schedule], next_cursor: str | None) -> bytes:
    """GET /schedules's body (ScheduleListSchema), cut to GET /jobs's byte budget as
    render_page says (a template may hold a payload up to the payload limit)."""
    return render_page("schedules", page, represent_schedule,
                       lambda schedule: encode_name_cursor(schedule.name), next_cursor,
                       longest_cursor=encode_name_cursor("x" * NAME_CHARS.max))
