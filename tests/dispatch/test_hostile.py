"""Receivers that misbehave on purpose, real ones on loopback, against the dispatcher in
this process (both engines): each one ends its attempt cleanly, and the others' jobs are
delivered meanwhile."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from app.core.clock import Clock
from app.dispatch.dispatcher import Dispatcher
from app.dispatch.http import PushClient
from app.dispatch.metrics import DispatchMetrics
from queuelog_client import verify_signature
from tests.conftest import Api, Key
from tests.dispatch.receiver import Receiver, Reply, Trickler
from tests.dispatch.test_dispatcher import (
    Running,
    dispatching,
    events_of,
    job_of,
    make_push,
    wait_until,
)
from tests.servers import free_port

__all__ = ["dispatching"]  # the fixture, shared with the other dispatcher tests


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    # A failed attempt is retried at once: the budget is spent within the test.
    return {**app_config, "CLOCK": Clock(), "RETRY_BACKOFF_SECONDS": 0.0,
            "RETRY_BACKOFF_MAX_SECONDS": 0.0,
            "JOB_TYPES": app_config["JOB_TYPES"] | {"slow_body", "slow_head"}}


def attempts_of(client: Any, admin: Key, job_id: int) -> list[dict[str, Any]]:
    attempts: list[dict[str, Any]] = client.get(f"/jobs/{job_id}/attempts",
                                                headers=admin.headers).json["attempts"]
    return attempts


def test_a_trickled_answer_ends_as_a_timeout_at_the_deadline_and_others_are_delivered(
        client, api: Api, admin, producer, dispatching):
    """A 200 whose body, or whose headers too, come a byte a second is cut at the type's
    timeout (2 s), however long the receiver keeps sending: each attempt is a timeout the
    dispatcher reports within its lease (never refused as stale), the job is retried as its
    budget says, and a healthy type's jobs are delivered while every thread could be held."""
    with Trickler(headers_too=False) as body_trickler, \
            Trickler(headers_too=True) as header_trickler, \
            Receiver(answer=lambda r: Reply(200, b'{"sent": true}')) as healthy:
        make_push(client, admin, body_trickler.url, job_type="slow_body", timeout_seconds=2)
        make_push(client, admin, header_trickler.url, job_type="slow_head",
                  timeout_seconds=2)
        make_push(client, admin, healthy.url, job_type="email")
        trickled = [api.enqueue(producer, type=job_type, max_retries=1).json["id"]
                    for job_type in ("slow_body", "slow_head") for _ in range(2)]
        running = dispatching(concurrency=2)
        healthy_ids = [api.enqueue(producer, type="email").json["id"] for _ in range(3)]
        # 45 one-byte seconds per answer, were it waited out: far past this wait.
        wait_until(lambda: all(job_of(api, admin, j)["status"] == "failed" for j in trickled)
                   and all(job_of(api, admin, j)["status"] == "completed"
                           for j in healthy_ids), "the trickled jobs' budgets spent",
                   timeout=40)
        running.stop()
        cut = body_trickler.connections + header_trickler.connections
        assert body_trickler.finished == header_trickler.finished == 0
    assert cut == 8  # two attempts each for four jobs; none was sent again on a lapsed lease
    for job_id in trickled:
        job = job_of(api, admin, job_id)
        assert job["retry_count"] == 1
        attempts = attempts_of(client, admin, job_id)
        assert [a["outcome"] for a in attempts] == ["failed", "failed"]
        for attempt in attempts:
            assert attempt["error"].startswith("timed out after 2 s"), attempt["error"]
    assert len(healthy.received) == 3


def _deep(levels: int) -> bytes:
    return b'{"a":' * levels + b"1" + b"}" * levels


