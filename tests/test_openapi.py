"""/openapi.json describes the app as it is: every route, its bodies and every status it answers."""

from __future__ import annotations

import re
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.history.explain import ReasonCode
from app.web.openapi import api_rules
from tests.conftest import JOB_TYPES

PROBLEM_TYPE = "application/problem+json"
IMPLICIT_METHODS = {"HEAD", "OPTIONS"}
WORKER_ONLY = {"claim_job", "claim_many_jobs", "heartbeat_job", "complete_job", "fail_job",
               "complete_many_jobs", "suspend_job"}


@pytest.fixture
def document(client: FlaskClient) -> dict[str, Any]:
    response = client.get("/openapi.json")
    assert response.status_code == 200
    return response.get_json()


def _operations(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method.upper(), path): operation
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if method != "parameters"
    }


def _route_table(app: Flask) -> set[tuple[str, str]]:
    return {
        (method, re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule))
        for rule in api_rules(app)
        for method in (rule.methods or set()) - IMPLICIT_METHODS
    }


def _resolve(document: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        *_, section, name = node["$ref"].split("/")
        node = document["components"][section][name]
    return node


def test_openapi_json_is_served_without_a_key_as_an_openapi_3_document(
        client: FlaskClient) -> None:
    response = client.get("/openapi.json")

    assert response.status_code == 200
    assert response.mimetype == "application/json"
    document = response.get_json()
    assert document["openapi"].startswith("3.")
    assert document["info"]["title"] == "queuelog HTTP API"


def test_a_generated_clients_package_is_not_named_like_ours(document: dict[str, Any]) -> None:
    # openapi-python-client names the package it generates after the title, snake-cased
    # with "_client" added; "queuelog" gave queuelog_client, our own client's import name.
    words = re.findall(r"[a-z0-9]+", document["info"]["title"].lower())
    assert "_".join([*words, "client"]) != "queuelog_client"


def test_every_route_of_the_app_appears_in_the_document_and_nothing_else(
        app: Flask, document: dict[str, Any]) -> None:
    assert set(_operations(document)) == _route_table(app)


def test_every_operation_is_documented(document: dict[str, Any]) -> None:
    undocumented = [f"{method} {path}" for (method, path), operation
                    in _operations(document).items() if "default" in operation["responses"]]

    assert undocumented == [], "add @documented(...) to these views"


def test_every_keyed_operation_declares_bearer_auth_401_403_and_503(
        document: dict[str, Any]) -> None:
    assert document["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http", "scheme": "bearer",
        "description": document["components"]["securitySchemes"]["bearerAuth"]["description"],
    }
    for (method, path), operation in _operations(document).items():
        # A waitpoint's token is its own capability (docs/WAITS.md): no API key.
        if path in {"/openapi.json", "/healthz", "/readyz", "/waitpoints/{token}"}:
            assert operation["security"] == [], f"{path} needs no key"
            continue
        assert operation["security"] == [{"bearerAuth": []}], f"{method} {path}"
        assert {"401", "403", "503"} <= set(operation["responses"]), f"{method} {path}"


def test_a_401_is_documented_as_a_problem_with_www_authenticate(
        document: dict[str, Any]) -> None:
    unauthorized = _resolve(document, document["paths"]["/jobs"]["get"]["responses"]["401"])

    assert list(unauthorized["content"]) == [PROBLEM_TYPE]
    assert unauthorized["headers"]["WWW-Authenticate"]["required"] is True
    problem = _resolve(document, unauthorized["content"][PROBLEM_TYPE]["schema"])
    assert set(problem["required"]) == {"type", "title", "status", "detail"}
    assert "errors" in problem["properties"]


def test_every_operation_that_reads_a_body_declares_413_415_and_422(
        document: dict[str, Any]) -> None:
    for (method, path), operation in _operations(document).items():
        if "requestBody" in operation:
            assert {"413", "415", "422"} <= set(operation["responses"]), f"{method} {path}"
            assert list(operation["requestBody"]["content"]) == ["application/json"]


def test_a_414_is_documented_as_the_problem_the_server_answers_it_with(
        document: dict[str, Any]) -> None:
    # queuelog's gunicorn worker answers a request line past limit_request_line with a
    # problem (queuelog_gunicorn/worker.py), before the app runs: the document says so.
    with_query = [(key, operation) for key, operation in _operations(document).items()
                  if any(parameter.get("in") == "query"
                         for parameter in operation.get("parameters", []))]
    assert with_query
    for (method, path), operation in with_query:
        too_long = _resolve(document, operation["responses"]["414"])
        assert list(too_long["content"]) == ["application/problem+json"], f"{method} {path}"


def test_each_route_declares_the_statuses_the_contract_gives_it(
        document: dict[str, Any]) -> None:
    declared = {key: set(operation["responses"])
                for key, operation in _operations(document).items()}

    assert {"201", "200", "409"} <= declared["POST", "/jobs"]
    assert {"200", "204"} <= declared["POST", "/jobs/claim"]
    assert "422" in declared["GET", "/jobs"]
    assert "404" in declared["GET", "/jobs/{job_id}"]
    for action in ("heartbeat", "complete", "fail", "cancel", "retry"):
        assert {"200", "404", "409"} <= declared["POST", f"/jobs/{{job_id}}/{action}"]


def test_enqueue_documents_its_headers_and_the_configured_job_types(
        document: dict[str, Any]) -> None:
    enqueue = document["paths"]["/jobs"]["post"]
    created, replayed = enqueue["responses"]["201"], enqueue["responses"]["200"]
    body = _resolve(document, enqueue["requestBody"]["content"]["application/json"]["schema"])

    assert set(created["headers"]) == {"Location"}
    assert set(replayed["headers"]) == {"Location", "Idempotent-Replayed", "Deduplicated"}
    assert [_resolve(document, p)["name"] for p in enqueue["parameters"]] == ["Idempotency-Key"]
    assert body["properties"]["type"]["enum"] == sorted(JOB_TYPES)
    assert body["example"]["type"] in JOB_TYPES


@pytest.mark.parametrize("path", ["/jobs/claim", "/jobs/claim-many"])
def test_claims_document_the_configured_job_types(document: dict[str, Any], path: str) -> None:
    claim = document["paths"][path]["post"]
    body = _resolve(document, claim["requestBody"]["content"]["application/json"]["schema"])
    assert body["properties"]["types"]["items"]["enum"] == sorted(JOB_TYPES)
    assert body["properties"]["types"]["maxItems"] == 100


def test_claim_documents_204_without_a_body(document: dict[str, Any]) -> None:
    assert "content" not in document["paths"]["/jobs/claim"]["post"]["responses"]["204"]


def _key_for(operation_id: str, keys: dict[str, Any]) -> Any:
    return keys["worker"] if operation_id in WORKER_ONLY else keys["admin"]


def test_the_documented_body_fields_are_exactly_the_fields_the_route_validates(
        client: FlaskClient, document: dict[str, Any], admin: Any, worker: Any) -> None:
    """Each documented property is known to the route's validator, and a property the
    document does not list is refused as unknown: the two cannot drift apart."""
    keys = {"admin": admin, "worker": worker}
    for (method, path), operation in _operations(document).items():
        if "requestBody" not in operation:
            continue
        url = re.sub(r"\{\w+\}", "999", path)  # {job_id}, {workflow_id}: no such one
        headers = _key_for(operation["operationId"], keys).headers
        schema = _resolve(document,
                          operation["requestBody"]["content"]["application/json"]["schema"])

        unknown = client.open(url, method=method, json={"not_a_field": 1}, headers=headers)
        assert unknown.status_code == 422, (method, path)
        assert unknown.get_json()["errors"]["not_a_field"] == ["Unknown field."]

        for name in schema["properties"]:
            # A list is the wrong type for every field here but `types`; either way the
            # answer must not call the documented field unknown.
            answer = client.open(url, method=method, json={name: [None]}, headers=headers)
            errors = (answer.get_json() or {}).get("errors", {})
            assert errors.get(name) != ["Unknown field."], (method, path, name)


def test_the_documented_examples_are_accepted(
        client: FlaskClient, document: dict[str, Any], clock: Any, admin: Any,
        worker: Any) -> None:
    def example(name: str) -> dict[str, Any]:
        return document["components"]["schemas"][name]["example"]

    for _ in range(2):
        created = client.post("/jobs", json=example("Enqueue"), headers=admin.headers)
        assert created.status_code == 201, created.get_json()
    clock.advance(example("Enqueue")["delay_seconds"])

    claims = [client.post("/jobs/claim", json=example("Claim"), headers=worker.headers)
              for _ in range(2)]
    assert [c.status_code for c in claims] == [200, 200]
    first, second = (c.get_json()["id"] for c in claims)
    for url, name in ((f"/jobs/{first}/heartbeat", "Heartbeat"),
                      (f"/jobs/{first}/complete", "Complete"),
                      (f"/jobs/{second}/fail", "Fail")):
        answer = client.post(url, json=example(name), headers=worker.headers)
        assert answer.status_code == 200, (name, answer.get_json())


def test_the_documented_reason_codes_are_every_code_explain_gives(
        document: dict[str, Any]) -> None:
    code = document["components"]["schemas"]["Reason"]["properties"]["code"]
    assert sorted(code["enum"]) == sorted(ReasonCode)
