"""One table maps every error to its problem (app/web/problems.py PROBLEM_TYPES): each domain
error has its entry, and /openapi.json's catalogue lists every problem type a client can meet."""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest
from flask.testing import FlaskClient
from gunicorn.config import Config

import app.core.errors as domain_errors
from app.web.problems import PROBLEM_TYPES, problem_catalogue, problem_type_of
from queuelog_gunicorn.worker import problem_in_place_of
from tests.conftest import Key

DOMAIN_ERRORS = [cls for _, cls in inspect.getmembers(domain_errors, inspect.isclass)
                 if issubclass(cls, BaseException) and cls.__module__ == domain_errors.__name__]


def _catalogued(document: dict[str, Any]) -> set[tuple[str, str, int]]:
    return {(entry["type"], entry["title"], entry["status"])
            for entry in document["x-problem-types"]}


def _answered(body: dict[str, Any]) -> tuple[str, str, int]:
    return body["type"], body["title"], body["status"]


@pytest.fixture
def document(client: FlaskClient) -> dict[str, Any]:
    response = client.get("/openapi.json")
    assert response.status_code == 200
    return response.get_json()


def test_the_domain_errors_are_found() -> None:
    assert {"QueueError", "Conflict", "UniqueConflict", "DatabaseUnavailable"} <= {
        cls.__name__ for cls in DOMAIN_ERRORS}


@pytest.mark.parametrize("error_class", DOMAIN_ERRORS, ids=lambda cls: cls.__name__)
def test_every_domain_error_has_its_own_entry_in_the_table(error_class: type) -> None:
    # Its own: one inherited from a base would answer a new error as its base silently.
    assert error_class in PROBLEM_TYPES


def test_one_problem_type_has_one_title_and_one_status() -> None:
    by_slug: dict[str, set[tuple[str, int]]] = {}
    for kind in PROBLEM_TYPES.values():
        by_slug.setdefault(kind.slug, set()).add((kind.title, kind.status))
    assert {slug: seen for slug, seen in by_slug.items() if len(seen) > 1} == {}


def test_a_raised_error_is_the_problem_of_the_nearest_class_in_its_mro() -> None:
    class Refused(domain_errors.Conflict):
        pass

    assert problem_type_of(Refused("x")).slug == "conflict"
    assert problem_type_of(domain_errors.UniqueConflict("x", 1)).slug == "unique-conflict"
    assert problem_type_of(domain_errors.CountingReadsBusy()).status == 503
    assert problem_type_of(KeyError("x")).status == 500


def test_the_catalogue_lists_each_problem_type_of_the_table_once(
        document: dict[str, Any]) -> None:
    assert document["x-problem-types"] == problem_catalogue()
    types = [entry["type"] for entry in document["x-problem-types"]]
    assert len(types) == len(set(types))
    assert {kind.uri for kind in PROBLEM_TYPES.values()} == set(types)


@pytest.mark.parametrize("error_class", DOMAIN_ERRORS, ids=lambda cls: cls.__name__)
def test_the_catalogue_lists_the_problem_each_domain_error_is_answered_with(
        document: dict[str, Any], error_class: type) -> None:
    kind = problem_type_of(error_class.__new__(error_class))
    assert (kind.uri, kind.title, kind.status) in _catalogued(document)


def test_the_catalogue_lists_the_problems_werkzeug_and_the_api_answer_with(
        client: FlaskClient, document: dict[str, Any], producer: Key) -> None:
    answers = [
        client.get("/nope", headers=producer.headers),                            # 404
        client.delete("/jobs/1", headers=producer.headers),                       # 405
        client.get("/jobs"),                                                      # 401
        client.post("/jobs", data="x", content_type="text/plain",
                    headers=producer.headers),                                    # 415
        client.post("/jobs", json={"type": "nope"}, headers=producer.headers),    # 422
        client.post("/jobs", data="x" * (2 * 1024 * 1024), content_type="application/json",
                    headers=producer.headers),                                    # 413
    ]
    assert sorted(answer.status_code for answer in answers) == [401, 404, 405, 413, 415, 422]
    missing = {_answered(answer.get_json()) for answer in answers} - _catalogued(document)
    assert missing == set()


@pytest.mark.parametrize("status_line", [b"HTTP/1.1 414 Request-URI Too Long",
                                         b"HTTP/1.1 431 Request Header Fields Too Large",
                                         b"HTTP/1.1 400 Bad Request"])
def test_the_catalogue_lists_the_problems_gunicorn_answers_with(
        document: dict[str, Any], status_line: bytes) -> None:
    answer = problem_in_place_of(status_line + b"\r\n\r\n<html></html>", Config())
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert _answered(body) in _catalogued(document)


def test_every_problem_status_the_document_declares_has_a_catalogued_type(
        document: dict[str, Any]) -> None:
    declared = {int(status)
                for item in document["paths"].values()
                for method, operation in item.items() if method != "parameters"
                for status, response in operation["responses"].items()
                if "application/problem+json" in json.dumps(response)
                or "$ref" in response}
    assert declared - {entry["status"] for entry in document["x-problem-types"]} == set()
