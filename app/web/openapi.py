"""/openapi.json: the OpenAPI 3 document of this API, built from the app's own route table and
the same marshmallow schemas that validate requests (apispec's marshmallow plugin).

A view says what it takes and what it answers with `@documented(...)`; `require_roles` marks
the views that need a key. The problems a route can answer follow from what it does: a view
behind `require_roles` answers 401, 403 and 503 (the key lookup reads the database), a view
that reads a body answers 413, 415 and 422, a view that reads a query answers 422; each view
adds its own (404, 409, …). The document is built once per app, on the first request, so it
lists the routes actually registered and the job types actually configured.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from apispec.ext.marshmallow.openapi import OpenAPIConverter
from flask import Blueprint, Flask, Response, current_app, json
from marshmallow import Schema
from werkzeug.routing import Rule

from app.core.limits import JOB_ID
from app.web.fields import IdempotencyKeyHeaderSchema
from app.web.problems import PROBLEM_CONTENT_TYPE, ProblemSchema, problem_catalogue

F = TypeVar("F", bound=Callable[..., Any])

OPENAPI_VERSION = "3.0.3"
API_VERSION = "1"
API_TITLE = "queuelog HTTP API"
SECURITY_SCHEME = "bearerAuth"
_EXTENSION = "queuelog.openapi"
# Methods Werkzeug answers by itself on every rule; they are not operations of this API.
_IMPLICIT_METHODS = frozenset({"HEAD", "OPTIONS"})

_PROBLEMS: dict[int, tuple[str, str]] = {
    401: ("Unauthorized", "No valid API key: send 'Authorization: Bearer <token>'."),
    403: ("Forbidden", "The key's role, priority ceiling or job types do not allow this."),
    404: ("NotFound", "No such job, or not one the caller may see."),
    409: ("Conflict", "The job is not in a state that allows this (see `detail`)."),
    413: ("PayloadTooLarge", "The request body is larger than the service accepts."),
    415: ("UnsupportedMediaType", "The body is not `application/json`."),
    422: ("ValidationFailed", "The request did not validate; `errors` names each field."),
    429: ("TooManyRequests", "Sent sooner than the service takes it (a job's heartbeats: "
                             "docs/JOBS.md); nothing was done. Send it again after "
                             "Retry-After."),
    503: ("ServiceUnavailable", "The database is not answering, or its storage refuses "
                                "writes (disk full, read-only); retry later."),
}
_PROBLEM_HEADERS = {401: {"WWW-Authenticate": True}, 429: {"Retry-After": True},
                    503: {"Retry-After": False}}

_HEADERS: dict[str, dict[str, Any]] = {
    "Location": {"description": "The new job's (or schedule's) URL.",
                 "schema": {"type": "string"}},
    "Idempotent-Replayed": {
        "description": "Present on a replay: this job was created by an earlier request "
                       "with the same idempotency key.",
        "schema": {"type": "string", "enum": ["true"]},
    },
    "Deduplicated": {
        "description": "Present when the request met a twin holding its unique key: true "
                       "when the twin is returned as it was, replaced when it took this "
                       "request's payload and schedule (debounce).",
        "schema": {"type": "string", "enum": ["true", "replaced"]},
    },
    "WWW-Authenticate": {"description": "The scheme to authenticate with: Bearer.",
                         "schema": {"type": "string"}},
    "Retry-After": {"description": "Seconds to wait before retrying. On a 2xx answer to a "
                                   "request that asked to wait: the server could not wait "
                                   "(its budget of waiting requests is full), so it answered "
                                   "at once; ask again after this long.",
                    "schema": {"type": "string"}},
}

# Request headers, each described by the schema that checks it.
_REQUEST_HEADERS: dict[str, tuple[type[Schema], str]] = {
    "IdempotencyKey": (
        IdempotencyKeyHeaderSchema,
        "Makes the enqueue safe to retry: the same key with the same request answers 200 "
        "with the job it created; with another request, 422. Scoped to the producer's key. "
        "May come in the body instead, under the same rule; both present and different is "
        "a 422.",
    ),
    "EventIdempotencyKey": (
        IdempotencyKeyHeaderSchema,
        "Makes the event safe to send again: the same key of the same producer, while the "
        "event is kept (QUEUELOG_EVENT_KEEP_SECONDS), is the same event, answered as the "
        "first was with Idempotent-Replayed, resuming nothing more.",
    ),
}


@dataclass(frozen=True)
class Reply:
    """A success response: its status, what it means, and what it carries."""

    status: int
    description: str
    schema: type[Schema] | None = None
    headers: tuple[str, ...] = ()
    # Set for answers that are not JSON: each media type, its body a string.
    text_media_types: tuple[str, ...] = ()


@dataclass(frozen=True)
class OperationDoc:
    summary: str
    replies: tuple[Reply, ...]
    body: type[Schema] | None
    body_required: bool
    query: type[Schema] | None
    request_headers: tuple[str, ...]
    errors: frozenset[int]


# The dashboard's pages (app/ui, under /ui/) are HTML for browsers signed in with a session,
# no part of the JSON API this document and docs/API.md describe.
NOT_API_BLUEPRINTS = frozenset({"ui"})


def api_rules(app: Flask) -> list[Rule]:
    """The URL rules of the JSON API: every rule but the dashboard's."""
    return [rule for rule in app.url_map.iter_rules()
            if rule.endpoint.partition(".")[0] not in NOT_API_BLUEPRINTS]


