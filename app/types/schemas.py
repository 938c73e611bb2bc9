"""marshmallow schemas of the type routes: the PATCH body and the type as shown."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from marshmallow import Schema, fields, validate

from app.core.clock import to_rfc3339
from app.core.limits import (
    AGING_SECONDS,
    CIRCUIT_COOLDOWN_SECONDS,
    CIRCUIT_FAILURE_RATIO,
    CIRCUIT_MIN_ATTEMPTS,
    CIRCUIT_WINDOW_SECONDS,
    PUSH_TIMEOUT_SECONDS,
    PUSH_URL_CHARS,
    RATE,
    RETENTION_SECONDS,
    RETRY_BUDGET_MINIMUM,
    RETRY_BUDGET_RATIO,
    RETRY_BUDGET_WINDOW_SECONDS,
    TYPE_LIMIT,
)
from app.core.redaction import display_url
from app.types.models import (
    FAIRNESS_KEY,
    KEYS_PER_PRODUCER,
    KEYS_SHARED,
    ON_FAILURE_BLOCK,
    ON_FAILURE_SKIP,
    ORDERING_KEY,
    PUSH_URL_PATTERN,
    TypeSettings,
)
from app.types.origin_repository import OriginFigure
from app.types.protection import circuit as circuits
from app.types.service import TypeView
from app.web.fields import StrictBoolean, StrictInteger, StrictNumber, StrictSchema, within


class PushSchema(StrictSchema):
    """A push type's endpoint (docs/PUSH.md)."""

    url = fields.String(required=True, validate=[
        validate.Length(max=PUSH_URL_CHARS.max),
        validate.Regexp(PUSH_URL_PATTERN, error="An http or https URL: a host name or IPv4 "
                        "address, an optional port 1-65535, then printable ASCII and no "
                        "fragment (percent-encode the rest).")],
        metadata={"description": "http or https; credentials (user:pass@) are sent as Basic "
                                 "auth and never shown."})
    timeout_seconds = StrictInteger(
        load_default=PUSH_TIMEOUT_SECONDS.default, validate=within(PUSH_TIMEOUT_SECONDS),
        metadata={"description": "A delivery's time limit; its lease is this plus 30 s."})
    rotate_secret = StrictBoolean(load_default=False, metadata={
        "description": "Make a new signing secret (shown once, in this answer)."})


def _retention(status: str) -> StrictInteger:
    return StrictInteger(allow_none=True, validate=within(RETENTION_SECONDS), metadata={
        "description": f"Seconds a {status} job of the type is kept after it ended (then "
                       "removed with its history); null: kept until purged by hand."})


class RetentionSchema(StrictSchema):
    """A type's retention of its finished jobs (docs/OPERATIONS.md); a status left out keeps its
    window."""

    completed_seconds = _retention("completed")
    failed_seconds = _retention("failed")
    cancelled_seconds = _retention("cancelled")


class RetentionShownSchema(Schema):
    completed_seconds = fields.Integer(required=True, allow_none=True)
    failed_seconds = fields.Integer(required=True, allow_none=True)
    cancelled_seconds = fields.Integer(required=True, allow_none=True)


class CircuitSchema(StrictSchema):
    """A type's circuit breaker (docs/FLOW-CONTROL.md, "Circuit breaker"); a field left out
    takes its default."""

    failure_ratio = StrictNumber(
        load_default=0.5, validate=within(CIRCUIT_FAILURE_RATIO), metadata={
            "description": "The failed share of the window's finished attempts that opens "
                           "the circuit."})
    min_attempts = StrictInteger(
        load_default=20, validate=within(CIRCUIT_MIN_ATTEMPTS), metadata={
            "description": "Finished attempts in the window before the ratio counts."})
    window_seconds = StrictInteger(
        load_default=60, validate=within(CIRCUIT_WINDOW_SECONDS), metadata={
            "description": "The window the ratio is taken over."})
    cooldown_seconds = StrictInteger(
        load_default=30, validate=within(CIRCUIT_COOLDOWN_SECONDS), metadata={
            "description": "From the opening to the first probe, and between the waves."})


