"""marshmallow schemas of the type routes: the PATCH body and the type as shown."""

from __future__ import annotations

from typing import Any, ClassVar

from marshmallow import Schema, ValidationError, fields, validate

from app.clock import to_rfc3339
from app.jobs.schemas import StrictInteger, StrictNumber, StrictSchema
from app.types.models import MAX_LIMIT, MAX_RATE, MIN_RATE
from app.types.service import TypeView


class StrictBoolean(fields.Boolean):
    """true or false as JSON: no 1, no "yes"."""

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise self.make_error("invalid")
        return value


def _no_push_yet(value: Any) -> None:
    raise ValidationError("Push delivery is not available in this version; only null is "
                          "accepted.")


def _limit(description: str) -> StrictInteger:
    return StrictInteger(allow_none=True, validate=validate.Range(1, MAX_LIMIT),
                         metadata={"description": description})


class TypePatchSchema(StrictSchema):
    """Any of the settings; a field left out is left as it is, null clears a limit."""

    openapi_extra: ClassVar[dict[str, Any]] = {
        "example": {"max_running": 5, "rate_per_second": 10, "burst": 20}}

    paused = StrictBoolean(metadata={"description": "No job of the type is claimed while "
                                                    "paused; enqueues are still accepted."})
    max_running = _limit("Running jobs of the type, across every process and host.")
    max_running_per_key = _limit("Running jobs per concurrency_key of the type.")
    rate_per_second = StrictNumber(allow_none=True, validate=validate.Range(MIN_RATE, MAX_RATE),
                                   metadata={"description": "Claims per second (token "
                                                            "bucket)."})
    burst = StrictInteger(allow_none=True, validate=validate.Range(1, MAX_LIMIT),
                          metadata={"description": "Tokens the bucket holds at most; null: "
                                                   "ceil(rate_per_second), at least 1."})
    # Documented as null alone, so that generated clients (and schemathesis) send only what
    # this version accepts.
    push = fields.Raw(allow_none=True, validate=_no_push_yet,
                      metadata={"enum": [None], "description": "Push delivery is not available "
                                                               "yet: only null."})


class TypeCountsSchema(Schema):
    pending = fields.Integer(required=True)
    scheduled = fields.Integer(required=True, metadata={
        "description": "The part of pending whose run_at is in the future."})
    running = fields.Integer(required=True)
    completed = fields.Integer(required=True)
    failed = fields.Integer(required=True)
    cancelled = fields.Integer(required=True)


class TypeSchema(Schema):
    """A job type as GET /types shows it. Documents what `represent_type` builds."""

    type = fields.String(required=True)
    paused = fields.Boolean(required=True)
    max_running = fields.Integer(required=True, allow_none=True)
    max_running_per_key = fields.Integer(required=True, allow_none=True)
    rate_per_second = fields.Float(required=True, allow_none=True)
    burst = fields.Integer(required=True)
    push = fields.Dict(required=True, allow_none=True)
    counts = fields.Nested(TypeCountsSchema, required=True, metadata={
        "description": "completed, failed and cancelled may be a few seconds old."})
    oldest_claimable_age_seconds = fields.Float(required=True, allow_none=True)
    last_claim_at = fields.String(required=True, allow_none=True,
                                  metadata={"format": "date-time"})


class TypeListSchema(Schema):
    types = fields.List(fields.Nested(TypeSchema), required=True)


def represent_type(view: TypeView) -> dict[str, Any]:
    s, c = view.settings, view.counts
    return {
        "type": s.type,
        "paused": s.paused,
        "max_running": s.max_running,
        "max_running_per_key": s.max_running_per_key,
        "rate_per_second": s.rate_per_second,
        "burst": s.effective_burst,
        "push": None,
        "counts": {"pending": c.pending, "scheduled": c.scheduled, "running": c.running,
                   "completed": c.completed, "failed": c.failed, "cancelled": c.cancelled},
        "oldest_claimable_age_seconds": view.oldest_claimable_age_seconds,
        "last_claim_at": to_rfc3339(s.last_claim_at),
    }
