"""queuelog under real gunicorn processes: graceful shutdown on SIGTERM, and metrics that add
up across several workers that come and go."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import create_engine, text

from tests.conftest import JOB_TYPES
from tests.ops.scrape import Scrape
from tests.servers import GunicornServer, bearer, gunicorn_argv, server_environment
from tests.servers import create_api_key as create_key

pytestmark = pytest.mark.slow


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """Read up to the end of a response's head; returns (head, bytes read beyond it)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _read_response(sock: socket.socket) -> tuple[int, Any]:
    head, body = _read_head(sock)
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed in the body")
        body += chunk
    return status, json.loads(body) if body else None


class InFlightEnqueue:
    """A POST /jobs whose headers a worker has read (it answered 100 Continue) and whose body
    is held back: a request that is provably in progress in a worker."""

    def __init__(self, port: int, token: str, n: int) -> None:
        self.n = n
        self.body = json.dumps({"type": "email", "payload": {"n": n}}).encode()
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.sendall(
            b"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\n"
            + f"Authorization: Bearer {token}\r\nContent-Length: {len(self.body)}\r\n".encode()
            + b"Expect: 100-continue\r\n\r\n")
        interim, rest = _read_head(self.sock)
        assert interim.startswith(b"HTTP/1.1 100"), interim
        assert rest == b""

    def finish(self) -> tuple[int, Any]:
        try:
            self.sock.sendall(self.body)
            return _read_response(self.sock)
        finally:
            self.sock.close()


@pytest.fixture
def server_env(db_url: str, tmp_path: Path) -> dict[str, str]:
    return server_environment(tmp_path, QUEUELOG_DATABASE_URL=db_url,
                              QUEUELOG_JOB_TYPES=",".join(sorted(JOB_TYPES)))


def test_sigterm_lets_in_flight_requests_finish(start_server: Callable[..., GunicornServer],
                                                server_env: dict[str, str], db_url: str) -> None:
    token = create_key(db_url, "producer-1", "producer")
    server = start_server(gunicorn_argv(), {**server_env, "GUNICORN_WORKERS": "2",
                                            "GUNICORN_THREADS": "8"})
    server.wait_until_answering()

    # Load from two clients, each request on a new connection, running through the signal.
    outcomes: list[tuple[bool, str | int]] = []
    signalled = threading.Event()
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            sent_after_signal = signalled.is_set()
            try:
                status: str | int = requests.post(
                    server.url_of("/jobs"), json={"type": "pdf"}, headers=bearer(token),
                    timeout=10).status_code
            except requests.RequestException as exc:
                status = type(exc).__name__
            outcomes.append((sent_after_signal, status))

    loaders = [threading.Thread(target=load, daemon=True) for _ in range(2)]
    for loader in loaders:
        loader.start()
    server.wait_for(lambda: any(status == 201 for _, status in outcomes), "load to get going")

    in_flight = [InFlightEnqueue(server.port, token, n) for n in range(6)]
    server.send_signal(signal.SIGTERM)
    server.wait_for(lambda: "Handling signal: term" in server.stderr(), "the master to act")
    signalled.set()
    # The master forwards TERM to the workers right after that line; give it a moment, so
    # the bodies below arrive at workers that are already shutting down.
    time.sleep(0.5)

    answers = [request.finish() for request in in_flight]
    assert [status for status, _ in answers] == [201] * 6, answers
    assert server.process.wait(timeout=60) == 0
    stop.set()
    for loader in loaders:
        loader.join(timeout=15)

    # Every answer any client got was a success: no request was cut off with a 5xx. (Requests
    # still in the kernel's queue when the listener closed are refused; they never started.)
    answered = [status for _, status in outcomes if isinstance(status, int)]
    assert answered and set(answered) == {201}, outcomes
    assert any(status == 201 for after, status in outcomes if not after)

    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            stored = {job_id: json.loads(payload) for job_id, payload in conn.execute(
                text("SELECT id, payload FROM jobs WHERE type = 'email'"))}
            total = conn.execute(text("SELECT count(*) FROM jobs")).scalar()
    finally:
        engine.dispose()
    assert {stored[job["id"]]["n"] for _, job in answers} == set(range(6))
    assert total == len(answered) + 6