class RetryBudgetSchema(StrictSchema):
    """A type's retry budget (docs/FLOW-CONTROL.md, "Retry budget"); a field left out takes
    its default."""

    ratio = StrictNumber(load_default=0.2, validate=within(RETRY_BUDGET_RATIO), metadata={
        "description": "Retries per window, per first attempt started in the window."})
    window_seconds = StrictInteger(
        load_default=60, validate=within(RETRY_BUDGET_WINDOW_SECONDS),
        metadata={"description": "The window the budget is counted over."})
    minimum = StrictInteger(load_default=10, validate=within(RETRY_BUDGET_MINIMUM), metadata={
        "description": "Retries per window whatever the first attempts."})


def _limit(description: str) -> StrictInteger:
    return StrictInteger(allow_none=True, validate=within(TYPE_LIMIT),
                         metadata={"description": description})


class TypePatchSchema(StrictSchema):
    """Any of the settings; a field left out is left as it is, null clears a limit."""

    openapi_extra: ClassVar[dict[str, Any]] = {
        "example": {"max_running": 5, "rate_per_second": 10, "burst": 20}}

    paused = StrictBoolean(metadata={"description": "No job of the type is claimed while "
                                                    "paused; enqueues are still accepted."})
    max_running = _limit("Running jobs of the type, across every process and host.")
    max_running_per_key = _limit("Running jobs per concurrency_key of the type.")
    rate_per_second = StrictNumber(allow_none=True, validate=within(RATE),
                                   metadata={"description": "Claims per second (token "
                                                            "bucket)."})
    burst = StrictInteger(allow_none=True, validate=within(TYPE_LIMIT),
                          metadata={"description": "Tokens the bucket holds at most; null: "
                                                   "ceil(rate_per_second), at least 1."})
    push = fields.Nested(PushSchema, allow_none=True, metadata={
        "description": "Deliver the type's jobs to this endpoint (a push type); null: "
                       "workers claim them again."})
    fairness = fields.String(allow_none=True, validate=validate.OneOf([FAIRNESS_KEY]), metadata={
        "description": "\"key\": claims take the type's jobs round-robin across concurrency "
                       "keys (jobs without a key form one key), within each priority; null: "
                       "claim order."})
    ordering = fields.String(allow_none=True, validate=validate.OneOf([ORDERING_KEY]), metadata={
        "description": "\"key\": per concurrency key, one job at a time in enqueue order "
                       "(later jobs wait); null: no order."})
    on_failure = fields.String(
        allow_none=True, validate=validate.OneOf([ON_FAILURE_SKIP, ON_FAILURE_BLOCK]),
        metadata={"description": "An ordered key whose job failed: \"skip\" (default, null) "
                                 "runs its next job; \"block\" runs nothing more until that "
                                 "job is retried or cancelled."})
    key_scope = fields.String(
        allow_none=True, validate=validate.OneOf([KEYS_PER_PRODUCER, KEYS_SHARED]),
        metadata={"description": "Whose are the type's concurrency keys under fairness and "
                                 "ordering: \"producer\" (default, null) each producer's own "
                                 "(another producer's jobs under the same key string never "
                                 "hold or delay yours); \"shared\" one key for every "
                                 "producer (see docs/FLOW-CONTROL.md for the risk)."})
    circuit = fields.Nested(CircuitSchema, allow_none=True, metadata={
        "description": "A circuit breaker: when the failed share of the type's finished "
                       "attempts in the window reaches failure_ratio (with min_attempts), no "
                       "job of the type is claimed or pushed but one probe after each "
                       "cooldown; a probe that completes releases claims in doubling waves. "
                       "null: no breaker."})
    circuit_state = fields.String(
        validate=validate.OneOf([circuits.CLOSED, circuits.OPEN]), metadata={
            "description": "Close or open the type's circuit by hand (it needs a circuit)."})
    retry_budget = fields.Nested(RetryBudgetSchema, allow_none=True, metadata={
        "description": "Retries of the type (failed attempts sent back to pending) run at "
                       "most ratio x the first attempts started in the window, plus minimum, "
                       "per window; a retry beyond it runs later, never dropped. null: no "
                       "budget."})
    aging_seconds = StrictInteger(allow_none=True, validate=within(AGING_SECONDS), metadata={
        "description": "Priority aging: a pending job of the type is claimed as if its "
                       "priority rose one level (low, medium, high; never to critical) per "
                       "this many seconds since it was enqueued, so that a stream of higher "
                       "priorities cannot starve it. Not with fairness (a fair type's claims "
                       "take rounds). null: off."})
    retention = fields.Nested(RetentionSchema, allow_none=True, metadata={
        "description": "How long the type's finished jobs are kept, by status (each 60 s to "
                       "10 years, or null: for ever); null: every status back to the "
                       "QUEUELOG_RETENTION_… defaults. A job with an idempotency key is kept "
                       "at least 24 hours, and a job a waiting job depends on until that job "
                       "ends."})


