"""The one place that renders every error as an RFC 9457 problem: PROBLEM_TYPES maps each
error the service answers with (the domain's, app/core/errors.py, and HTTP's own) to its
problem, and the OpenAPI catalogue of problem types is generated from it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, Response, current_app, json
from marshmallow import Schema, ValidationError, fields
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from werkzeug.exceptions import (
    BadRequest,
    HTTPException,
    MethodNotAllowed,
    RequestEntityTooLarge,
    RequestHeaderFieldsTooLarge,
    RequestURITooLarge,
)

from app.core.errors import (
    Conflict,
    CountingReadsBusy,
    DatabaseUnavailable,
    Forbidden,
    IdempotencyKeyTaken,
    NotFound,
    QueueError,
    ScheduleNameTaken,
    ServiceUnavailable,
    SlotTaken,
    StorageUnavailable,
    TooManyRequests,
    Unauthorized,
    UniqueConflict,
    UniqueIndexRefused,
    UniqueScopeHeld,
    ValidationFailed,
    WaitEnded,
)
from app.core.storage_refusal import storage_refusal

PROBLEM_TYPE_BASE = "https://queuelog.dev/problems/"
PROBLEM_CONTENT_TYPE = "application/problem+json"

log = logging.getLogger(__name__)


class UnsupportedMediaType(QueueError):
    """The body is not JSON (415): HTTP's own refusal, raised by app/web/http.py, not the
    domain's."""


@dataclass(frozen=True)
class ProblemType:
    """What a client is shown for one kind of error: its status, its title (sentence case),
    the last segment of its `type` URI, the headers it always carries, and the attributes of
    the error it copies into the body as members of its own."""

    status: int
    title: str
    slug: str
    headers: Mapping[str, str] = field(default_factory=dict)
    members: tuple[str, ...] = ()

    @property
    def uri(self) -> str:
        return PROBLEM_TYPE_BASE + self.slug


_INTERNAL = ProblemType(500, "Internal server error", "internal-error")
_SERVICE_UNAVAILABLE = ProblemType(503, "Service unavailable", "service-unavailable")

# The one table: every error the service answers with and its problem, the one place titles
# and types are written. A raised error is looked up along its class's MRO (so a subclass
# raised by a service, e.g. the report refusal, is its base's problem); Werkzeug's errors and
# gunicorn's (414, 431: queuelog_gunicorn/worker.py) by their status, the first entry with
# it, so base entries come before their subclasses. A test checks that every class of
# app/core/errors.py has its own entry, and /openapi.json lists each type (x-problem-types).
PROBLEM_TYPES: dict[type[Exception], ProblemType] = {
    BadRequest: ProblemType(400, "Bad request", "bad-request"),
    Unauthorized: ProblemType(401, "Unauthorized", "unauthorized",
                              headers={"WWW-Authenticate": 'Bearer realm="queuelog"'}),
    Forbidden: ProblemType(403, "Forbidden", "forbidden"),
    NotFound: ProblemType(404, "Not found", "not-found"),
    MethodNotAllowed: ProblemType(405, "Method not allowed", "method-not-allowed"),
    Conflict: ProblemType(409, "Conflict", "conflict"),
    UniqueConflict: ProblemType(409, "Conflict", "unique-conflict",
                                members=("existing_job_id",)),
    WaitEnded: ProblemType(409, "Conflict", "wait-ended", members=("ended_at", "ended_by")),
    RequestEntityTooLarge: ProblemType(413, "Request body too large", "payload-too-large"),
    RequestURITooLarge: ProblemType(414, "Request line too long", "request-line-too-long"),
    UnsupportedMediaType: ProblemType(415, "Unsupported media type", "unsupported-media-type"),
    ValidationFailed: ProblemType(422, "Validation failed", "validation-failed"),
    TooManyRequests: ProblemType(429, "Too many requests", "too-many-requests"),
    RequestHeaderFieldsTooLarge: ProblemType(431, "Request header fields too large",
                                             "request-header-fields-too-large"),
    # The use cases catch these (a write a unique index refused): one that reached the
    # handler would be a bug of ours, answered as any other.
    UniqueIndexRefused: _INTERNAL,
    IdempotencyKeyTaken: _INTERNAL,
    UniqueScopeHeld: _INTERNAL,
    SlotTaken: _INTERNAL,
    ScheduleNameTaken: _INTERNAL,
    # A domain error no entry names more closely is a bug of ours, as any other exception.
    Exception: _INTERNAL,
    QueueError: _INTERNAL,
    ServiceUnavailable: _SERVICE_UNAVAILABLE,
    CountingReadsBusy: _SERVICE_UNAVAILABLE,
    DatabaseUnavailable: _SERVICE_UNAVAILABLE,
    StorageUnavailable: ProblemType(503, "Storage unavailable", "storage-unavailable"),
}

