"""What a delivery's answer means for its job (docs/PUSH.md), free of I/O.

2xx: completed, a JSON object body becoming the result. 429 or 503 with Retry-After: a failed
attempt, retried after that delay. Anything else (3xx included: redirects are not followed),
a timeout or a connection error: a failed attempt with the queue's backoff.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

from marshmallow import ValidationError

from app.core.errors import ValidationFailed
from app.core.limits import RETRY_IN_SECONDS
from app.dispatch.http import Answer
from app.jobs.web.requests import CompleteSchema
from app.web.http import parse_json

ERROR_BODY_CHARS = 200
# Retry-After is obeyed up to a fail's own retry_in_seconds ceiling.
MAX_RETRY_AFTER_SECONDS = RETRY_IN_SECONDS.max
_RETRY_AFTER_STATUSES = frozenset({429, 503})
# The result field of a worker's complete, alone (the dispatcher holds the lease token).
_RESULT = CompleteSchema(only=("result",))


class Kind(enum.StrEnum):
    """The outcome label of the deliveries counter."""

    COMPLETED = "completed"
    RETRY_AFTER = "retry_after"  # 429/503 with Retry-After
    HTTP_ERROR = "http_error"  # any other status
    TIMEOUT = "timeout"
    CONNECTION_ERROR = "connection_error"
    RELEASED = "released"  # the dispatcher stopped before the answer came
    REFUSED = "refused"  # not sent: the url's origin is not in the operator's allow list


@dataclass(frozen=True)
class Outcome:
    kind: Kind
    status: int | None = None  # the HTTP status, when an answer came
    result: dict[str, Any] | None = None  # completed: the body, when a JSON object
    error: str | None = None  # failed: what the attempt's error says
    retry_in_seconds: int | None = None  # failed: None is the queue's backoff

    @property
    def completed(self) -> bool:
        return self.kind is Kind.COMPLETED


def retry_after_seconds(value: str | None, now_seconds: float) -> int | None:
    """Retry-After as whole seconds from now (delta-seconds or an HTTP date); None when
    absent or unreadable. A date in the past is 0; anything beyond a day is a day."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        seconds = int(value)
    else:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:  # an HTTP date is always GMT
            return None
        seconds = max(0, math.ceil(when.timestamp() - now_seconds))
    return min(seconds, MAX_RETRY_AFTER_SECONDS)


def outcome_of(answer: Answer, now_seconds: float) -> Outcome:
    """The outcome of an answered delivery."""
    if 200 <= answer.status < 300:
        return Outcome(Kind.COMPLETED, answer.status, result=_json_object(answer))
    error = f"HTTP {answer.status}: {answer.body.decode('utf-8', 'replace')[:ERROR_BODY_CHARS]}"
    if answer.status in _RETRY_AFTER_STATUSES:
        delay = retry_after_seconds(answer.retry_after, now_seconds)
        if delay is not None:
            return Outcome(Kind.RETRY_AFTER, answer.status, error=error,
                           retry_in_seconds=delay)
    return Outcome(Kind.HTTP_ERROR, answer.status, error=error)


def _json_object(answer: Answer) -> dict[str, Any] | None:
    """The body as the job's result when a worker's complete could have sent it as its
    `result`: the API's strict JSON (app/web/http.py) and the complete schema's field; a body
    past the payload limit was cut short, and is no result. (The size limit is the job
    service's, as for any complete.)"""
    if answer.truncated or not answer.body.strip():
        return None
    try:
        value = parse_json(answer.body, field="result")
        loaded = _RESULT.load({"result": value})
    except (ValidationFailed, ValidationError):
        return None
    result: dict[str, Any] | None = loaded["result"]
    return result