def test_metrics_add_up_across_workers_that_come_and_go(
        start_server: Callable[..., GunicornServer], server_env: dict[str, str], db_url: str,
        tmp_path: Path) -> None:
    keys = {role: bearer(create_key(db_url, f"{role}-1", role))
            for role in ("producer", "worker", "admin")}
    # Three workers, each recycled after 8 requests: the run below outlives several of them,
    # so the figures must survive their exits (the master folds their files into archives).
    server = start_server(gunicorn_argv(), {
        **server_env, "GUNICORN_WORKERS": "3", "GUNICORN_THREADS": "4",
        "GUNICORN_MAX_REQUESTS": "8", "GUNICORN_MAX_REQUESTS_JITTER": "0"})
    server.wait_until_answering()

    def call(method: str, path: str, role: str, **body: Any) -> requests.Response:
        # A new connection per request, so requests spread over the workers.
        return requests.request(method, server.url_of(path), json=body, headers=keys[role],
                                timeout=30)

    for job_type, count in (("email", 10), ("pdf", 4)):
        for _ in range(count):
            assert call("POST", "/jobs", "producer", type=job_type).status_code == 201
    claimed = [call("POST", "/jobs/claim", "worker", types=["email"]).json()["id"]
               for _ in range(6)]
    for job_id in claimed[:4]:
        assert call("POST", f"/jobs/{job_id}/complete", "worker").status_code == 200
    for job_id in claimed[4:]:
        assert call("POST", f"/jobs/{job_id}/fail", "worker", error="x",
                    retry_in_seconds=3600).status_code == 200
    assert call("POST", "/jobs/claim", "worker", types=["sync"]).status_code == 204
    server.wait_for(lambda: "Autorestarting worker" in server.stderr(), "a worker to recycle")

    for _ in range(6):  # whichever worker answers, the figures are the same
        response = call("GET", "/metrics", "admin")
        assert response.status_code == 200
        figures = Scrape(response.text)
        assert figures.value("queuelog_jobs_enqueued_total") == 14
        assert figures.value("queuelog_jobs_claimed_total") == 6
        assert figures.value("queuelog_jobs_completed_total") == 4
        assert figures.value("queuelog_jobs_retried_total") == 2
        assert figures.value("queuelog_jobs_failed_total") == 0
        assert figures.value("queuelog_jobs_rescued_total") == 0
        assert figures.value("queuelog_jobs", status="pending", type="email") == 6
        assert figures.value("queuelog_jobs", status="completed", type="email") == 4
        assert figures.value("queuelog_jobs", status="pending", type="pdf") == 4
        assert figures.value("queuelog_jobs", status="running", type="email") == 0
        assert figures.value("queuelog_oldest_claimable_job_age_seconds") > 0
        assert figures.requests("POST", "/jobs", 201) == 14
        assert figures.requests("POST", "/jobs/claim", 200) == 6
        assert figures.requests("POST", "/jobs/claim", 204) == 1
        assert figures.requests("POST", "/jobs/<id:job_id>/complete", 200) == 4
        assert figures.requests("POST", "/jobs/<id:job_id>/fail", 200) == 2

    # Dead workers' files were folded: at most the live workers' own files beside the archive
    # (and one of a worker that has exited but is not reaped yet).
    (metrics_dir,) = (tmp_path / "server-tmp").glob("queuelog-metrics-*")
    server.wait_for(lambda: (metrics_dir / "counter_archive.db").exists(), "a fold")
    assert len(list(metrics_dir.glob("counter_*.db"))) <= 3 + 1 + 1

    assert server.stop() == 0
    assert not metrics_dir.exists()  # removed by the master on exit
    lines = [json.loads(line) for line in server.stdout().splitlines()]
    assert sum(1 for line in lines if line["route"] == "/jobs" and line["status"] == 201) == 14
