"""What the routes of waits take (docs/WAITS.md): a suspend's wait, an event, a token's
answer. The moments a wait names are checked against the clock by the route (a 422 naming
the field, as here)."""

from __future__ import annotations

from typing import Any, ClassVar

from marshmallow import ValidationError, fields, validate, validates_schema

from app.core.limits import EVENT_KEY_CHARS, EVENT_NAME_CHARS, NAME_CHARS, WAIT_SECONDS
from app.jobs.web.requests import LeaseFencedSchema, checkpoint_field
from app.web.fields import (
    PRINTABLE_ASCII_TEXT,
    StrictBoolean,
    StrictInteger,
    StrictSchema,
    Timestamp,
    length_within,
    within,
)


def _event_name(**options: Any) -> fields.String:
    return fields.String(validate=[length_within(EVENT_NAME_CHARS), PRINTABLE_ASCII_TEXT],
                         **options)


def _event_key() -> fields.String:
    # Printable ASCII or empty: a key is an id of the producer's (an order's, a user's).
    return fields.String(load_default="", validate=[
        length_within(EVENT_KEY_CHARS),
        validate.Regexp(r"^[\x20-\x7e]*\Z", error="Must be printable ASCII.")])


class WaitForSchema(StrictSchema):
    """An event of the job's producer, or a waitpoint token; each with its timeout."""

    event = _event_name(metadata={"example": "order.paid"})
    key = _event_key()
    token = StrictBoolean(metadata={"description": "true: wait for a waitpoint token's "
                                                   "answer (the suspend's answer carries it)."})
    timeout_seconds = StrictInteger(required=True, validate=within(WAIT_SECONDS))

    @validates_schema
    def _one_kind(self, data: dict[str, Any], **_kwargs: Any) -> None:
        if data.get("token") is False:
            raise ValidationError("Must be true, or left out.", "token")
        if ("event" in data) == bool(data.get("token")):
            raise ValidationError("Give one of event or token.",
                                  "token" if "event" in data else "event")
        if data.get("token") and data.get("key"):
            raise ValidationError("A token wait takes no key.", "key")


class SuspendSchema(LeaseFencedSchema):
    openapi_extra: ClassVar[dict[str, Any]] = {"example": {
        "wait_for": {"event": "order.shipped", "key": "1001", "timeout_seconds": 604800},
        "checkpoint": {"charged": True}}}

    seconds = StrictInteger(validate=within(WAIT_SECONDS), metadata={
        "description": "A durable sleep of this many seconds."})
    until = Timestamp(metadata={"format": "date-time", "description": "A durable sleep to "
                                "this moment (in the future, at most a year ahead)."})
    wait_for = fields.Nested(WaitForSchema)
    checkpoint = checkpoint_field()

    @validates_schema
    def _one_wait(self, data: dict[str, Any], **_kwargs: Any) -> None:
        given = [name for name in ("seconds", "until", "wait_for") if name in data]
        if not given:
            raise ValidationError("Give one of seconds, until or wait_for.", "seconds")
        if len(given) > 1:
            raise ValidationError("Give one of seconds, until or wait_for, not "
                                  f"{' and '.join(given)}.", given[-1])


class PostEventSchema(StrictSchema):
    openapi_extra: ClassVar[dict[str, Any]] = {"example": {
        "name": "order.shipped", "key": "1001", "data": {"carrier": "DHL"}}}

    name = _event_name(required=True)
    key = _event_key()
    data = fields.Dict(load_default=None, allow_none=True)
    producer = fields.String(validate=[length_within(NAME_CHARS), PRINTABLE_ASCII_TEXT],
                             metadata={"description": "The producer key (by name) whose jobs "
                                                      "the event is for: the caller's own by "
                                                      "default; another's, admins only "
                                                      "(403)."})


class EventPostedSchema(StrictSchema):
    woken = fields.Integer(required=True, metadata={
        "description": "How many suspended jobs it resumed; 0: it is kept for the first "
                       "wait for it (QUEUELOG_EVENT_KEEP_SECONDS)."})


class WaitpointAnswerSchema(StrictSchema):
    openapi_extra: ClassVar[dict[str, Any]] = {"example": {"data": {"approved": True}}}

    data = fields.Dict(load_default=None, allow_none=True)


class WaitpointCompletedSchema(StrictSchema):
    job_id = fields.Integer(required=True)
    completed_at = fields.String(required=True, metadata={"format": "date-time"})

