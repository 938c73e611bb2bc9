"""Inputs the proofs (schemathesis, by hand) found answered 500 or stored something unservable,
each pinned here on both engines: they are refused with a 422 problem, or stored safely."""

from __future__ import annotations

import base64
from typing import Any

from flask import Flask
from flask.testing import FlaskClient


def _problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.mimetype == "application/problem+json"
    return response.get_json()


def test_a_number_that_overflows_a_double_is_refused_not_stored_as_infinity(
        client: FlaskClient, producer: Any) -> None:
    for number in ("1e400", "-1e400"):
        response = client.post("/jobs", headers=producer.headers,
                               data=f'{{"type": "email", "payload": {{"x": {number}}}}}',
                               content_type="application/json")

        assert _problem(response, 422)["errors"] == {"_body": ["Invalid JSON."]}


def test_a_cursor_naming_an_id_beyond_64_bits_is_refused(
        client: FlaskClient, admin: Any) -> None:
    cursor = base64.urlsafe_b64encode(b"v1:99999999999999999999999").decode().rstrip("=")

    response = client.get("/jobs", query_string={"cursor": cursor}, headers=admin.headers)

    assert _problem(response, 422)["errors"] == {"cursor": ["Invalid cursor."]}


def test_nul_in_a_claimed_type_a_listed_type_or_a_lease_token_is_refused(
        client: FlaskClient, api: Any, producer: Any, worker: Any) -> None:
    job_id = api.enqueue(producer).get_json()["id"]
    assert api.claim(worker).status_code == 200

    claim = api.claim(worker, types=["em\x00ail"])
    listing = client.get("/jobs", query_string={"type": "em\x00ail"}, headers=worker.headers)
    heartbeat = api.heartbeat(worker, job_id, lease_token="t\x00ken")

    assert set(_problem(claim, 422)["errors"]) == {"types.0"}
    assert set(_problem(listing, 422)["errors"]) == {"type"}
    assert set(_problem(heartbeat, 422)["errors"]) == {"lease_token"}
    assert api.complete(worker, job_id).status_code == 200


def test_a_failure_message_holding_nul_is_kept_with_a_replacement_character(
        api: Any, producer: Any, worker: Any, admin: Any) -> None:
    job_id = api.enqueue(producer, max_retries=0).get_json()["id"]
    api.claim(worker)

    failed = api.fail(worker, job_id, error="read \x00\x01 from the socket")

    assert failed.status_code == 200, failed.get_json()
    assert api.get(admin, job_id).get_json()["error"] == "read \ufffd\x01 from the socket"


def test_the_app_routes_no_static_files(app: Flask, client: FlaskClient, admin: Any) -> None:
    assert "static" not in app.view_functions
    _problem(client.get("/static/app.js", headers=admin.headers), 404)
