"""What the client sends to suspend a job, post an event and complete a waitpoint
(docs/CLIENT.md, "Durable steps and waits"): a scripted loopback server plays the answers
(tests/client/test_retries.py's), so each request is seen exactly as it went out."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from queuelog_client import Client, Conflict, Unauthorized
from tests.client.test_retries import ScriptedServer

SUSPENDED = {"id": 7, "status": "suspended",
             "waiting_for": {"kind": "event", "until": "2026-12-07T07:47:06Z",
                             "event": "order.shipped", "key": "1001"}}


@pytest.fixture
def scripted() -> Iterator[ScriptedServer]:
    server = ScriptedServer()
    yield server
    server.close()


def _client(url: str) -> Client:
    return Client(url, "s3cret", backoff_seconds=0.01, max_backoff_seconds=0.02)


def test_a_suspend_sends_the_lease_token_one_wait_and_the_checkpoint(scripted):
    scripted.script = [(200, {}, SUSPENDED), (200, {}, SUSPENDED)]
    client = _client(scripted.url)
    job = client.suspend(7, "lease-1", event="order.shipped", key="1001",
                         timeout_seconds=86_400, checkpoint={"row": 3})
    assert job == SUSPENDED
    client.suspend(7, "lease-1", until=datetime(2027, 1, 1, 9, 0, tzinfo=UTC))
    first, second = scripted.requests
    assert (first["method"], first["path"]) == ("POST", "/jobs/7/suspend")
    assert first["body"] == {"lease_token": "lease-1", "checkpoint": {"row": 3},
                             "wait_for": {"event": "order.shipped", "key": "1001",
                                          "timeout_seconds": 86_400}}
    assert second["body"] == {"lease_token": "lease-1", "until": "2027-01-01T09:00:00+00:00"}


def test_a_suspend_with_two_waits_or_none_is_refused_before_anything_is_sent(scripted):
    client = _client(scripted.url)
    with pytest.raises(ValueError, match="exactly one of"):
        client.suspend(7, "lease-1", seconds=60, token=True)
    with pytest.raises(ValueError, match="exactly one of"):
        client.suspend(7, "lease-1")
    assert scripted.requests == []


def test_an_event_carries_one_idempotency_key_through_the_clients_retries(scripted):
    scripted.script = [(503, {}, None), (200, {}, {"woken": 2})]
    answer = _client(scripted.url).post_event("order.shipped", {"tracking": "1Z999"},
                                              key="1001")
    assert answer == {"woken": 2}
    first, retry = scripted.requests
    assert first["path"] == "/events"
    assert first["body"] == {"name": "order.shipped", "key": "1001",
                             "data": {"tracking": "1Z999"}}
    key = first["headers"]["Idempotency-Key"]
    assert key and retry["headers"]["Idempotency-Key"] == key


def test_an_events_own_idempotency_key_and_producer_are_sent_as_given(scripted):
    scripted.script = [(200, {}, {"woken": 0})]
    _client(scripted.url).post_event("order.paid", producer="shop",
                                     idempotency_key="payment-77")
    [sent] = scripted.requests
    assert sent["headers"]["Idempotency-Key"] == "payment-77"
    assert sent["body"] == {"name": "order.paid", "key": "", "producer": "shop"}


def test_a_waitpoint_is_completed_with_its_token_quoted_in_the_path_and_no_key(scripted):
    done = {"job_id": 7, "completed_at": "2026-12-06T07:47:06Z"}
    scripted.script = [(200, {}, done), (200, {}, done)]
    assert _client(scripted.url).complete_waitpoint("a/b c?", {"approved": True}) == done
    Client(scripted.url, anonymous=True).complete_waitpoint("tok-1")
    with_key, anonymous = scripted.requests
    assert with_key["path"] == "/waitpoints/a%2Fb%20c%3F"
    assert with_key["body"] == {"data": {"approved": True}}
    assert anonymous["body"] == {}
    # The token is the authority: not even a client that has a key sends it.
    assert "Authorization" not in with_key["headers"]
    assert "Authorization" not in anonymous["headers"]


def test_a_second_completion_is_a_conflict(scripted):
    scripted.script = [(409, {}, {"title": "Conflict", "status": 409,
                                  "detail": "The waitpoint was completed already."})]
    with pytest.raises(Conflict, match="completed already"):
        Client(scripted.url, anonymous=True).complete_waitpoint("tok-1", {"approved": False})


def test_an_anonymous_client_takes_no_token_and_sends_none(monkeypatch, scripted):
    monkeypatch.setenv("QUEUELOG_TOKEN", "from-env")
    with pytest.raises(ValueError, match="an anonymous client takes no token"):
        Client(scripted.url, "s3cret", anonymous=True)
    scripted.script = [(401, {}, {"title": "Unauthorized", "status": 401,
                                  "detail": "A key is needed."})]
    with pytest.raises(Unauthorized):
        Client(scripted.url, anonymous=True).get_job(1)
    assert "Authorization" not in scripted.requests[0]["headers"]