class TypeCountsSchema(Schema):
    reserved = fields.Integer(required=True, metadata={
        "description": "Jobs reserved and not yet confirmed or released (never claimed)."})
    waiting = fields.Integer(required=True, metadata={
        "description": "Jobs waiting for their dependencies (never claimed until they end)."})
    pending = fields.Integer(required=True)
    suspended = fields.Integer(required=True, metadata={
        "description": "Jobs suspended, waiting for a moment, an event or a token "
                       "(docs/WAITS.md): never claimed until they resume."})
    scheduled = fields.Integer(required=True, metadata={
        "description": "The part of pending whose run_at is in the future."})
    running = fields.Integer(required=True)
    completed = fields.Integer(required=True)
    failed = fields.Integer(required=True)
    cancelled = fields.Integer(required=True)


class PushConcurrencySchema(Schema):
    origin = fields.String(required=True, metadata={
        "description": "The push url's origin: scheme://host:port."})
    current = fields.Integer(required=True, metadata={
        "description": "Deliveries to the origin the dispatcher lets run at once now: halved "
                       "on a 429, a 503 or a timeout, grown back by one per window of "
                       "successes."})
    cap = fields.Integer(required=True, metadata={
        "description": "What it grows back to: the dispatcher's concurrency, or the smallest "
                       "max_running of the origin's push types when lower."})
    held_until = fields.String(required=True, allow_none=True, metadata={
        "format": "date-time",
        "description": "No delivery to the origin starts before this (its Retry-After); "
                       "null: none held."})


class PushShownSchema(Schema):
    url = fields.String(required=True, metadata={
        "description": "Scheme, host, port and the path's shape only: credentials, query "
                       "values and path segments that are not plain words are masked (***). "
                       "The url as set is never shown again."})
    timeout_seconds = fields.Integer(required=True)
    concurrency = fields.Nested(PushConcurrencySchema, required=True, allow_none=True, metadata={
        "description": "The dispatcher's adaptive concurrency at the url's origin, as it last "
                       "wrote it (at most a second behind); null until a dispatcher has "
                       "delivered there."})
    secret = fields.String(metadata={
        "description": "Only in the answer of the PATCH that made it (push set for the "
                       "first time, or rotate_secret)."})


class CircuitShownSchema(Schema):
    failure_ratio = fields.Float(required=True)
    min_attempts = fields.Integer(required=True)
    window_seconds = fields.Integer(required=True)
    cooldown_seconds = fields.Integer(required=True)


class FailureGroupShownSchema(Schema):
    fingerprint = fields.String(required=True)
    sample = fields.String(required=True)


class CircuitStateSchema(Schema):
    state = fields.String(required=True, metadata={
        "description": "\"closed\", \"open\" or \"half_open\"."})
    since = fields.String(required=True, allow_none=True, metadata={
        "format": "date-time", "description": "When it moved to this state (null: never "
                                              "opened)."})
    opened_by = fields.Nested(FailureGroupShownSchema, required=True, allow_none=True, metadata={
        "description": "The failure group with the most failed attempts in the window that "
                       "opened it (null: opened by hand, or closed)."})
    next_probe_at = fields.String(required=True, allow_none=True, metadata={
        "format": "date-time", "description": "Open: when its probe may start."})
    wave = fields.Integer(required=True, allow_none=True, metadata={
        "description": "Half-open: how many of its jobs may run at once now."})


class RetryBudgetShownSchema(Schema):
    ratio = fields.Float(required=True)
    window_seconds = fields.Integer(required=True)
    minimum = fields.Integer(required=True)


