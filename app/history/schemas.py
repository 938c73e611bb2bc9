"""How attempts and events are shown. Built by hand (the schemas document them in
/openapi.json), like the job itself."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from marshmallow import Schema, fields, validate

from app.core.clock import to_rfc3339
from app.core.priorities import PRIORITY_LABELS, Priority
from app.history.explain import Explanation, ReasonCode
from app.history.service import Worker
from app.jobs.domain.history import Attempt, EventName, JobEvent, Outcome

_DATE_TIME = {"format": "date-time"}


class AttemptSchema(Schema):
    number = fields.Integer(required=True)
    worker_id = fields.String(required=True)
    worker_instance = fields.String(required=True, allow_none=True, metadata={
        "description": "The instance label its claim sent (GET /workers), as reported; "
                       "null when it sent none."})
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


class WorkerInstanceSchema(Schema):
    instance = fields.String(required=True, metadata={
        "description": "The label its worker sends with its claims and heartbeats, as "
                       "reported (never trusted: the key is the worker)."})
    last_seen_at = fields.String(required=True, allow_none=True, metadata={
        **_DATE_TIME, "description": "Its last claim or heartbeat, to about a minute; null "
                                     "when not noted lately."})
    running = fields.Integer(required=True, metadata={
        "description": "The jobs its claims hold now."})
    claimed_per_minute = fields.Integer(required=True, metadata={
        "description": "The jobs it claimed in the latest whole minute counted (one of the "
                       "two before now); 0 when none."})


class WorkerSchema(Schema):
    name = fields.String(required=True)
    types = fields.List(fields.String(), required=True, allow_none=True, metadata={
        "description": "The types the key may claim; null for every type."})
    last_seen_at = fields.String(required=True, allow_none=True, metadata={
        **_DATE_TIME, "description": "Its last claim, heartbeat or report, to about a minute."})
    running = fields.Integer(required=True)
    instances = fields.List(fields.Nested(WorkerInstanceSchema), required=True, metadata={
        "description": "Its instances seen within the hour or holding jobs now, by label "
                       "(at most 100, the most recently seen)."})


class WorkerListSchema(Schema):
    workers = fields.List(fields.Nested(WorkerSchema), required=True)


class ReasonSchema(Schema):
    # Each code carries its own evidence beside code and message.
    openapi_extra: ClassVar[dict[str, Any]] = {"additionalProperties": True}

    code = fields.String(required=True,
                         validate=validate.OneOf([code.value for code in ReasonCode]))
    message = fields.String(required=True)


class AgingSchema(Schema):
    priority_now = fields.String(required=True, validate=validate.OneOf(PRIORITY_LABELS),
                                 metadata={"description": "Its priority, risen by its wait."})
    next_rise_at = fields.String(required=True, allow_none=True, metadata={
        "format": "date-time",
        "description": "When it rises one level more; null at high (it never rises to "
                       "critical) or when it is critical."})


class ExplanationSchema(Schema):
    job_id = fields.Integer(required=True)
    status = fields.String(required=True)
    claimable_now = fields.Boolean(required=True)
    reasons = fields.List(fields.Nested(ReasonSchema), required=True, metadata={
        "description": "The most important first."})
    position = fields.Integer(required=True, allow_none=True, metadata={
        "description": "A claimable job (pending, its run_at reached): how many claimable "
                       "jobs of its type a claim takes before it, in the order its claims "
                       "take them (fair types: round order), counted exactly up to 10,000 "
                       "(position_capped: at least that many); null for any other job, or a "
                       "fair type's job not yet given its round."})
    position_capped = fields.Boolean(required=True, metadata={
        "description": "The count stopped at 10,000: position is a lower bound."})
    estimated_start_seconds = fields.Float(required=True, allow_none=True, metadata={
        "description": "About how long until a claim takes it: position at the type's claim "
                       "rate over the last 5 minutes, no faster than its rate limit; null "
                       "when nothing of the type was claimed lately, the type is paused or "
                       "its circuit is open, or the job is not claimable."})
    aging = fields.Nested(AgingSchema, required=True, allow_none=True, metadata={
        "description": "A claimable job of a type that ages (aging_seconds): the priority "
                       "claims take it at now, and when it next rises; null otherwise."})


def represent_explanation(explanation: Explanation) -> dict[str, Any]:
    place = explanation.place
    return {"job_id": explanation.job_id, "status": explanation.status,
            "claimable_now": explanation.claimable_now, "reasons": explanation.reasons,
            "position": None if place is None else place.position,
            "position_capped": place is not None and place.capped,
            "estimated_start_seconds": None if place is None else place.estimated_start_seconds,
            "aging": None if place is None or place.aged is None else {
                "priority_now": Priority(place.aged.priority_now).label,
                "next_rise_at": to_rfc3339(place.aged.next_rise_at)}}


def represent_worker(worker: Worker) -> dict[str, Any]:
    return {"name": worker.name,
            "types": None if worker.types is None else sorted(worker.types),
            "last_seen_at": to_rfc3339(worker.last_seen_at), "running": worker.running,
            "instances": [{"instance": one.label, "last_seen_at": to_rfc3339(one.last_seen_at),
                           "running": one.running,
                           "claimed_per_minute": one.claimed_per_minute}
                          for one in worker.instances]}


def represent_attempt(attempt: Attempt, *, show_error: bool) -> dict[str, Any]:
    shown: dict[str, Any] = {
        "number": attempt.number,
        "worker_id": attempt.worker_id,
        "worker_instance": attempt.worker_instance,
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
