"""The dispatcher in this process, with the app's own services, delivering to a real
receiver on loopback (both engines): what each answer does to the job."""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from app import start_maintenance
from app.core.clock import Clock
from app.dispatch.dispatcher import DISPATCHER_NAME, Dispatcher
from app.dispatch.metrics import DispatchMetrics
from tests.conftest import Api, Key
from tests.dispatch.receiver import Received, Receiver, Reply
from tests.servers import free_port


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    # Signatures carry the wall clock's time, which the receiver checks against its own.
    return {**app_config, "CLOCK": Clock(), "RETRY_BACKOFF_SECONDS": 60.0}


class Running:
    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.thread = threading.Thread(target=dispatcher.run, daemon=True)

    def stop(self, timeout: float = 30) -> None:
        self.dispatcher.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the dispatcher did not stop"


@pytest.fixture
def dispatching(app: Any) -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def start(concurrency: int = 4, grace_seconds: float = 10) -> Running:
        services = app.extensions["queuelog"]
        running = Running(Dispatcher(services.jobs, services.types, concurrency=concurrency,
                                     grace_seconds=grace_seconds, metrics=DispatchMetrics(),
                                     clock=services.clock))
        running.thread.start()
        started.append(running)
        return running

    yield start
    for running in started:
        if running.thread.is_alive():
            running.stop()


def make_push(client: Any, admin: Key, url: str, job_type: str = "email",
              timeout_seconds: int = 5, **settings: Any) -> str:
    response = client.patch(f"/types/{job_type}", headers=admin.headers, json={
        "push": {"url": url, "timeout_seconds": timeout_seconds}, **settings})
    assert response.status_code == 200, response.json
    secret: str = response.json["push"]["secret"]
    return secret


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def job_of(api: Api, admin: Key, job_id: int) -> dict[str, Any]:
    response: dict[str, Any] = api.get(admin, job_id).json
    return response