def documented(summary: str, *, replies: Iterable[Reply], body: type[Schema] | None = None,
               body_required: bool = False, query: type[Schema] | None = None,
               request_headers: Iterable[str] = (), errors: Iterable[int] = ()
               ) -> Callable[[F], F]:
    """Attach what /openapi.json says about a view. `errors` lists the problems particular to
    this route; the ones that follow from auth, body or query are added for every route."""
    doc = OperationDoc(summary, tuple(replies), body, body_required, query,
                       tuple(request_headers), frozenset(errors))

    def decorate(view: F) -> F:
        view.openapi = doc  # type: ignore[attr-defined]
        return view

    return decorate


bp = Blueprint("openapi", __name__)


@bp.get("/openapi.json")
@documented("This document: the OpenAPI 3 description of the API.",
            replies=[Reply(200, "The OpenAPI document.")])
def openapi_json() -> Response:
    return Response(openapi_bytes(current_app), mimetype="application/json")


def openapi_bytes(app: Flask) -> bytes:
    """The document as served, built on first use. Two threads racing here both build the
    same document; whichever lands last stays, and neither answer is wrong."""
    cached = app.extensions.get(_EXTENSION)
    if cached is None:
        cached = json.dumps(build_openapi(app)).encode("utf-8")
        app.extensions[_EXTENSION] = cached
    return cached


def _converter(plugin: MarshmallowPlugin) -> OpenAPIConverter:
    """The plugin's converter, which APISpec's constructor has set up."""
    if plugin.converter is None:
        raise RuntimeError("the marshmallow plugin is not attached to a spec yet")
    return plugin.converter