def problem_type_of(error: Exception) -> ProblemType:
    """The problem of a raised error: the entry of the nearest class in its MRO."""
    for cls in type(error).__mro__:
        kind = PROBLEM_TYPES.get(cls)
        if kind is not None:
            return kind
    return _INTERNAL


def problem_type_for_status(status: int, fallback_name: str = "Error") -> ProblemType:
    """The problem of a status (for Werkzeug's errors and gunicorn's): the first entry with
    it; a status no entry has gets its name in sentence case and the generic type."""
    for kind in PROBLEM_TYPES.values():
        if kind.status == status:
            return kind
    return ProblemType(status, fallback_name[:1].upper() + fallback_name[1:].lower(),
                       "http-error")


def problem_catalogue() -> list[dict[str, Any]]:
    """Every problem type the service answers with, once each, by status: the type URI, its
    title and its status (the OpenAPI document's x-problem-types)."""
    kinds = {kind.slug: kind for kind in PROBLEM_TYPES.values()}
    return [{"type": kind.uri, "title": kind.title, "status": kind.status}
            for kind in sorted(kinds.values(), key=lambda kind: (kind.status, kind.slug))]


def body_too_large_detail(limit_bytes: int) -> str:
    """What a 413 says: the limit, in bytes."""
    return (f"The request body is larger than {limit_bytes} bytes, the most this service "
            "accepts (QUEUELOG_MAX_CONTENT_LENGTH).")


class ProblemSchema(Schema):
    """An RFC 9457 problem as `problem_response` builds it; documents it in /openapi.json."""

    type = fields.String(required=True, metadata={"format": "uri"})
    title = fields.String(required=True)
    status = fields.Integer(required=True)
    detail = fields.String(required=True)
    errors = fields.Dict(keys=fields.String(), values=fields.List(fields.String()),
                         metadata={"description": "For validation failures: each field, "
                                                  "named by its dotted path, and its messages."})
    existing_job_id = fields.Integer(metadata={
        "description": "On a unique-conflict: the job holding the unique key, when there is "
                       "one the caller may see (a twin within the same batch has no id yet)."})
    ended_at = fields.String(allow_none=True, metadata={
        "format": "date-time", "description": "On a wait-ended: when the wait ended."})
    ended_by = fields.String(allow_none=True, metadata={
        "description": "On a wait-ended: what ended it (token, timeout; cancel: its job was "
                       "cancelled)."})


def flatten_errors(messages: Any, prefix: str = "") -> dict[str, list[str]]:
    """marshmallow's nested messages as {"jobs.3.type": [...]} (paths joined with dots)."""
    if isinstance(messages, dict):
        flat: dict[str, list[str]] = {}
        for key, value in messages.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            flat.update(flatten_errors(value, path))
        return flat
    if isinstance(messages, list) and all(isinstance(m, str) for m in messages):
        return {prefix or "_body": list(messages)}
    if isinstance(messages, list):
        flat = {}
        for item in messages:
            flat.update(flatten_errors(item, prefix))
        return flat
    return {prefix or "_body": [str(messages)]}