def _strict(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("body", [
    b'{"x": NaN}', b'{"x": Infinity}', b'{"x": 1e400}', _deep(100), _deep(970),
    b'{"x": "\\ud800"}', b'{"\\udfff": 1}', b'{"x": "\xed\xa0\x80"}', b'{"x": "\xff"}'],
    ids=["nan", "infinity", "overflow", "100-deep", "970-deep", "lone-surrogate",
         "lone-surrogate-key", "encoded-surrogate", "not-utf-8"])
def test_a_2xx_body_the_api_would_refuse_as_a_result_completes_the_job_without_it(
        client, api, admin, producer, dispatching, body):
    """The receiver succeeded, so the job is completed; what it answered is stored only if a
    worker's complete could have sent it as its result, and the producer's pages stay JSON."""
    with Receiver(answer=lambda r: Reply(200, body)) as receiver:
        make_push(client, admin, receiver.url)
        job_id = api.enqueue(producer, type="email").json["id"]
        running = dispatching()
        wait_until(lambda: job_of(api, admin, job_id)["status"] == "completed", "completion",
                   timeout=20)
        running.stop()
    assert job_of(api, admin, job_id)["result"] is None
    assert len(receiver.received) == 1
    page = client.get("/jobs", headers=producer.headers)
    assert page.status_code == 200
    [shown] = _strict(page.get_data(as_text=True))["jobs"]
    assert shown["id"] == job_id and shown["result"] is None


def test_a_result_as_deep_as_a_worker_may_send_is_stored(client, api, admin, producer,
                                                          dispatching):
    # 64 levels counted from the result itself, the worker's complete's limit.
    with Receiver(answer=lambda r: Reply(200, _deep(64))) as receiver:
        make_push(client, admin, receiver.url)
        job_id = api.enqueue(producer, type="email").json["id"]
        running = dispatching()
        wait_until(lambda: job_of(api, admin, job_id)["status"] == "completed", "completion",
                   timeout=20)
        running.stop()
    assert json.dumps(job_of(api, admin, job_id)["result"]).encode().replace(b" ", b"") \
        == _deep(64).replace(b" ", b"")


class FaultyClient(PushClient):
    """Delivers for real, then fails as a bug of ours would (the receiver got the job)."""

    def post(self, *args: Any, **kwargs: Any) -> Any:
        super().post(*args, **kwargs)
        raise RuntimeError("a fault after sending")


def test_an_unexpected_error_ends_the_attempt_at_once_as_a_failed_one(
        app, client, api, admin, producer, caplog):
    caplog.set_level(logging.ERROR)
    services = app.extensions["queuelog"]
    with Receiver(answer=lambda r: Reply(200, b"{}")) as receiver:
        make_push(client, admin, receiver.url)
        job_id = api.enqueue(producer, type="email", max_retries=0).json["id"]
        running = Running(Dispatcher(services.jobs, services.types, concurrency=1,
                                     grace_seconds=5, metrics=DispatchMetrics(),
                                     clock=services.clock, client=FaultyClient(1)))
        running.thread.start()
        try:
            # The lease is the timeout (5 s) plus 30 s: the job is not left held that long.
            wait_until(lambda: job_of(api, admin, job_id)["status"] == "failed", "the failure",
                       timeout=20)
        finally:
            running.stop()
    job = job_of(api, admin, job_id)
    assert job["error"].startswith("dispatcher error: RuntimeError")
    [attempt] = attempts_of(client, admin, job_id)
    assert attempt["outcome"] == "failed"
    assert len(receiver.received) == 1


SECRETS = ("s1gn4ture", "c0de-v4lue", "Tok3nInPath", "AKIAXYZ", "hunter2")


def _secret_url(base: str) -> str:
    """`base` (http://host:port/hook) with secrets in its credentials, path and query."""
    scheme, _, rest = base.partition("://")
    host, _, _path = rest.partition("/")
    return (f"{scheme}://bob:hunter2@{host}/hooks/Tok3nInPath/notify?sig=s1gn4ture"
            "&code=c0de-v4lue&X-Amz-Signature=AKIAXYZ&key=")


def test_a_push_urls_secrets_are_never_shown_stored_or_logged(
        client, api, admin, producer, dispatching, caplog):
    """The url as set is not shown again: admins see scheme, host and path shape only, a
    producer nothing of it; attempt errors and the dispatcher's log hold the same display
    form, even when the receiver (or urllib3) quotes the url back."""
    caplog.set_level(logging.DEBUG)
    refused = _secret_url(f"http://127.0.0.1:{free_port()}/hook")
    with Receiver(answer=lambda r: Reply(500, b"bad request to " + echoed[0].encode())) \
            as receiver:
        echoed = [_secret_url(receiver.url)]
        make_push(client, admin, echoed[0], job_type="email")
        make_push(client, admin, refused, job_type="pdf")
        ids = [api.enqueue(producer, type=job_type, max_retries=0).json["id"]
               for job_type in ("email", "pdf")]
        explained = [api.explain(producer, job_id) for job_id in ids]
        running = dispatching()
        wait_until(lambda: all(job_of(api, admin, j)["status"] == "failed" for j in ids),
                   "both failures", timeout=20)
        running.stop()
    listed = client.get("/types", headers=admin.headers).json["types"]
    shown = {entry["type"]: entry["push"]["url"] for entry in listed if entry["push"]}
    port = receiver.url.split(":")[2].split("/")[0]
    assert shown["email"] == (f"http://127.0.0.1:{port}/hooks/***/notify?sig=***&code=***"
                              "&X-Amz-Signature=***&key=***")
    # The producer's explain says it is a push type, and nothing of where it goes.
    for explanation in explained:
        [pushed] = [r for r in explanation["reasons"] if r["code"] == "push_type"]
        assert "127.0.0.1" not in json.dumps(explanation) and "hooks" not in pushed["message"]
    errors = [a["error"] for job_id in ids for a in attempts_of(client, admin, job_id)]
    assert errors[0].startswith("HTTP 500: bad request to http://127.0.0.1:")
    assert "/hooks/***/notify?sig=***" in errors[0]
    assert errors[1].startswith("connection failed") and "/hooks/***/notify" in errors[1]
    everything = json.dumps([listed, explained, errors, [job_of(api, admin, j) for j in ids],
                             [events_of(client, admin, j) for j in ids]]) + caplog.text
    for secret in SECRETS:
        assert secret not in everything, secret


def test_a_captured_delivery_does_not_verify_under_another_job_id(
        client, api, admin, producer, dispatching):
    """The signature covers the Queuelog-Job-Id and Queuelog-Attempt headers a receiver
    dedupes on: the same bytes under another job id are a forgery to the verifier."""
    with Receiver(answer=lambda r: Reply(200, b"{}")) as receiver:
        receiver.secret = make_push(client, admin, receiver.url)
        job_id = api.enqueue(producer, type="email").json["id"]
        running = dispatching()
        wait_until(lambda: job_of(api, admin, job_id)["status"] == "completed", "completion",
                   timeout=20)
        running.stop()
    [delivery] = receiver.received
    assert delivery.verified
    raw = json.dumps(delivery.body, separators=(",", ":"), ensure_ascii=False).encode()
    signature = delivery.headers["Queuelog-Signature"]
    assert verify_signature(receiver.secret, signature, raw, job_id=str(job_id), attempt="1")
    assert not verify_signature(receiver.secret, signature, raw, job_id=str(job_id + 1),
                                attempt="1")
    assert not verify_signature(receiver.secret, signature, raw, job_id=str(job_id),
                                attempt="2")


def test_a_type_set_before_the_allow_list_changed_is_refused_delivery(
        app, client, api, admin, producer, dispatching):
    """The list is held again at delivery: a url set while any origin was allowed (or
    before the list was narrowed) is never sent to; a listed one still is."""
    with Receiver(answer=lambda r: Reply(200, b"{}")) as outside, \
            Receiver(answer=lambda r: Reply(200, b"{}")) as listed:
        make_push(client, admin, outside.url + "?sig=s1gn4ture", job_type="email")
        make_push(client, admin, listed.url, job_type="pdf")
        # The operator narrows the list (and restarts the dispatcher): this process's
        # setting, as QUEUELOG_PUSH_ALLOWED_ORIGINS would give it.
        app.extensions["queuelog"].types.push_origins = frozenset(
            {listed.url.rsplit("/", 1)[0]})
        refused = api.enqueue(producer, type="email", max_retries=0).json["id"]
        delivered = api.enqueue(producer, type="pdf").json["id"]
        running = dispatching()
        wait_until(lambda: job_of(api, admin, refused)["status"] == "failed"
                   and job_of(api, admin, delivered)["status"] == "completed", "both ends",
                   timeout=20)
        running.stop()
    assert outside.received == [] and len(listed.received) == 1
    error = job_of(api, admin, refused)["error"]
    assert error.startswith("not sent: the push url (http://127.0.0.1:")
    assert "QUEUELOG_PUSH_ALLOWED_ORIGINS" in error and "s1gn4ture" not in error
