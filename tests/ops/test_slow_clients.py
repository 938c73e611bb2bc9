"""Slow and half-open clients against real gunicorn under the shipped gunicorn.conf.py: no
number of them keeps the service from answering others; a request not whole within 10 s is
dropped; a slow but whole request within that time is served (queuelog_gunicorn/worker.py)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator

import pytest
import requests

from tests.ops.raw_http import RawConnection, request_bytes
from tests.servers import (
    HOST,
    GunicornServer,
    bearer,
    create_api_key,
    free_port,
    gunicorn_argv,
    server_environment,
)

pytestmark = pytest.mark.slow

DEADLINE_SECONDS = 10  # the contract's
# Far beyond the deadline, so that a loaded machine cannot make a test fail; the tests
# assert what happens, never how fast.
PATIENCE_SECONDS = 40
HALF_OPEN = 60


@pytest.fixture(scope="module")
def served(sqlite_template: str, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[GunicornServer, str]]:
    """The shipped settings with their default thread count (16 per worker), two workers:
    fewer threads in all than the half-open connections below. One server for the module:
    each test leaves it as it found it (its slow connections closed, by the server or by the
    test). Returns (server, token)."""
    directory = tmp_path_factory.mktemp("served")
    database = directory / "served.sqlite3"
    shutil.copyfile(sqlite_template, database)
    url = f"sqlite:///{database}"
    port = free_port()
    server = GunicornServer(gunicorn_argv(), server_environment(
        directory, QUEUELOG_DATABASE_URL=url, QUEUELOG_JOB_TYPES="email",
        GUNICORN_WORKERS="2", QUEUELOG_BIND=f"{HOST}:{port}"), port=port, logs=directory)
    try:
        server.start().wait_until_answering()
        yield server, create_api_key(url, "producer-1", "producer")
    finally:
        server.kill()


@pytest.fixture
def connections() -> Iterator[list[RawConnection]]:
    opened: list[RawConnection] = []
    yield opened
    for connection in opened:
        connection.close()


def enqueue(server: GunicornServer, token: str, n: int) -> requests.Response:
    return requests.post(server.url_of("/jobs"), json={"type": "email", "payload": {"n": n}},
                         headers=bearer(token), timeout=PATIENCE_SECONDS)


def test_half_open_connections_do_not_stop_the_service_and_are_closed_after_the_deadline(
        served: tuple[GunicornServer, str], connections: list[RawConnection]) -> None:
    server, token = served
    for n in range(HALF_OPEN):
        connection = RawConnection(server.port)
        connections.append(connection)
        # A request line and one header, no key, then nothing; a few send nothing at all.
        if n % 10:
            connection.send(b"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n")

    # While all of them are held open, the service answers others, as often as asked.
    for n in range(5):
        health = requests.get(server.url_of("/healthz"), timeout=PATIENCE_SECONDS)
        assert health.status_code == 200 and health.json() == {"status": "ok"}
        created = enqueue(server, token, n)
        assert created.status_code == 201, created.text
    with requests.Session() as session:  # keep-alive still serves several requests
        for _ in range(3):
            assert session.get(server.url_of("/healthz"), timeout=PATIENCE_SECONDS).ok

    # Each of them is closed by the server, without an answer, once the deadline passes.
    assert all(connection.closed_by_server(within=PATIENCE_SECONDS)
               for connection in connections)
    assert requests.get(server.url_of("/healthz"), timeout=PATIENCE_SECONDS).ok


def test_a_slow_but_whole_request_within_the_deadline_is_served(
        served: tuple[GunicornServer, str], connections: list[RawConnection]) -> None:
    server, token = served
    for n, chunked in enumerate((False, True)):
        raw = request_bytes("POST", "/jobs", token=token, chunked=chunked,
                            body={"type": "email", "payload": {"n": n, "text": "x" * 40}})
        connection = RawConnection(server.port)
        connections.append(connection)
        pieces = [raw[i:i + len(raw) // 20 + 1] for i in range(0, len(raw), len(raw) // 20 + 1)]
        for piece in pieces:  # about 3 s in all, each piece in its own packet
            connection.send(piece)
            time.sleep(0.15)
        response = connection.read_response()
        assert response.status == 201, response.body
        job = response.json()
        assert job["payload"] == {"n": n, "text": "x" * 40}
        stored = requests.get(server.url_of(f"/jobs/{job['id']}"), headers=bearer(token),
                              timeout=PATIENCE_SECONDS)
        assert stored.json()["payload"] == job["payload"]


def _stored_jobs(server: GunicornServer, token: str) -> list[dict[str, object]]:
    listed: list[dict[str, object]] = requests.get(
        server.url_of("/jobs"), params={"limit": 500}, headers=bearer(token),
        timeout=PATIENCE_SECONDS).json()["jobs"]
    return listed


def test_a_request_still_trickling_in_at_the_deadline_is_dropped(
        served: tuple[GunicornServer, str], connections: list[RawConnection]) -> None:
    server, token = served
    stored_before = _stored_jobs(server, token)
    raw = request_bytes("POST", "/jobs", token=token, body={"type": "email"})
    connection = RawConnection(server.port)
    connections.append(connection)
    # One byte every half second: each arrives well within any idle timeout, but the whole
    # request would take longer than the deadline allows.
    assert len(raw) * 0.5 > 2 * DEADLINE_SECONDS
    dropped = False
    for byte in raw:
        try:
            connection.send(bytes([byte]))
        except OSError:  # reset by the server
            dropped = True
            break
        if connection.closed_by_server(within=0.5):
            dropped = True
            break
    assert dropped
    assert _stored_jobs(server, token) == stored_before  # nothing of it was stored


def test_a_body_larger_than_the_cap_is_refused_with_a_problem_before_it_arrives(
        served: tuple[GunicornServer, str], connections: list[RawConnection]) -> None:
    server, token = served
    connection = RawConnection(server.port)
    connections.append(connection)
    connection.send(f"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}"
                    f"\r\nContent-Type: application/json\r\nContent-Length: {50 << 20}\r\n\r\n"
                    .encode() + b'{"type": "email", "payload": {"x": "' + b"x" * 1000)
    response = connection.read_response()
    assert response.status == 413
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["connection"] == "close"
    assert response.json()["status"] == 413
    assert connection.closed_by_server(within=PATIENCE_SECONDS)


def test_pipelined_requests_are_answered_in_order_however_they_arrive(
        served: tuple[GunicornServer, str], connections: list[RawConnection]) -> None:
    server, token = served
    first = request_bytes("POST", "/jobs", token=token, body={"type": "email"})
    second = request_bytes("GET", "/healthz")
    connection = RawConnection(server.port)
    connections.append(connection)
    # Two whole requests and half of a third in one packet, the rest of the third later.
    connection.send(first + second + first[:40])
    assert connection.read_response().status == 201
    assert connection.read_response().json() == {"status": "ok"}
    time.sleep(0.5)
    connection.send(first[40:])
    assert connection.read_response().status == 201


@pytest.mark.parametrize(("request_head", "status", "title"), [
    (b"GET /jobs?" + b"q" * 3000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 414,
     "Request line too long"),
    (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: " + b"h" * 5000 + b"\r\n\r\n", 431,
     "Request header fields too large"),
    (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
     + b"".join(b"X-Field-%d: 1\r\n" % n for n in range(60)) + b"\r\n", 431,
     "Request header fields too large"),
    (b"GET /healthz HTTP/9.9\r\nHost: 127.0.0.1\r\n\r\n", 400, "Bad request"),
], ids=["request line too long", "header too long", "too many headers", "bad version"])
def test_what_gunicorn_refuses_itself_is_answered_as_a_problem(
        served: tuple[GunicornServer, str], connections: list[RawConnection],
        request_head: bytes, status: int, title: str) -> None:
    server, _ = served
    connection = RawConnection(server.port)
    connections.append(connection)
    connection.send(request_head)
    response = connection.read_response()
    assert response.status == status
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert (problem["status"], problem["title"]) == (status, title)
    assert problem["type"].startswith("https://queuelog.dev/problems/")
    assert b"q" * 100 not in response.body and b"h" * 100 not in response.body
    assert connection.closed_by_server(within=PATIENCE_SECONDS)