def build_openapi(app: Flask) -> dict[str, Any]:
    """The OpenAPI document of `app`: every rule of its URL map, every method but HEAD and
    OPTIONS, described from the views' `@documented` notes and their schemas."""
    plugin = MarshmallowPlugin(schema_name_resolver=_schema_name)
    spec = APISpec(
        # Client generators name their package after the title (openapi-python-client:
        # "queuelog" would become queuelog_client, the import name of our own client).
        title=API_TITLE,
        version=API_VERSION,
        openapi_version=OPENAPI_VERSION,
        plugins=[plugin],
        info={"description": "A persistent background-job queue served over HTTP. Every "
                             "error is an RFC 9457 problem (application/problem+json)."},
        # Every problem `type` a client can meet, with its title and status: generated from
        # app/web/problems.py's PROBLEM_TYPES, the table that renders them.
        **{"x-problem-types": problem_catalogue()},
    )
    spec.components.security_scheme(SECURITY_SCHEME, {
        "type": "http", "scheme": "bearer",
        "description": "An API key created by the operator (`queuelog keys create`).",
    })
    spec.components.schema("Problem", schema=ProblemSchema)
    for name, header in _HEADERS.items():
        spec.components.header(name, header)
    for name, (header_schema, description) in _REQUEST_HEADERS.items():
        (field,) = header_schema().fields.values()
        spec.components.parameter(name, "header", {
            "name": field.data_key, "required": False, "description": description,
            "schema": _converter(plugin).field2property(field)})
    for status, (name, description) in _PROBLEMS.items():
        spec.components.response(name, _problem_response(status, description))

    seen: set[type[Schema]] = set()
    # Several rules may share a path (GET /jobs and POST /jobs); apispec takes a path once.
    paths: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {}
    for rule in sorted(api_rules(app), key=lambda r: (r.rule, r.endpoint)):
        view = app.view_functions[rule.endpoint]
        path, parameters = _openapi_path(rule)
        doc: OperationDoc | None = getattr(view, "openapi", None)
        if doc is not None:
            for schema in (doc.body, doc.query, *(r.schema for r in doc.replies)):
                if schema is not None:
                    seen.update(_with_nested(schema))
        operations = paths.setdefault(path, (parameters, {}))[1]
        for method in sorted((rule.methods or set()) - _IMPLICIT_METHODS):
            operations[method.lower()] = _operation(rule, method, view, doc)
    for path, (parameters, operations) in paths.items():
        spec.path(path=path, operations=operations, parameters=parameters)

    document = spec.to_dict()
    _add_schema_extras(document, seen)
    _portable_patterns(document)
    _strict_nullable_nested(document)
    _add_configured_job_types(document, app.config.get("JOB_TYPES") or ())
    return document


def _schema_name(schema: Any) -> str:
    cls = schema if isinstance(schema, type) else type(schema)
    return cls.__name__.removesuffix("Schema")


_RULE_ARGUMENT = re.compile(r"<(?:(\w+)(?:\([^)]*\))?:)?(\w+)>")


def _openapi_path(rule: Rule) -> tuple[str, list[dict[str, Any]]]:
    """`/jobs/<id:job_id>` as `/jobs/{job_id}`, with the path parameters it declares."""
    parameters = []
    for converter, name in _RULE_ARGUMENT.findall(rule.rule):
        schema: dict[str, Any] = {"type": "string"}
        if converter == "id":
            schema = {"type": "integer", "format": "int64", "minimum": JOB_ID.min,
                      "maximum": JOB_ID.max}
        parameters.append({"name": name, "in": "path", "required": True, "schema": schema})
    return _RULE_ARGUMENT.sub(r"{\2}", rule.rule), parameters


def _operation(rule: Rule, method: str, view: Any, doc: OperationDoc | None) -> dict[str, Any]:
    roles = getattr(view, "allowed_roles", None)
    operation: dict[str, Any] = {"operationId": rule.endpoint.rpartition(".")[2]}
    if roles is not None:
        names = ", ".join(sorted(role.value for role in roles))
        operation["security"] = [{SECURITY_SCHEME: []}]
        operation["description"] = f"Roles: {names}."
    else:
        operation["security"] = []
    if doc is None:
        # Still listed, so the route is not hidden; tests/test_openapi.py fails on it.
        operation["summary"] = "Not documented yet."
        operation["responses"] = {"default": {"description": "Not documented yet."}}
        return operation

    operation["summary"] = doc.summary
    statuses = set(doc.errors)
    if roles is not None:
        statuses |= {401, 403, 503}
    # A string names a parameter of components/parameters.
    parameters: list[Any] = list(doc.request_headers)
    if doc.query is not None:
        parameters.append({"in": "query", "schema": doc.query})
        statuses.add(422)
    if parameters:
        operation["parameters"] = parameters
    if doc.body is not None:
        operation["requestBody"] = {
            "required": doc.body_required,
            "content": {"application/json": {"schema": doc.body}},
        }
        if not doc.body_required:
            operation["requestBody"]["description"] = "Optional: an empty body counts as {}."
        statuses |= {413, 415, 422}

    responses: dict[str, Any] = {}
    for reply in doc.replies:
        response: dict[str, Any] = {"description": reply.description}
        if reply.text_media_types:
            response["content"] = {media_type: {"schema": {"type": "string"}}
                                   for media_type in reply.text_media_types}
        elif reply.schema is not None:
            response["content"] = {"application/json": {"schema": reply.schema}}
        elif reply.status != 204:
            response["content"] = {"application/json": {"schema": {"type": "object"}}}
        if reply.headers:
            response["headers"] = {name: {"$ref": f"#/components/headers/{name}"}
                                   for name in reply.headers}
        responses[str(reply.status)] = response
    for status in sorted(statuses):
        responses[str(status)] = {"$ref": f"#/components/responses/{_PROBLEMS[status][0]}"}
    if doc.query is not None:
        # A query string can make the request line longer than gunicorn accepts
        # (limit_request_line): refused before the app runs, and answered as a problem by
        # queuelog's gunicorn worker (queuelog_gunicorn/worker.py problem_in_place_of).
        responses["414"] = _problem_response(
            414, "The request line is longer than the server accepts (answered by the "
                 "server before the application).")
    operation["responses"] = responses
    return operation


