"""marshmallow schemas of GET /failures (docs/OPERATIONS.md): its query and the groups as shown."""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, fields

from app.core.clock import to_rfc3339
from app.core.limits import PAGE_ITEMS, TYPE_CHARS
from app.history.failures import FAILING_NOW_EXAMINED, GroupDetail
from app.jobs.timeline.failure_repository import FailureGroup
from app.web.fields import QueryInteger, StrictSchema, Timestamp, non_empty_text, within

_DATE_TIME = {"format": "date-time"}


class FailureQuerySchema(StrictSchema):
    type = non_empty_text(TYPE_CHARS)
    since = Timestamp(metadata={**_DATE_TIME, "description": "Only the groups last seen "
                                                             "since then (RFC 3339)."})
    limit = QueryInteger(load_default=PAGE_ITEMS.default, validate=within(PAGE_ITEMS))


class FailureGroupSchema(Schema):
    fingerprint = fields.String(required=True, metadata={
        "description": "16 hex digits: the hash of the error with its numbers, hex strings, "
                       "UUIDs, quoted values and addresses replaced by placeholders. "
                       "POST /jobs/retry-many takes it as a filter."})
    sample = fields.String(required=True, metadata={
        "description": "The group's newest error, redacted as every stored error is."})
    type = fields.String(required=True)
    count = fields.Integer(required=True, metadata={"description": "Failed attempts with it."})
    jobs_failed = fields.Integer(required=True, metadata={
        "description": "Jobs that ended failed (no retries left) with it."})
    first_seen = fields.String(required=True, metadata=_DATE_TIME)
    last_seen = fields.String(required=True, metadata=_DATE_TIME)


class FailureGroupListSchema(Schema):
    groups = fields.List(fields.Nested(FailureGroupSchema), required=True)


class HourCountSchema(Schema):
    hour = fields.String(required=True, metadata=_DATE_TIME)
    count = fields.Integer(required=True)


class FailureGroupDetailSchema(FailureGroupSchema):
    hourly = fields.List(fields.Nested(HourCountSchema), required=True, metadata={
        "description": "Failed attempts per hour over the last 24 hours, oldest first."})
    newest_job_ids = fields.List(fields.Integer(), required=True, metadata={
        "description": "The jobs of its newest failed attempts (up to 10), newest first."})
    failing_now = fields.Integer(required=True, metadata={
        "description": "Its jobs that are failed now with it as their last error (what "
                       "POST /jobs/retry-many with its fingerprint takes), among the jobs of "
                       f"its newest {FAILING_NOW_EXAMINED:,} attempts."})
    failing_now_capped = fields.Boolean(required=True, metadata={
        "description": f"True when the group keeps more than {FAILING_NOW_EXAMINED:,} "
                       "attempts: failing_now is then a lower bound."})


def represent_group(group: FailureGroup) -> dict[str, Any]:
    return {"fingerprint": group.fingerprint, "sample": group.sample, "type": group.type,
            "count": group.count, "jobs_failed": group.jobs_failed,
            "first_seen": to_rfc3339(group.first_seen),
            "last_seen": to_rfc3339(group.last_seen)}


def represent_detail(detail: GroupDetail) -> dict[str, Any]:
    return {**represent_group(detail.group),
            "hourly": [{"hour": to_rfc3339(hour), "count": count}
                       for hour, count in detail.hourly],
            "newest_job_ids": detail.newest_job_ids,
            "failing_now": detail.failing_now.value,
            "failing_now_capped": detail.failing_now.capped}