class TypeSchema(Schema):
    """A job type as GET /types shows it. Documents what `represent_type` builds."""

    type = fields.String(required=True)
    paused = fields.Boolean(required=True)
    max_running = fields.Integer(required=True, allow_none=True)
    max_running_per_key = fields.Integer(required=True, allow_none=True)
    rate_per_second = fields.Float(required=True, allow_none=True)
    burst = fields.Integer(required=True)
    push = fields.Nested(PushShownSchema, required=True, allow_none=True)
    fairness = fields.String(required=True, allow_none=True)
    ordering = fields.String(required=True, allow_none=True)
    on_failure = fields.String(required=True)
    key_scope = fields.String(required=True, metadata={
        "description": "\"producer\" (each producer's keys are its own) or \"shared\"."})
    circuit = fields.Nested(CircuitShownSchema, required=True, allow_none=True)
    circuit_state = fields.Nested(CircuitStateSchema, required=True, allow_none=True, metadata={
        "description": "Where the circuit stands; null without a circuit."})
    retry_budget = fields.Nested(RetryBudgetShownSchema, required=True, allow_none=True)
    aging_seconds = fields.Integer(required=True, allow_none=True, metadata={
        "description": "Seconds per level a pending job's priority rises (null: no aging)."})
    retention = fields.Nested(RetentionShownSchema, required=True, metadata={
        "description": "Seconds each finished status is kept (null: for ever), the "
                       "defaults included."})
    blocked_keys = fields.Integer(required=True, metadata={
        "description": "Ordered keys a failed job blocks now (on_failure block)."})
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
        "push": _push_shown(s, view.new_secret, view.push_concurrency),
        "fairness": s.fairness,
        "ordering": s.ordering,
        "on_failure": s.on_failure or ON_FAILURE_SKIP,
        "key_scope": s.key_scope or KEYS_PER_PRODUCER,
        "circuit": None if s.circuit_settings is None else s.circuit_settings.shown(),
        "circuit_state": circuit_state_shown(s, view.now_us),
        "retry_budget": (None if s.retry_budget_settings is None
                         else s.retry_budget_settings.shown()),
        "aging_seconds": s.aging_seconds,
        "retention": {"completed_seconds": view.retention.completed,
                      "failed_seconds": view.retention.failed,
                      "cancelled_seconds": view.retention.cancelled},
        "blocked_keys": view.blocked_keys,
        "counts": {"reserved": c.reserved, "waiting": c.waiting, "pending": c.pending,
                   "suspended": c.suspended, "scheduled": c.scheduled, "running": c.running,
                   "completed": c.completed, "failed": c.failed, "cancelled": c.cancelled},
        "oldest_claimable_age_seconds": view.oldest_claimable_age_seconds,
        "last_claim_at": to_rfc3339(s.last_claim_at),
    }


def circuit_state_shown(settings: TypeSettings, now_us: int) -> dict[str, Any] | None:
    """Where the type's circuit stands (None: it has none)."""
    config = settings.circuit_settings
    if config is None:
        return None
    state, since = settings.circuit_state, settings.circuit_since
    opened_by = None
    if state is not None and settings.circuit_opened_by is not None:
        opened_by = json.loads(settings.circuit_opened_by)
    next_probe_at = wave = None
    if state == circuits.OPEN and since is not None:
        next_probe_at = to_rfc3339(since + config.cooldown_us)
    elif state == circuits.HALF_OPEN and since is not None:
        wave = settings.circuit_cap(now_us)
    return {"state": circuits.shown_state(state), "since": to_rfc3339(since),
            "opened_by": opened_by, "next_probe_at": next_probe_at, "wave": wave}


def _push_shown(settings: TypeSettings, new_secret: str | None,
                figure: OriginFigure | None) -> dict[str, Any] | None:
    if settings.push_url is None:
        return None
    concurrency = None if figure is None else {
        "origin": figure.origin, "current": figure.concurrency, "cap": figure.cap,
        "held_until": to_rfc3339(figure.held_until)}
    shown: dict[str, Any] = {"url": display_url(settings.push_url),
                             "timeout_seconds": settings.push_timeout_seconds,
                             "concurrency": concurrency}
    if new_secret is not None:
        shown["secret"] = new_secret
    return shown
