"""One exception hierarchy, and the one place that renders every error as an RFC 9457 problem."""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, current_app, json
from marshmallow import Schema, ValidationError, fields
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from werkzeug.exceptions import HTTPException

PROBLEM_TYPE_BASE = "https://queuelog.dev/problems/"
PROBLEM_CONTENT_TYPE = "application/problem+json"

log = logging.getLogger(__name__)


# Every status a problem can carry: its title (sentence case, the one place titles are
# written) and the last segment of its `type` URI. Werkzeug's own errors (404 for an unknown
# path, 405, 413, …) are rendered with these too, not with Werkzeug's Title Case names.
PROBLEM_KINDS: dict[int, tuple[str, str]] = {
    400: ("Bad request", "bad-request"),
    401: ("Unauthorized", "unauthorized"),
    403: ("Forbidden", "forbidden"),
    404: ("Not found", "not-found"),
    405: ("Method not allowed", "method-not-allowed"),
    409: ("Conflict", "conflict"),
    413: ("Request body too large", "payload-too-large"),
    # 414 and 431 are gunicorn's (queuelog_gunicorn/worker.py answers them as problems).
    414: ("Request line too long", "request-line-too-long"),
    415: ("Unsupported media type", "unsupported-media-type"),
    422: ("Validation failed", "validation-failed"),
    431: ("Request header fields too large", "request-header-fields-too-large"),
    500: ("Internal server error", "internal-error"),
    503: ("Service unavailable", "service-unavailable"),
}


def problem_kind(status: int, fallback_name: str = "Error") -> tuple[str, str]:
    """(title, slug) of a status; a status not in PROBLEM_KINDS gets its name in sentence
    case."""
    kind = PROBLEM_KINDS.get(status)
    if kind is not None:
        return kind
    return fallback_name[:1].upper() + fallback_name[1:].lower(), "http-error"


class Problem(Exception):
    """An error the client is told about. Subclasses fix the status, the title and the type."""

    status = 500
    title, slug = PROBLEM_KINDS[500]

    def __init__(self, detail: str | None = None, *, errors: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        self.errors = errors
        self.headers = headers or {}
        self.extra = extra or {}  # members of this problem type beyond the standard ones


class Unauthorized(Problem):
    status = 401
    title, slug = PROBLEM_KINDS[status]

    def __init__(self, detail: str | None = None) -> None:
        super().__init__(detail, headers={"WWW-Authenticate": 'Bearer realm="queuelog"'})


class Forbidden(Problem):
    status = 403
    title, slug = PROBLEM_KINDS[status]


class NotFound(Problem):
    status = 404
    title, slug = PROBLEM_KINDS[status]


class Conflict(Problem):
    status = 409
    title, slug = PROBLEM_KINDS[status]


class UniqueConflict(Conflict):
    """A job of the same unique scope stands in the way (`reject`, or `replace` of a job that
    is no longer pending); the problem names it."""

    slug = "unique-conflict"

    def __init__(self, detail: str, existing_job_id: int | None) -> None:
        super().__init__(detail, extra=None if existing_job_id is None
                         else {"existing_job_id": existing_job_id})


class UnsupportedMediaType(Problem):
    status = 415
    title, slug = PROBLEM_KINDS[status]


class ValidationFailed(Problem):
    status = 422
    title, slug = PROBLEM_KINDS[status]


class ServiceUnavailable(Problem):
    status = 503
    title, slug = PROBLEM_KINDS[status]


class CountingReadsBusy(ServiceUnavailable):
    """Every slot this process keeps for reads that count the backlog (explain, the type
    counts, /metrics, the dashboard) is taken: refused at once rather than left to queue for
    a connection that enqueues and claims need. The client may retry."""

    def __init__(self) -> None:
        super().__init__("Too many requests that count the backlog are being served; retry "
                         "in a moment.", headers={"Retry-After": "1"})


def body_too_large_detail(limit_bytes: int) -> str:
    """What a 413 says: the limit, in bytes."""
    return (f"The request body is larger than {limit_bytes} bytes, the most this service "
            "accepts (QUEUELOG_MAX_CONTENT_LENGTH).")


class DatabaseUnavailable(ServiceUnavailable):
    """The database did not answer (unreachable, locked up, no pooled connection free): the
    service's state, not a bug. The client may retry."""

    def __init__(self) -> None:
        super().__init__("The database is not answering; retry later.",
                         headers={"Retry-After": "1"})


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


def render_problem(problem: Problem) -> Response:
    return problem_response(problem.status, problem.title, problem.slug, problem.detail,
                            problem.errors, problem.headers, problem.extra)


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(Problem)
    def on_problem(error: Problem) -> Response:
        return render_problem(error)

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
        if status == 413:
            detail = body_too_large_detail(current_app.config["MAX_CONTENT_LENGTH"])
        else:
            detail = {
                404: "No such resource.",
                405: "This method is not allowed on this resource.",
            }.get(status, error.description or error.name)
        title, slug = problem_kind(status, error.name)
        return problem_response(status, title, slug, detail, headers=headers)

    @app.errorhandler(PoolTimeoutError)
    @app.errorhandler(OperationalError)
    def on_database_unavailable(error: Exception) -> Response:
        # An unreachable or locked-up database is the service's state, not a bug: 503, and
        # the client may retry. Logged without the statement or its parameters.
        log.warning("database unavailable: %s", type(error).__name__)
        return render_problem(DatabaseUnavailable())

    @app.errorhandler(Exception)
    def on_unexpected(error: Exception) -> Response:
        if isinstance(error, DBAPIError):
            log.error("database error: %s", type(error.orig).__name__)
        else:
            log.exception("unhandled error")
        return problem_response(500, Problem.title, Problem.slug,
                                "The service failed to handle this request.")