def events_of(client: Any, admin: Key, job_id: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = client.get(f"/jobs/{job_id}/events",
                                              headers=admin.headers).json["events"]
    return events


def test_a_2xx_completes_the_job_with_its_json_object_as_result(
        client, api, admin, producer, dispatching):
    receiver = Receiver(answer=lambda r: Reply(200, b'{"sent": true, "id": 7}'))
    with receiver:
        receiver.secret = make_push(client, admin, receiver.url)
        job_id = api.enqueue(producer, type="email", payload={"to": "a@b.c"}).json["id"]
        running = dispatching()
        wait_until(lambda: job_of(api, admin, job_id)["status"] == "completed", "completion")
        running.stop()

    job = job_of(api, admin, job_id)
    assert job["result"] == {"sent": True, "id": 7}
    [delivery] = receiver.received
    assert delivery.verified
    assert delivery.headers["Content-Type"] == "application/json"
    assert delivery.headers["Queuelog-Job-Id"] == str(job_id)
    assert delivery.headers["Queuelog-Attempt"] == "1"
    body = delivery.body
    assert body["id"] == job_id and body["payload"] == {"to": "a@b.c"}
    assert body["attempt"] == 1 and body["status"] == "running"
    assert body["worker_id"] == DISPATCHER_NAME
    assert "error" not in body and "lease_token" not in body
    events = [(e["event"], e["detail"]) for e in events_of(client, admin, job_id)]
    assert ("delivered", {"status_code": 200}) in events
    assert [name for name, _ in events][-2:] == ["delivered", "completed"]


@pytest.mark.parametrize("body", [b"[1, 2]", b"not json", b"", b'"text"'])
def test_a_2xx_without_a_json_object_completes_without_result(
        client, api, admin, producer, dispatching, body):
    with Receiver(answer=lambda r: Reply(204 if not body else 200, body)) as receiver:
        make_push(client, admin, receiver.url)
        job_id = api.enqueue(producer, type="email").json["id"]
        running = dispatching()
        wait_until(lambda: job_of(api, admin, job_id)["status"] == "completed", "completion")
        running.stop()
    assert job_of(api, admin, job_id)["result"] is None


def test_a_503_with_retry_after_is_retried_after_that_delay(
        client, api, admin, producer, dispatching):
    def answer(received: Received) -> Reply:
        if received.attempt == 1:
            return Reply(503, b"busy", {"Retry-After": "1"})
        return Reply(200)

    with Receiver(answer=answer) as receiver:
        receiver.secret = make_push(client, admin, receiver.url)
        job_id = api.enqueue(producer, type="email").json["id"]
        running = dispatching()
        wait_until(lambda: job_of(api, admin, job_id)["status"] == "completed", "completion")
        running.stop()

    first, second = receiver.of_job(job_id)
    assert (first.attempt, second.attempt) == (1, 2)
    assert second.verified and second.body["attempt"] == 2
    events = events_of(client, admin, job_id)
    scheduled = next(e for e in events if e["event"] == "retry_scheduled")
    assert scheduled["detail"]["error"] == "HTTP 503: busy"
    # The retry was scheduled Retry-After (1 s) after the failed attempt, not the backoff
    # (60 s here, which the test would not outlive).
    attempts = client.get(f"/jobs/{job_id}/attempts", headers=admin.headers).json["attempts"]
    assert [a["outcome"] for a in attempts] == ["failed", "completed"]
    assert attempts[0]["error"] == "HTTP 503: busy"


def test_other_statuses_are_failed_attempts_with_the_backoff_and_the_body_in_the_error(
        client, api, admin, producer, dispatching):
    long_body = ("x" * 150 + "password=hunter2 " + "y" * 300).encode()
    with Receiver(answer=lambda r: Reply(500, long_body)) as receiver:
        make_push(client, admin, receiver.url)
        job_id = api.enqueue(producer, type="email", max_retries=0).json["id"]
        running = dispatching()
        wait_until(lambda: job_of(api, admin, job_id)["status"] == "failed", "failure")
        running.stop()
    error = job_of(api, admin, job_id)["error"]
    assert error.startswith("HTTP 500: " + "x" * 150 + "password=***")
    assert "hunter2" not in error
    assert len(receiver.received) == 1


def test_a_503_without_retry_after_takes_the_backoff(client, api, admin, producer,
                                                      dispatching):
    with Receiver(answer=lambda r: Reply(503, b"down")) as receiver:
        make_push(client, admin, receiver.url)
        job_id = api.enqueue(producer, type="email").json["id"]
        running = dispatching()
        wait_until(lambda: job_of(api, admin, job_id)["retry_count"] == 1, "the retry")
        running.stop()
    job = job_of(api, admin, job_id)
    assert job["status"] == "pending" and len(receiver.received) == 1


def test_redirects_are_not_followed(client, api, admin, producer, dispatching):
    with Receiver(answer=lambda r: Reply(200)) as target, \
            Receiver(answer=lambda r: Reply(307, b"", {"Location": target.url})) as receiver:
        make_push(client, admin, receiver.url)
        job_id = api.enqueue(producer, type="email", max_retries=0).json["id"]
        running = dispatching()
        wait_until(lambda: job_of(api, admin, job_id)["status"] == "failed", "failure")
        running.stop()
    assert job_of(api, admin, job_id)["error"].startswith("HTTP 307")
    assert target.received == [] and len(receiver.received) == 1


def test_url_credentials_are_sent_as_basic_auth_and_never_shown_or_logged(
        client, api, admin, producer, dispatching, caplog):
    caplog.set_level(logging.DEBUG)
    with Receiver(answer=lambda r: Reply(500, b"no")) as receiver:
        url = receiver.url.replace("http://", "http://bob:pa%40ss-w0rd@")
        make_push(client, admin, url)
        job_id = api.enqueue(producer, type="email", max_retries=0).json["id"]
        running = dispatching()
        wait_until(lambda: job_of(api, admin, job_id)["status"] == "failed", "failure")
        running.stop()
    [delivery] = receiver.received
    assert delivery.headers["Authorization"] == "Basic " + base64.b64encode(
        b"bob:pa@ss-w0rd").decode()
    shown = json.dumps([job_of(api, admin, job_id), events_of(client, admin, job_id),
                        client.get("/types", headers=admin.headers).json])
    assert "w0rd" not in shown and "w0rd" not in caplog.text


def test_timeouts_and_refused_connections_are_failed_attempts_with_a_clear_error(
        client, api, admin, producer, dispatching, caplog):
    with Receiver(answer=lambda r: Reply(200, delay=3)) as slow:
        make_push(client, admin, slow.url, job_type="email", timeout_seconds=1)
        make_push(client, admin, f"http://user:hunter2@127.0.0.1:{free_port()}/hook",
                  job_type="pdf")
        timed_out = api.enqueue(producer, type="email", max_retries=0).json["id"]
        refused = api.enqueue(producer, type="pdf", max_retries=0).json["id"]
        running = dispatching()
        wait_until(lambda: all(job_of(api, admin, j)["status"] == "failed"
                               for j in (timed_out, refused)), "both failures")
        running.stop()
    assert "timed out after 1 s" in job_of(api, admin, timed_out)["error"]
    error = job_of(api, admin, refused)["error"]
    assert error.startswith("connection failed") and "hunter2" not in error
    assert "hunter2" not in caplog.text


def test_stopping_finishes_the_deliveries_in_flight(client, api, admin, producer,
                                                    dispatching):
    with Receiver(answer=lambda r: Reply(200, delay=0.5)) as receiver:
        make_push(client, admin, receiver.url)
        ids = [api.enqueue(producer, type="email").json["id"] for _ in range(4)]
        running = dispatching(concurrency=4)
        wait_until(lambda: len(receiver.received) == 4, "four deliveries in flight")
        running.stop()
    assert {job_of(api, admin, j)["status"] for j in ids} == {"completed"}


def test_stopping_releases_deliveries_that_outlast_the_grace(client, api, admin, producer,
                                                             dispatching):
    with Receiver(answer=lambda r: Reply(200, delay=3)) as receiver:
        make_push(client, admin, receiver.url)
        job_id = api.enqueue(producer, type="email").json["id"]
        running = dispatching(grace_seconds=0.2)
        wait_until(lambda: len(receiver.received) == 1, "the delivery in flight")
        running.stop()
        job = job_of(api, admin, job_id)
    assert job["status"] == "pending" and job["retry_count"] == 1
    assert job["error"].startswith("released")


def test_max_running_of_a_push_type_holds(client, api, admin, producer, dispatching):
    with Receiver(answer=lambda r: Reply(200, delay=0.1)) as receiver:
        make_push(client, admin, receiver.url, max_running=2)
        ids = [api.enqueue(producer, type="email").json["id"] for _ in range(12)]
        running = dispatching(concurrency=8)
        wait_until(lambda: all(job_of(api, admin, j)["status"] == "completed" for j in ids),
                   "every completion")
        running.stop()
    assert receiver.max_running <= 2 and len(receiver.received) == 12


def test_the_dispatcher_never_delivers_an_expired_job_and_cancels_it(
        app, client, api, admin, producer, dispatching):
    """Contract §17 on the push path: a job past its expires_at is not sent; maintenance
    cancels it (detail reason expired) and the dispatcher delivers the others."""
    with Receiver() as receiver:
        receiver.secret = make_push(client, admin, receiver.url, paused=True)
        expired = api.enqueue(producer, type="email", expires_in_seconds=1).json["id"]
        kept = api.enqueue(producer, type="email").json["id"]
        time.sleep(1.1)  # the wall clock: the dispatcher's
        client.patch("/types/email", headers=admin.headers, json={"paused": False})
        running = dispatching()
        wait_until(lambda: job_of(api, admin, kept)["status"] == "completed", "delivery")
        running.stop()

    assert [delivery.job_id for delivery in receiver.received] == [kept]
    start_maintenance(app)  # as a served process does
    wait_until(lambda: job_of(api, admin, expired)["status"] == "cancelled", "the expiry")
    assert events_of(client, admin, expired)[-1]["detail"]["reason"] == "expired"


def test_a_push_jobs_delivery_is_cut_at_its_attempts_deadline(
        client, api, admin, producer, dispatching):
    """timeout_seconds caps the dispatcher's lease, and so the delivery's time limit: a
    receiver slower than the job's deadline is not waited for past it."""
    def slow(_received: Received) -> Reply:
        time.sleep(12)
        return Reply(200, b"{}")

    with Receiver(answer=slow) as receiver:
        receiver.secret = make_push(client, admin, receiver.url, timeout_seconds=60)
        job_id = api.enqueue(producer, type="email", timeout_seconds=8,
                             max_retries=0).json["id"]
        started = time.monotonic()
        running = dispatching()
        wait_until(lambda: job_of(api, admin, job_id)["status"] == "failed", "the cut",
                   timeout=30)
        waited = time.monotonic() - started
        running.stop()

    assert waited < 12  # not the receiver's 12 s, nor the type's 60 s
    assert "timed out" in job_of(api, admin, job_id)["error"]


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_delivery_carries_the_producers_trace_context_unchanged_through_retries(
        client, api, admin, producer, dispatching):
    def answer(received: Received) -> Reply:
        if received.attempt == 1 and "traceparent" in received.headers:
            return Reply(503, b"busy", {"Retry-After": "1"})
        return Reply(200)

    with Receiver(answer=answer) as receiver:
        make_push(client, admin, receiver.url)
        traced = api.enqueue(producer, headers={"traceparent": TRACEPARENT,
                                                "tracestate": "vendor=abc,other=1"}).json["id"]
        plain = api.enqueue(producer).json["id"]
        running = dispatching()
        wait_until(lambda: all(job_of(api, admin, job_id)["status"] == "completed"
                               for job_id in (traced, plain)), "both completions")
        running.stop()

    first, second = receiver.of_job(traced)
    assert (first.attempt, second.attempt) == (1, 2)
    for delivery in (first, second):
        assert delivery.headers["traceparent"] == TRACEPARENT
        assert delivery.headers["tracestate"] == "vendor=abc,other=1"
    [plain_delivery] = receiver.of_job(plain)
    lowered = {name.lower() for name in plain_delivery.headers}
    assert "traceparent" not in lowered and "tracestate" not in lowered
