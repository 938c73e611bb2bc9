"""One JSON line per request on stdout, with X-Request-ID taken from the caller or made up."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from app.ops.logging import MAX_REQUEST_ID_LENGTH, request_id_from

FIELDS = {"time", "level", "logger", "method", "route", "path", "status", "duration_ms",
          "request_id", "key_name"}
RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def request_lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    out = capsys.readouterr().out
    lines = [json.loads(line) for line in out.splitlines()]  # every line is JSON
    return [line for line in lines if line["logger"] == "queuelog.request"]


def test_each_request_logs_one_json_line_with_the_fields(
        api: Any, client: Any, producer: Any, worker: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    job_id = api.enqueue(producer, headers={"X-Request-ID": "trace-42"}).json["id"]
    api.get(producer, job_id)
    client.get("/jobs")  # no key
    client.get("/nowhere")
    api.claim(worker)

    lines = request_lines(capsys)

    assert len(lines) == 5
    for line in lines:
        assert set(line) == FIELDS
        assert RFC3339_UTC.match(line["time"])
        assert isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0
        assert line["level"] == "info"
    enqueue, get, anonymous, unknown, claim = lines
    assert enqueue | {"time": None, "duration_ms": None} == {
        "time": None, "duration_ms": None, "level": "info", "logger": "queuelog.request",
        "method": "POST", "route": "/jobs", "path": "/jobs", "status": 201,
        "request_id": "trace-42", "key_name": "producer-1"}
    assert (get["route"], get["path"], get["status"]) == (
        "/jobs/<id:job_id>", f"/jobs/{job_id}", 200)
    assert (anonymous["status"], anonymous["key_name"]) == (401, None)
    assert (unknown["route"], unknown["path"], unknown["status"]) == (None, "/nowhere", 404)
    assert (claim["key_name"], claim["status"]) == ("worker-1", 200)


def test_the_request_id_is_returned_and_generated_when_absent(
        client: Any, api: Any, producer: Any, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    given = api.enqueue(producer, headers={"X-Request-ID": "abc-123"})
    first, second = client.get("/healthz"), client.get("/healthz")
    problem = client.get("/jobs")  # an error answer carries it too

    assert given.headers["X-Request-ID"] == "abc-123"
    generated = [first.headers["X-Request-ID"], second.headers["X-Request-ID"],
                 problem.headers["X-Request-ID"]]
    assert all(re.fullmatch(r"[0-9a-f]{32}", rid) for rid in generated)
    assert len(set(generated)) == 3
    logged = [line["request_id"] for line in request_lines(capsys)]
    assert logged == ["abc-123", *generated]


@pytest.mark.parametrize(("sent", "kept"), [
    ("4bf92f3577b34da6a3ce929d0e0e4736", "4bf92f3577b34da6a3ce929d0e0e4736"),
    ("svc:host/42@eu+1=ok", "svc:host/42@eu+1=ok"),
    ("has spaces\tand \"quotes\" <tags>", "hasspacesandquotestags"),
    ("x" * 1000, "x" * MAX_REQUEST_ID_LENGTH),
    ("é日本", None),
    ("   ", None),
])
def test_a_callers_request_id_is_sanitised_and_bounded(sent: str, kept: str | None) -> None:
    result = request_id_from(sent)
    if kept is None:
        assert re.fullmatch(r"[0-9a-f]{32}", result)
    else:
        assert result == kept


def test_a_hostile_request_id_neither_splits_the_line_nor_reaches_the_header(
        client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    response = client.get("/healthz", headers={"X-Request-ID": 'a"}\\u0000{"b'})
    (line,) = request_lines(capsys)
    assert line["request_id"] == "au0000b"
    assert response.headers["X-Request-ID"] == "au0000b"


def test_no_token_payload_query_or_error_text_reaches_the_log(
        api: Any, client: Any, producer: Any, worker: Any, admin: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    job_id = api.enqueue(producer, payload={"card": "4111-SECRET-PAYLOAD"}).json["id"]
    api.claim(worker)
    api.fail(worker, job_id, error="boom: SECRET-ERROR-TEXT at line 3")
    client.get("/jobs?status=pending&type=SECRET-QUERY", headers=admin.headers)
    client.get("/jobs", headers={"Authorization": "Bearer ql_SECRET-BAD-TOKEN"})

    out = capsys.readouterr().out

    assert len(out.splitlines()) == 5
    assert "SECRET" not in out
    for key in (producer, worker, admin):
        assert key.token not in out
