"""Idempotency keys: replay, mismatch, scope, and concurrent requests with one key."""

from __future__ import annotations

import threading

import pytest

from tests.conftest import Api


def test_replay_answers_200_with_the_same_job_and_marks_it(api, producer):
    first = api.enqueue(producer, headers={"Idempotency-Key": "order-17"}, payload={"n": 1})
    again = api.enqueue(producer, headers={"Idempotency-Key": "order-17"}, payload={"n": 1})

    assert first.status_code == 201 and "Idempotent-Replayed" not in first.headers
    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["Location"] == first.headers["Location"]
    assert again.json == first.json
    assert first.json["idempotency_key"] == "order-17"


def test_key_in_the_body_works_like_the_header(api, producer):
    first = api.enqueue(producer, idempotency_key="k-1")
    again = api.enqueue(producer, headers={"Idempotency-Key": "k-1"})
    assert again.status_code == 200 and again.json["id"] == first.json["id"]


def test_replay_recognises_payloads_with_keys_in_another_order(api, producer):
    first = api.enqueue(producer, idempotency_key="k", payload={"a": 1, "b": [1, {"x": 2, "y": 3}]})
    again = api.enqueue(producer, idempotency_key="k", payload={"b": [1, {"y": 3, "x": 2}], "a": 1})
    assert again.status_code == 200 and again.json["id"] == first.json["id"]


def test_replay_after_the_job_moved_on_returns_it_as_it_is_now(api, producer, worker):
    first = api.enqueue(producer, idempotency_key="k").json
    api.claim(worker)
    again = api.enqueue(producer, idempotency_key="k")
    assert again.status_code == 200
    assert again.json["id"] == first["id"] and again.json["status"] == "running"


@pytest.mark.parametrize("change", [
    {"type": "pdf"}, {"payload": {"n": 2}}, {"priority": "low"}, {"max_retries": 5},
    {"delay_seconds": 10}, {"run_at": "2027-01-15T00:00:00Z"},
])
def test_same_key_with_a_different_request_is_422(api, producer, admin, change):
    api.enqueue(producer, idempotency_key="k", payload={"n": 1})
    body = {"payload": {"n": 1}} | change
    response = api.enqueue(producer, idempotency_key="k", **body)
    assert response.status_code == 422
    assert "idempotency_key" in response.json["errors"]
    assert len(api.list(admin).json["jobs"]) == 1


def test_default_priority_and_the_explicit_default_are_the_same_request(api, producer):
    first = api.enqueue(producer, idempotency_key="k")
    again = api.enqueue(producer, idempotency_key="k", priority="medium", max_retries=3)
    assert again.status_code == 200 and again.json["id"] == first.json["id"]


def test_header_and_body_keys_that_differ_are_422(api, producer):
    response = api.enqueue(producer, headers={"Idempotency-Key": "a"}, idempotency_key="b")
    assert response.status_code == 422
    assert "idempotency_key" in response.json["errors"]


@pytest.mark.parametrize("key", ["", "x" * 256, "tab\there", "é"])
def test_idempotency_keys_must_be_1_to_255_printable_ascii(api, producer, key):
    assert api.enqueue(producer, idempotency_key=key).status_code == 422


@pytest.mark.parametrize("key", ["x" * 256, "tab\there", "\x7f", "caf\u00e9"])
def test_the_header_refuses_what_the_body_refuses(api, producer, key):
    for sent in ({"headers": {"Idempotency-Key": key}}, {"idempotency_key": key}):
        response = api.enqueue(producer, **sent)
        assert response.status_code == 422, sent
        assert set(response.json["errors"]) & {"Idempotency-Key", "idempotency_key"}


@pytest.mark.parametrize("key", ["x" * 255, "~", "order 1001", "a!b\"c"])
def test_the_header_takes_what_the_body_takes(api, producer, key):
    by_header = api.enqueue(producer, headers={"Idempotency-Key": key})
    by_body = api.enqueue(producer, idempotency_key=key)
    assert (by_header.status_code, by_body.status_code) == (201, 200)  # the body replays it
    assert by_body.json["id"] == by_header.json["id"]


def test_openapi_describes_the_header_and_the_body_key_alike(client):
    document = client.get("/openapi.json").json
    header = document["components"]["parameters"]["IdempotencyKey"]["schema"]
    body = document["components"]["schemas"]["Enqueue"]["properties"]["idempotency_key"]
    assert {k: header[k] for k in ("type", "minLength", "maxLength", "pattern")} == {
        k: body[k] for k in ("type", "minLength", "maxLength", "pattern")}


def test_twenty_concurrent_requests_with_one_key_make_exactly_one_job(app, producer, admin):
    barrier = threading.Barrier(20)
    answers: list[tuple[int, int | None]] = []
    lock = threading.Lock()

    def send() -> None:
        thread_api = Api(app.test_client())
        barrier.wait(timeout=30)
        response = thread_api.enqueue(producer, headers={"Idempotency-Key": "once"},
                                      payload={"v": 1})
        with lock:
            answers.append((response.status_code, (response.json or {}).get("id")))

    threads = [threading.Thread(target=send) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    statuses = sorted(status for status, _ in answers)
    assert statuses == [200] * 19 + [201]
    assert len({job_id for _, job_id in answers}) == 1
    assert len(Api(app.test_client()).list(admin).json["jobs"]) == 1
