"""marshmallow schemas of GET /stats (docs/OPERATIONS.md): its query and the buckets as shown."""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, fields, validate

from app.core.clock import to_rfc3339
from app.core.limits import TYPE_CHARS
from app.stats.models import Series, Step
from app.web.fields import StrictSchema, Timestamp, non_empty_text

_DATE_TIME = {"format": "date-time"}


class StatsQuerySchema(StrictSchema):
    type = non_empty_text(TYPE_CHARS)
    from_ = Timestamp(data_key="from", metadata={
        **_DATE_TIME, "description": "RFC 3339; default: an hour before `to`."})
    to = Timestamp(metadata={**_DATE_TIME, "description": "RFC 3339; default: now."})
    step = fields.String(load_default=Step.MINUTE.value,
                         validate=validate.OneOf([step.value for step in Step]))


class BucketSchema(Schema):
    at = fields.String(required=True, metadata={
        **_DATE_TIME, "description": "The bucket's start."})
    enqueued = fields.Integer(required=True, metadata={
        "description": "Jobs enqueued (a reserved job: once confirmed)."})
    claimed = fields.Integer(required=True, metadata={"description": "Attempts started."})
    completed = fields.Integer(required=True, metadata={"description": "Jobs completed."})
    failed = fields.Integer(required=True, metadata={
        "description": "Attempts that failed (a fail, a lease run out, a deadline passed), "
                       "retried or not."})
    pending = fields.Integer(required=True, allow_none=True, metadata={
        "description": "Pending jobs at the bucket's end; null before the first count and "
                       "for buckets still to come."})


class StatsSchema(Schema):
    type = fields.String(required=True, allow_none=True, metadata={
        "description": "null: every type's, summed."})
    step = fields.String(required=True, metadata={"enum": [step.value for step in Step]})
    buckets = fields.List(fields.Nested(BucketSchema), required=True, metadata={
        "description": "Oldest first, the empty ones included."})


def represent_series(series: Series) -> dict[str, Any]:
    return {"type": series.job_type, "step": series.step.value, "buckets": [
        {"at": to_rfc3339(bucket.at_us), "enqueued": bucket.enqueued,
         "claimed": bucket.claimed, "completed": bucket.completed, "failed": bucket.failed,
         "pending": bucket.pending} for bucket in series.buckets]}
