"""How attempts and events are shown. Built by hand (the schemas document them in
/openapi.json), like the job itself."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from marshmallow import Schema, fields, validate

from app.core.clock import to_rfc3339
from app.history.explain import Explanation, ReasonCode
from app.history.service import Worker
from app.jobs.domain.history import Attempt, EventName, JobEvent, Outcome

_DATE_TIME = {"format": "date-time"}


class AttemptSchema(Schema):
    number = fields.Integer(required=True)
    worker_id = fields.String(required=True)
    claimed_at = fields.String(required=True, metadata=_DATE_TIME)
    ended_at = fields.String(required=True, allow_none=True, metadata=_DATE_TIME)
    outcome = fields.String(required=True, validate=validate.OneOf([o.value for o in Outcome]))
    error = fields.String(allow_none=True, metadata={"description": "Admins only."})
    fingerprint = fields.String(allow_none=True, metadata={
        "description": "Admins only: the failure group of an attempt that ended with an "
                       "error (GET /failures)."})
    duration_ms = fields.Integer(required=True, allow_none=True)


class AttemptListSchema(Schema):
    attempts = fields.List(fields.Nested(AttemptSchema), required=True)


class EventSchema(Schema):
    at = fields.String(required=True, metadata=_DATE_TIME)
    event = fields.String(required=True, validate=validate.OneOf([e.value for e in EventName]))
    actor = fields.String(required=True, metadata={
        "description": "The key's name, or `queuelog` for the service's own acts."})
    detail = fields.Dict(required=True, allow_none=True)


class EventListSchema(Schema):
    events = fields.List(fields.Nested(EventSchema), required=True)


class WorkerSchema(Schema):
    name = fields.String(required=True)
    types = fields.List(fields.String(), required=True, allow_none=True, metadata={
        "description": "The types the key may claim; null for every type."})
    last_seen_at = fields.String(required=True, allow_none=True, metadata={
        **_DATE_TIME, "description": "Its last claim, heartbeat or report, to about a minute."})
    running = fields.Integer(required=True)


class WorkerListSchema(Schema):
    workers = fields.List(fields.Nested(WorkerSchema), required=True)


class ReasonSchema(Schema):
    # Each code carries its own evidence beside code and message.
    openapi_extra: ClassVar[dict[str, Any]] = {"additionalProperties": True}

    code = fields.String(required=True,
                         validate=validate.OneOf([code.value for code in ReasonCode]))
    message = fields.String(required=True)


class ExplanationSchema(Schema):
    job_id = fields.Integer(required=True)
    status = fields.String(required=True)
    claimable_now = fields.Boolean(required=True)
    reasons = fields.List(fields.Nested(ReasonSchema), required=True, metadata={
        "description": "The most important first."})


def represent_explanation(explanation: Explanation) -> dict[str, Any]:
    return {"job_id": explanation.job_id, "status": explanation.status,
            "claimable_now": explanation.claimable_now, "reasons": explanation.reasons}


def represent_worker(worker: Worker) -> dict[str, Any]:
    return {"name": worker.name,
            "types": None if worker.types is None else sorted(worker.types),
            "last_seen_at": to_rfc3339(worker.last_seen_at), "running": worker.running}


def represent_attempt(attempt: Attempt, *, show_error: bool) -> dict[str, Any]:
    shown: dict[str, Any] = {
        "number": attempt.number,
        "worker_id": attempt.worker_id,
        "claimed_at": to_rfc3339(attempt.claimed_at),
        "ended_at": to_rfc3339(attempt.ended_at),
        "outcome": attempt.outcome,
        "duration_ms": attempt.duration_ms,
    }
    if show_error:
        shown["error"] = attempt.error
        shown["fingerprint"] = attempt.fingerprint
    return shown


def represent_event(event: JobEvent) -> dict[str, Any]:
    return {"at": to_rfc3339(event.at), "event": event.event, "actor": event.actor,
            "detail": None if event.detail is None else json.loads(event.detail)}
