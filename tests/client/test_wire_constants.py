"""The client's arguments and limits against the server's own description of its routes,
/openapi.json: a field added to POST /jobs, or a bound moved on the server, fails here
rather than going unnoticed in the client (issue 28.4: enqueue() lacked concurrency_key)."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest
from flask import Flask

from queuelog_client import Client
from queuelog_client.client import MAX_CLAIM_WAIT_SECONDS, MAX_WAIT_PER_REQUEST_SECONDS
from queuelog_client.worker import MAX_RETRY_IN_SECONDS

# Body fields the client fills in itself rather than taking as arguments, and why.
NOT_ARGUMENTS = {
    # Its value must be the key's own name: the server takes it from the key.
    "/jobs/claim": {"worker_id"},
    "/jobs/claim-many": {"worker_id"},
}
# Arguments that are not body fields: the path's id, and max_jobs's own name.
PATH_ARGUMENTS = {"job_id"}


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
            if name != "self"} - PATH_ARGUMENTS


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


def test_the_clients_waiting_limits_are_the_servers(document):
    claim = _body_schema(document, "/jobs/claim")["properties"]["wait_seconds"]
    assert claim["maximum"] == MAX_CLAIM_WAIT_SECONDS
    read = next(p for p in document["paths"]["/jobs/{job_id}"]["get"]["parameters"]
                if p["name"] == "wait_seconds")
    longest = f"{MAX_WAIT_PER_REQUEST_SECONDS:g}"
    assert re.fullmatch(read["schema"]["pattern"].strip("^$").replace("$|^", "|"), longest)
    assert not re.search(read["schema"]["pattern"], f"{MAX_WAIT_PER_REQUEST_SECONDS + 1:g}")


def test_the_workers_retry_ceiling_is_the_servers(document):
    retry_in = _body_schema(document, "/jobs/{job_id}/fail")["properties"]["retry_in_seconds"]
    assert retry_in["maximum"] == MAX_RETRY_IN_SECONDS