def _body(kind: ProblemType, detail: str, errors: Mapping[str, Any] | None,
          members: Mapping[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": kind.uri,
        "title": kind.title,
        "status": kind.status,
        "detail": detail,
    }
    if errors is not None:
        body["errors"] = errors
    body.update(members or {})
    return body


def _members(kind: ProblemType, error: QueueError) -> dict[str, Any]:
    """The members of this problem type beyond the standard ones, from the error's attributes;
    one the error does not know (None) is left out."""
    found = {name: getattr(error, name, None) for name in kind.members}
    return {name: value for name, value in found.items() if value is not None}


def _headers(kind: ProblemType, error: QueueError) -> dict[str, str]:
    headers = dict(kind.headers)
    if error.retry_after_seconds is not None:
        headers["Retry-After"] = str(error.retry_after_seconds)
    return headers


def problem_body(error: QueueError) -> dict[str, Any]:
    """The error's problem as a JSON object, for answers that carry several (complete-many)."""
    kind = problem_type_of(error)
    return _body(kind, error.detail, error.errors, _members(kind, error))


def problem_response(kind: ProblemType, detail: str,
                     errors: Mapping[str, Any] | None = None,
                     headers: Mapping[str, str] | None = None,
                     members: Mapping[str, Any] | None = None) -> Response:
    body = _body(kind, detail, errors, members)
    response = Response(json.dumps(body), status=kind.status, mimetype=PROBLEM_CONTENT_TYPE)
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def render_problem(error: QueueError) -> Response:
    kind = problem_type_of(error)
    return problem_response(kind, error.detail, error.errors, _headers(kind, error),
                            _members(kind, error))


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(QueueError)
    def on_queue_error(error: QueueError) -> Response:
        return render_problem(error)

    @app.errorhandler(ValidationError)
    def on_validation_error(error: ValidationError) -> Response:
        return render_problem(ValidationFailed("The request did not validate; see errors.",
                                               errors=flatten_errors(error.messages)))

    @app.errorhandler(HTTPException)
    def on_http_exception(error: HTTPException) -> Response:
        status = error.code or 500
        headers = {}
        if status == 405 and error.valid_methods:  # type: ignore[attr-defined]
            headers["Allow"] = ", ".join(error.valid_methods)  # type: ignore[attr-defined]
        if status == 413:
            detail = body_too_large_detail(current_app.config["MAX_CONTENT_LENGTH"])
        else:
            detail = {
                404: "No such resource.",
                405: "This method is not allowed on this resource.",
            }.get(status, error.description or error.name)
        return problem_response(problem_type_for_status(status, error.name), detail,
                                headers=headers)

    @app.errorhandler(PoolTimeoutError)
    @app.errorhandler(OperationalError)
    def on_database_unavailable(error: Exception) -> Response:
        # An unreachable or locked-up database is the service's state, not a bug: 503, and
        # the client may retry. Logged without the statement or its parameters. A disk
        # full or read-only is the operator's to fix: said so, with SQLite's own code.
        refusal = storage_refusal(error)
        if refusal is not None:
            log.error("database storage refuses writes (%s): free space on the database's "
                      "disk, or repair it; writes are refused until then", refusal[1])
            return render_problem(refusal[0])
        # The driver's error class (DeadlockDetected, ConnectionTimeout…) says which state
        # the database was in; its message may carry the statement, so it is not logged.
        log.warning("database unavailable: %s (%s)", type(error).__name__,
                    type(getattr(error, "orig", None) or error).__name__)
        return render_problem(DatabaseUnavailable())

    @app.errorhandler(Exception)
    def on_unexpected(error: Exception) -> Response:
        if isinstance(error, DBAPIError):
            log.error("database error: %s", type(error.orig).__name__)
        else:
            log.exception("unhandled error")
        return problem_response(PROBLEM_TYPES[Exception],
                                "The service failed to handle this request.")
