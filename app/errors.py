"""One exception hierarchy, and the one place that renders every error as an RFC 9457 problem."""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, json
from marshmallow import Schema, ValidationError, fields
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from werkzeug.exceptions import HTTPException

PROBLEM_TYPE_BASE = "https://queuelog.dev/problems/"
PROBLEM_CONTENT_TYPE = "application/problem+json"

log = logging.getLogger(__name__)


class Problem(Exception):
    """An error the client is told about. Subclasses fix the status, the title and the type."""

    status = 500
    title = "Internal server error"
    slug = "internal-error"

    def __init__(self, detail: str | None = None, *, errors: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        self.errors = errors
        self.headers = headers or {}
        self.extra = extra or {}  # members of this problem type beyond the standard ones


class Unauthorized(Problem):
    status, title, slug = 401, "Unauthorized", "unauthorized"

    def __init__(self, detail: str | None = None) -> None:
        super().__init__(detail, headers={"WWW-Authenticate": 'Bearer realm="queuelog"'})


class Forbidden(Problem):
    status, title, slug = 403, "Forbidden", "forbidden"


class NotFound(Problem):
    status, title, slug = 404, "Not found", "not-found"


class Conflict(Problem):
    status, title, slug = 409, "Conflict", "conflict"


class UniqueConflict(Conflict):
    """A job of the same unique scope stands in the way (`reject`, or `replace` of a job that
    is no longer pending); the problem names it."""

    slug = "unique-conflict"

    def __init__(self, detail: str, existing_job_id: int | None) -> None:
        super().__init__(detail, extra=None if existing_job_id is None
                         else {"existing_job_id": existing_job_id})


class PayloadTooLarge(Problem):
    status, title, slug = 413, "Request body too large", "payload-too-large"


class UnsupportedMediaType(Problem):
    status, title, slug = 415, "Unsupported media type", "unsupported-media-type"


class ValidationFailed(Problem):
    status, title, slug = 422, "Validation failed", "validation-failed"


class ServiceUnavailable(Problem):
    status, title, slug = 503, "Service unavailable", "service-unavailable"


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


def _body(status: int, title: str, slug: str, detail: str,
          errors: dict[str, Any] | None, extra: dict[str, Any] | None = None
          ) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + slug,
        "title": title,
        "status": status,
        "detail": detail,
    }
    if errors is not None:
        body["errors"] = errors
    body.update(extra or {})
    return body


def problem_body(problem: Problem) -> dict[str, Any]:
    """The problem as a JSON object, for answers that carry several (complete-many)."""
    return _body(problem.status, problem.title, problem.slug, problem.detail, problem.errors,
                 problem.extra)


def problem_response(status: int, title: str, slug: str, detail: str,
                     errors: dict[str, Any] | None = None,
                     headers: dict[str, str] | None = None,
                     extra: dict[str, Any] | None = None) -> Response:
    body = _body(status, title, slug, detail, errors, extra)
    response = Response(json.dumps(body), status=status, mimetype=PROBLEM_CONTENT_TYPE)
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


_SLUGS = {
    400: "bad-request", 404: "not-found", 405: "method-not-allowed",
    413: "payload-too-large", 415: "unsupported-media-type", 422: "validation-failed",
}


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(Problem)
    def on_problem(error: Problem) -> Response:
        return problem_response(error.status, error.title, error.slug, error.detail,
                                error.errors, error.headers, error.extra)

    @app.errorhandler(ValidationError)
    def on_validation_error(error: ValidationError) -> Response:
        return problem_response(422, ValidationFailed.title, ValidationFailed.slug,
                                "The request did not validate; see errors.",
                                flatten_errors(error.messages))

    @app.errorhandler(HTTPException)
    def on_http_exception(error: HTTPException) -> Response:
        status = error.code or 500
        headers = {}
        if status == 405 and error.valid_methods:  # type: ignore[attr-defined]
            headers["Allow"] = ", ".join(error.valid_methods)  # type: ignore[attr-defined]
        detail = {
            404: "No such resource.",
            405: "This method is not allowed on this resource.",
            413: "The request body is larger than the service accepts.",
        }.get(status, error.description or error.name)
        return problem_response(status, error.name, _SLUGS.get(status, "http-error"),
                                detail, headers=headers)

    @app.errorhandler(PoolTimeoutError)
    @app.errorhandler(OperationalError)
    def on_database_unavailable(error: Exception) -> Response:
        # An unreachable or locked-up database is the service's state, not a bug: 503, and
        # the client may retry. Logged without the statement or its parameters.
        log.warning("database unavailable: %s", type(error).__name__)
        return problem_response(503, ServiceUnavailable.title, ServiceUnavailable.slug,
                                "The database is not answering; retry later.",
                                headers={"Retry-After": "1"})

    @app.errorhandler(Exception)
    def on_unexpected(error: Exception) -> Response:
        if isinstance(error, DBAPIError):
            log.error("database error: %s", type(error.orig).__name__)
        else:
            log.exception("unhandled error")
        return problem_response(500, Problem.title, Problem.slug,
                                "The service failed to handle this request.")