def _problem_response(status: int, description: str) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": description,
        "content": {PROBLEM_CONTENT_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }
    headers = _PROBLEM_HEADERS.get(status)
    if headers:
        response["headers"] = {
            name: {"$ref": f"#/components/headers/{name}", **({"required": True} if required
                                                             else {})}
            for name, required in headers.items()
        }
    return response


def _with_nested(schema: type[Schema]) -> set[type[Schema]]:
    """The schema and every schema nested in it (whose components may carry extras too)."""
    found = {schema}
    for field in schema._declared_fields.values():
        inner = getattr(field, "inner", field)  # a List's items
        nested = getattr(inner, "nested", None)
        if isinstance(nested, type) and issubclass(nested, Schema) and nested not in found:
            found |= _with_nested(nested)
    return found


def _add_schema_extras(document: dict[str, Any], schemas: Iterable[type[Schema]]) -> None:
    """What a schema's fields cannot say (a `@validates_schema` rule, a whole example), which
    the schema declares in JSON Schema as its `openapi_extra`, merged into its component."""
    components = document["components"]["schemas"]
    for schema in schemas:
        extra = getattr(schema, "openapi_extra", None)
        if extra:
            components[_schema_name(schema)].update(copy.deepcopy(extra))


def _portable_patterns(node: Any) -> None:
    """Validators end their patterns with Python's `\\Z` (end of string, where `$` would also
    match before a final newline); JSON Schema patterns are ECMA-262, whose `$` means `\\Z`."""
    if isinstance(node, dict):
        pattern = node.get("pattern")
        if isinstance(pattern, str) and pattern.endswith("\\Z"):
            node["pattern"] = pattern[:-2] + "$"
        for value in node.values():
            _portable_patterns(value)
    elif isinstance(node, list):
        for value in node:
            _portable_patterns(value)


def _strict_nullable_nested(node: Any) -> None:
    """apispec writes a nullable Nested field as `anyOf: [{$ref}, {type: object, nullable}]`,
    whose second branch admits any object at all: `{}` would pass for a push setting that
    needs a url. The second branch is made to admit null alone."""
    if isinstance(node, dict):
        for option in node.get("anyOf", ()):
            if option == {"type": "object", "nullable": True}:
                option["enum"] = [None]
        for value in node.values():
            _strict_nullable_nested(value)
    elif isinstance(node, list):
        for value in node:
            _strict_nullable_nested(value)


def _add_configured_job_types(document: dict[str, Any], job_types: Iterable[str]) -> None:
    """The job types this deployment accepts, as the enum of an enqueue's (and a schedule's
    job template's) `type` and of a claim's `types` (and in their examples, so that each
    example is one this deployment accepts): any other type is refused with a 422."""
    types = sorted(job_types)
    schemas = document["components"]["schemas"]
    if not types:
        return
    # A schedule's job template takes the same types as an enqueue.
    for name in ("Enqueue", "JobTemplate"):
        enqueue: dict[str, Any] | None = schemas.get(name)
        if enqueue is None:
            continue
        enqueue["properties"]["type"]["enum"] = types
        if isinstance(enqueue.get("example"), dict):
            enqueue["example"]["type"] = types[0]
    for name in ("Claim", "ClaimMany"):
        claim: dict[str, Any] | None = schemas.get(name)
        if claim is None:
            continue
        claim["properties"]["types"]["items"]["enum"] = types
        if isinstance(claim.get("example"), dict) and "types" in claim["example"]:
            claim["example"]["types"] = types[:1]
