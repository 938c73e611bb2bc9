"""When the client sends a request again: after a connection error or a 5xx, with the same
idempotency key, a bounded number of times; never after a 4xx.

A scripted loopback HTTP server plays the answers, so each case is exact and fast."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from queuelog_client import (
    Client,
    ProblemError,
    ServerError,
    ServerUnreachable,
    ServiceUnavailable,
    ValidationFailed,
)
from tests.servers import free_port

PROBLEM = "application/problem+json"


class ScriptedServer:
    """Answers each request with the next scripted (status, headers, body); records them."""

    def __init__(self) -> None:
        self.script: list[tuple[int, dict[str, str], Any]] = []
        self.requests: list[dict[str, Any]] = []
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                scripted.requests.append({"method": self.command, "path": self.path,
                                          "headers": dict(self.headers),
                                          "body": json.loads(body) if body else None})
                status, headers, answer = scripted.script.pop(0)
                data = b"" if answer is None else json.dumps(answer).encode()
                self.send_response(status)
                content_type = PROBLEM if status >= 400 else "application/json"
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _problem(status: int, title: str, **extra: Any) -> dict[str, Any]:
    return {"type": f"https://queuelog.dev/problems/{title.lower()}", "title": title,
            "status": status, "detail": f"{title}.", **extra}


JOB = {"id": 1, "type": "email", "status": "pending", "idempotency_key": "k"}


@pytest.fixture
def scripted() -> Iterator[ScriptedServer]:
    server = ScriptedServer()
    yield server
    server.close()


def _client(url: str, **options: Any) -> Client:
    return Client(url, "token", backoff_seconds=0.001, max_backoff_seconds=0.01, **options)


def test_a_503_is_retried_after_its_retry_after_with_the_same_idempotency_key(scripted):
    scripted.script = [
        (503, {"Retry-After": "0"}, _problem(503, "Service unavailable")),
        (503, {"Retry-After": "0"}, _problem(503, "Service unavailable")),
        (201, {}, JOB),
    ]
    job = _client(scripted.url).enqueue("email", {"to": "ada@example.com"})

    assert job["id"] == 1
    keys = [request["headers"]["Idempotency-Key"] for request in scripted.requests]
    assert len(keys) == 3 and len(set(keys)) == 1


def test_every_item_of_a_retried_batch_keeps_its_generated_key(scripted):
    scripted.script = [(500, {}, _problem(500, "Internal server error")),
                       (201, {}, {"jobs": [JOB, JOB]})]
    _client(scripted.url).enqueue_many([{"type": "email"}, {"type": "pdf"}])

    first, second = (request["body"]["jobs"] for request in scripted.requests)
    assert first == second
    assert first[0]["idempotency_key"] != first[1]["idempotency_key"]


def test_5xx_answers_are_retried_a_bounded_number_of_times(scripted):
    scripted.script = [(503, {}, _problem(503, "Service unavailable"))] * 3
    with pytest.raises(ServiceUnavailable) as caught:
        _client(scripted.url, max_attempts=3).get_job(1)
    assert caught.value.status == 503
    assert isinstance(caught.value, ServerError)
    assert len(scripted.requests) == 3


def test_a_4xx_is_never_retried(scripted):
    scripted.script = [(422, {}, _problem(422, "Validation failed",
                                          errors={"type": ["Unknown job type."]}))]
    with pytest.raises(ValidationFailed) as caught:
        _client(scripted.url).enqueue("fax")
    assert caught.value.errors == {"type": ["Unknown job type."]}
    assert len(scripted.requests) == 1


def test_an_error_answer_that_is_not_a_problem_still_raises_a_typed_error(scripted):
    scripted.script = [(404, {}, None)]
    with pytest.raises(ProblemError) as caught:
        _client(scripted.url).get_job(7)
    assert caught.value.status == 404
    assert caught.value.title == "Not Found"


def test_a_server_that_never_answers_raises_server_unreachable_after_the_attempts():
    client = _client(f"http://127.0.0.1:{free_port()}", max_attempts=3)
    with pytest.raises(ServerUnreachable) as caught:
        client.list_jobs()
    assert "3 attempts" in str(caught.value)


def test_a_claim_that_finds_nothing_is_none(scripted):
    scripted.script = [(204, {}, None)]
    assert _client(scripted.url).claim(types=["email"], wait_seconds=0) is None
    assert scripted.requests[0]["body"] == {"wait_seconds": 0, "types": ["email"]}


def test_the_token_is_sent_as_a_bearer_and_never_shown(scripted):
    scripted.script = [(200, {}, {"jobs": [], "next_cursor": None})]
    client = Client(scripted.url, "s3cret-token")
    client.list_jobs(status="pending")

    assert scripted.requests[0]["headers"]["Authorization"] == "Bearer s3cret-token"
    assert scripted.requests[0]["path"] == "/jobs?status=pending"
    assert "s3cret" not in repr(client)


def test_a_url_prefix_is_kept_in_front_of_every_path(scripted):
    scripted.script = [(200, {}, JOB)]
    _client(scripted.url + "/queue/").get_job(1)
    assert scripted.requests[0]["path"] == "/queue/jobs/1"


def test_the_token_defaults_to_queuelog_token(monkeypatch, scripted):
    monkeypatch.setenv("QUEUELOG_TOKEN", "from-env")
    scripted.script = [(200, {}, JOB)]
    Client(scripted.url).get_job(1)
    assert scripted.requests[0]["headers"]["Authorization"] == "Bearer from-env"

    monkeypatch.delenv("QUEUELOG_TOKEN")
    with pytest.raises(ValueError, match="QUEUELOG_TOKEN"):
        Client(scripted.url)


def test_a_retry_after_is_waited_out_but_never_longer_than_a_minute():
    client = Client("http://127.0.0.1:9", "token", backoff_seconds=1, max_backoff_seconds=4)
    assert client._delay(1, retry_after=7.0) == 7.0
    assert client._delay(1, retry_after=3600.0) == 60.0
    # Without one: exponential, capped, jittered within [ceiling / 2, ceiling].
    assert 0.5 <= client._delay(1, None) <= 1
    assert 2 <= client._delay(3, None) <= 4
    assert 2 <= client._delay(10, None) <= 4
