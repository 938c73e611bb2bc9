"""Every error is an RFC 9457 problem with a 4xx status; nothing leaks; bad input loses nothing."""

from __future__ import annotations

import json

import pytest

from app import create_app
from app.core.callers import Role
from app.web.problems import PROBLEM_TYPES

PROBLEM_FIELDS = {"type", "title", "status", "detail"}


def assert_problem(response, status):
    assert response.status_code == status
    assert response.content_type == "application/problem+json"
    body = response.json
    assert set(body) >= PROBLEM_FIELDS
    assert body["status"] == status
    assert body["type"].startswith("https://")
    text = response.get_data(as_text=True)
    for leak in ("Traceback", "SELECT", "INSERT", "sqlite", "/work/", ".py"):
        assert leak not in text
    return body


# (route, body bytes or JSON text, content type, expected status)
MALFORMED = [
    ("/jobs", b"{", "application/json", 422),
    ("/jobs", b"[]", "application/json", 422),
    ("/jobs", b'"text"', "application/json", 422),
    ("/jobs", b"null", "application/json", 422),
    ("/jobs", b"\xff\xfe", "application/json", 422),
    ("/jobs", b'{"type": "email", "payload": NaN}', "application/json", 422),
    ("/jobs", b'{"type": "email", "max_retries": Infinity}', "application/json", 422),
    ("/jobs", b'{"type": "email", "payload": "\\ud800"}', "application/json", 422),
    ("/jobs", b'{"type": "email", "payload": {"k": "\\udc00"}}', "application/json", 422),
    ("/jobs", b'{"type": "email", "payload": []}', "application/json", 422),
    ("/jobs", b'{"type": "email", "payload": "x"}', "application/json", 422),
    ("/jobs", b'{"type": 5}', "application/json", 422),
    ("/jobs", b'{"type": ""}', "application/json", 422),
    ("/jobs", b"{}", "application/json", 422),
    ("/jobs", b'{"type": "email", "priority": "urgent"}', "application/json", 422),
    ("/jobs", b'{"type": "email", "priority": 10}', "application/json", 422),
    ("/jobs", b'{"type": "email", "max_retries": true}', "application/json", 422),
    ("/jobs", b'{"type": "email", "max_retries": "3"}', "application/json", 422),
    ("/jobs", b'{"type": "email", "max_retries": 2.5}', "application/json", 422),
    ("/jobs", b'{"type": "email", "max_retries": 26}', "application/json", 422),
    ("/jobs", b'{"type": "email", "max_retries": -1}', "application/json", 422),
    ("/jobs", b'{"type": "email", "delay_seconds": 31536001}', "application/json", 422),
    ("/jobs", b'{"type": "email", "run_at": "tomorrow"}', "application/json", 422),
    ("/jobs", b'{"type": "email", "run_at": "2027-01-15T10:00:00"}', "application/json", 422),
    ("/jobs", b'{"type": "email", "run_at": "1969-12-31T23:59:59Z"}', "application/json", 422),
    ("/jobs", b'{"type": "email", "run_at": "9999-99-99T00:00:00Z"}', "application/json", 422),
    ("/jobs", b'{"type": "email", "extra": 1}', "application/json", 422),
    ("/jobs", b'{"type": "email"}', "text/plain", 415),
    ("/jobs", b'{"type": "email"}', "application/x-www-form-urlencoded", 415),
    ("/jobs", b"[" * 100_000, "application/json", 422),
    ("/jobs/claim", b'{"types": "email"}', "application/json", 422),
    ("/jobs/claim", b'{"types": [1]}', "application/json", 422),
    ("/jobs/claim", b'{"lease_seconds": 0}', "application/json", 422),
    ("/jobs/claim", b'{"lease_seconds": 3601}', "application/json", 422),
    ("/jobs/claim", b'{"bogus": true}', "application/json", 422),
    ("/jobs/claim", b"{", "application/json", 422),
    ("/jobs/1/complete", b'{"result": [1]}', "application/json", 422),
    ("/jobs/1/complete", b'{"lease_token": 5}', "application/json", 422),
    ("/jobs/1/fail", b"{}", "application/json", 422),
    ("/jobs/1/fail", b'{"error": ""}', "application/json", 422),
    ("/jobs/1/fail", b'{"error": 1}', "application/json", 422),
    ("/jobs/1/fail", b'{"error": "x", "retry_in_seconds": 86401}', "application/json", 422),
    ("/jobs/1/fail", b'{"error": "x", "retry_in_seconds": false}', "application/json", 422),
    ("/jobs/1/heartbeat", b'{"lease_seconds": "60"}', "application/json", 422),
    ("/jobs/1/cancel", b'{"why": "x"}', "application/json", 422),
]


