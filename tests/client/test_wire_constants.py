"""The client's arguments and limits against the server's own description of its routes,
/openapi.json: a field added to POST /jobs, or a bound moved on the server, fails here
rather than going unnoticed in the client (enqueue() once lacked concurrency_key)."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest
from flask import Flask

from app.core.limits import STORED_ERROR_CHARS
from queuelog_client import Client, Worker
from queuelog_client.client import (
    MAX_CLAIM_JOBS,
    MAX_CLAIM_WAIT_SECONDS,
    MAX_INSTANCE_CHARS,
    MAX_WAIT_PER_REQUEST_SECONDS,
)
from queuelog_client.worker import INSTANCE_PATTERN, MAX_ERROR_CHARS, MAX_RETRY_IN_SECONDS

# Body fields the client fills in itself rather than taking as arguments, and why.
NOT_ARGUMENTS = {
    # Its value must be the key's own name: the server takes it from the key.
    "/jobs/claim": {"worker_id"},
    "/jobs/claim-many": {"worker_id"},
    # A reserved job is made by Client.reserve (tests/client/test_reserve.py), whose
    # arguments carry reserve's fields; enqueue stores a job pending.
    "/jobs": {"reserve"},
}
# Arguments that are not body fields: the path's id, and max_jobs's own name; the W3C trace
# context, sent as headers (contract §20).
PATH_ARGUMENTS = {"job_id"}
HEADER_ARGUMENTS = {"traceparent", "tracestate"}
# Arguments that say what the client does, not what it sends: a heartbeat answered 429
# waits out its Retry-After and goes again, or raises (the runner plans its next beat).
BEHAVIOUR_ARGUMENTS = {"wait_if_too_soon"}


@pytest.fixture
def document(app: Flask) -> dict[str, Any]:
    answer: dict[str, Any] = app.test_client().get("/openapi.json").json
    return answer


def _body_schema(document: dict[str, Any], path: str) -> dict[str, Any]:
    schema = document["paths"][path]["post"]["requestBody"]["content"]["application/json"][
        "schema"]
    while "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _arguments(method: Any) -> set[str]:
    return {name for name in inspect.signature(method).parameters
            if name != "self"} - PATH_ARGUMENTS - HEADER_ARGUMENTS - BEHAVIOUR_ARGUMENTS


@pytest.mark.parametrize(("path", "method"), [
    ("/jobs", Client.enqueue),
    ("/jobs/claim", Client.claim),
    ("/jobs/claim-many", Client.claim_many),
    ("/jobs/{job_id}/heartbeat", Client.heartbeat),
    ("/jobs/{job_id}/complete", Client.complete),
    ("/jobs/{job_id}/fail", Client.fail),
])
def test_every_body_field_of_a_route_is_an_argument_of_its_method(document, path, method):
    fields = set(_body_schema(document, path)["properties"]) - NOT_ARGUMENTS.get(path, set())
    assert _arguments(method) == fields


def _default(method: Any, argument: str) -> Any:
    return inspect.signature(method).parameters[argument].default


def _within(value: Any, schema: dict[str, Any], low: str = "minimum",
            high: str = "maximum") -> bool:
    return bool(schema[low] <= value <= schema[high])


def test_the_clients_waiting_limits_are_the_servers(document):
    for path in ("/jobs/claim", "/jobs/claim-many"):
        claim = _body_schema(document, path)["properties"]["wait_seconds"]
        assert claim["maximum"] == MAX_CLAIM_WAIT_SECONDS
        # What the client and the worker send when the caller says nothing.
        for method in (Client.claim, Client.claim_many, Worker.__init__):
            assert _within(_default(method, "wait_seconds"), claim), (path, method)
    read = next(p for p in document["paths"]["/jobs/{job_id}"]["get"]["parameters"]
                if p["name"] == "wait_seconds")
    longest = f"{MAX_WAIT_PER_REQUEST_SECONDS:g}"
    assert re.fullmatch(read["schema"]["pattern"].strip("^$").replace("$|^", "|"), longest)
    assert not re.search(read["schema"]["pattern"], f"{MAX_WAIT_PER_REQUEST_SECONDS + 1:g}")


def test_the_workers_retry_bounds_are_the_servers(document):
    retry_in = _body_schema(document, "/jobs/{job_id}/fail")["properties"]["retry_in_seconds"]
    # RetryLater holds its seconds to 0..MAX_RETRY_IN_SECONDS.
    assert (retry_in["minimum"], retry_in["maximum"]) == (0, MAX_RETRY_IN_SECONDS)


def test_the_workers_error_cut_is_taken_by_the_server_and_no_longer_than_it_stores(document):
    error = _body_schema(document, "/jobs/{job_id}/fail")["properties"]["error"]
    assert _within(MAX_ERROR_CHARS, error, "minLength", "maxLength")
    # Not in /openapi.json (a cut, not a refusal): the server's table says it.
    assert STORED_ERROR_CHARS.max == MAX_ERROR_CHARS


def test_a_workers_claim_many_asks_for_no_more_jobs_than_the_server_gives(document):
    max_jobs = _body_schema(document, "/jobs/claim-many")["properties"]["max_jobs"]
    assert max_jobs["maximum"] == MAX_CLAIM_JOBS


def test_the_clients_page_size_is_a_limit_the_server_takes(document):
    limit = next(p for p in document["paths"]["/jobs"]["get"]["parameters"]
                 if p["name"] == "limit")
    assert _within(_default(Client.iter_jobs, "page_size"), limit["schema"])


def test_a_worker_running_more_jobs_than_one_claim_many_takes_asks_for_no_more(document):
    max_jobs = _body_schema(document, "/jobs/claim-many")["properties"]["max_jobs"]
    asked: list[int] = []

    class Recording:
        def claim_many(self, max_jobs: int, **_: Any) -> list[Any]:
            asked.append(max_jobs)
            return []

    worker = Worker("http://127.0.0.1:9", lambda job: None, token="unused",
                    concurrency=max_jobs["maximum"] + 50)
    worker.client = Recording()  # type: ignore[assignment]
    worker._claim(worker.concurrency)
    assert asked == [max_jobs["maximum"]]


def test_the_workers_instance_label_is_the_one_the_server_takes(document):
    for path in ("/jobs/claim", "/jobs/claim-many", "/jobs/{job_id}/heartbeat"):
        instance = _body_schema(document, path)["properties"]["instance"]
        assert (instance["minLength"], instance["maxLength"]) == (1, MAX_INSTANCE_CHARS)
        assert instance["pattern"] == INSTANCE_PATTERN.pattern.replace("\\Z", "$")