@pytest.mark.parametrize("path,body,content_type,status", MALFORMED,
                         ids=[f"{p} {b[:40]!r}" for p, b, _, _ in MALFORMED])
def test_malformed_requests_get_a_4xx_problem_and_change_nothing(
        client, api, producer, worker, admin, path, body, content_type, status):
    # A running job 1 for the worker routes, so that only the body can be at fault.
    api.enqueue(producer)
    api.claim(worker)
    key = {"/jobs": producer, "/jobs/1/cancel": admin}.get(path, worker)
    before = api.list(admin).json

    response = client.post(path, data=body, content_type=content_type, headers=key.headers)

    problem = assert_problem(response, status)
    if status == 422:
        assert problem["errors"]
    assert api.list(admin).json == before


def test_field_errors_name_nested_paths_with_dots(client, worker):
    response = client.post("/jobs/claim", json={"types": ["email", 7]}, headers=worker.headers)
    assert assert_problem(response, 422)["errors"] == {"types.1": ["Not a valid string."]}


def test_unknown_route_is_a_404_problem(client, producer):
    assert_problem(client.get("/nope", headers=producer.headers), 404)


def test_wrong_method_is_a_405_problem_with_allow(client, producer):
    response = client.delete("/jobs/1", headers=producer.headers)
    assert_problem(response, 405)
    assert "GET" in response.headers["Allow"]


def test_body_over_max_content_length_is_a_413_problem(app_config, make_key):
    app_config["MAX_CONTENT_LENGTH"] = 2048
    application = create_app(app_config)
    token = application.extensions["queuelog"].keys.create_key("p", Role.PRODUCER)
    body = json.dumps({"type": "email", "payload": {"x": "y" * 4000}})
    response = application.test_client().post(
        "/jobs", data=body, content_type="application/json",
        headers={"Authorization": f"Bearer {token}"})
    problem = assert_problem(response, 413)
    assert "2048 bytes" in problem["detail"]
    application.extensions["queuelog"].db.engine.dispose()


def test_an_unexpected_error_is_a_500_problem_without_details(app_config):
    app_config["TESTING"] = False
    application = create_app(app_config)

    @application.get("/explode")
    def explode():
        raise RuntimeError("secret internals at /work/app/x.py")

    response = application.test_client().get("/explode")
    body = assert_problem(response, 500)
    assert "secret" not in json.dumps(body)
    application.extensions["queuelog"].db.engine.dispose()


@pytest.mark.parametrize("path", ["/jobs/1?x=1", "/jobs/claim?wait=5"])
def test_unknown_query_parameters_are_422(client, api, producer, worker, path):
    api.enqueue(producer)
    key = worker if "claim" in path else producer
    method = client.post if "claim" in path else client.get
    response = method(path, headers=key.headers)
    body = assert_problem(response, 422)
    assert list(body["errors"].values()) == [["Unknown query parameter."]]
    assert api.claim(worker).status_code == 200  # the refused claim took nothing


def _sentence_case(title):
    return title == title[:1].upper() + title[1:].lower()


def test_problem_titles_are_in_sentence_case_whoever_raised_them(client, api, producer,
                                                                  worker, admin):
    answers = [
        client.get("/nope", headers=producer.headers),            # Werkzeug's 404
        api.get(producer, 99),                                     # queuelog's 404
        client.delete("/jobs/1", headers=producer.headers),       # Werkzeug's 405
        client.get("/jobs"),                                       # 401
        api.claim(producer),                                       # 403
        api.retry(admin, api.enqueue(producer).json["id"]),        # 409
        client.post("/jobs", data="x", content_type="text/plain",
                    headers=producer.headers),                     # 415
        api.enqueue(producer, type="nope"),                        # 422
    ]
    titles = {answer.status_code: answer.get_json()["title"] for answer in answers}
    assert titles[404] == "Not found" and titles[405] == "Method not allowed"
    assert all(_sentence_case(title) for title in titles.values()), titles
    assert all(_sentence_case(kind.title) for kind in PROBLEM_TYPES.values())


def test_a_204_carries_no_content_type(api, worker):
    response = api.claim(worker)
    assert response.status_code == 204
    assert "Content-Type" not in response.headers
