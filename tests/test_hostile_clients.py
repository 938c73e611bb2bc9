"""Hostile clients and hostile input: each attack made the way a hostile client would make
it (on both engines where the engine matters, against real gunicorn where the server is the
point), and the property that any JSON the API accepts comes back unchanged. Slow
connections and claims naming unconfigured types are proved in tests/ops/test_slow_clients.py
and tests/test_api_security.py.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import create_app
from app.core.callers import Role
from app.core.limits import JOB_ID, PAGE_BYTES
from app.storage.migrations import upgrade
from app.web.http import MAX_JSON_DEPTH
from tests.conftest import JOB_TYPES, Key
from tests.servers import LiveServer, create_api_key


def _problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.get_data(as_text=True)[:500]
    assert response.mimetype == "application/problem+json"
    return response.get_json()


def _nested(levels: int, leaf: Any = None) -> Any:
    """An object `levels` deep: {"a": {"a": … {"leaf": leaf} …}} (levels >= 1)."""
    value: Any = {} if leaf is None else {"leaf": leaf}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def _depth(value: Any) -> int:
    """How many containers deep `value` is: {} is 1, {"a": []} is 2, a scalar 0."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1)
                         for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def _raw_json(levels: int) -> str:
    """A payload `levels` deep as text, built without recursion (json.dumps would need it)."""
    return '{"a":' * (levels - 1) + "{}" + "}" * (levels - 1)


# -- a deep payload or result jammed claim-many --------------------------------------

def test_deep_payload_is_refused_and_claim_many_keeps_working(
        client: FlaskClient, api: Any, producer: Key, worker: Key, admin: Key) -> None:
    too_deep = [f"Nested deeper than {MAX_JSON_DEPTH} levels."]
    for levels in (MAX_JSON_DEPTH + 1, 976):
        refused = client.post("/jobs", headers=producer.headers, content_type="application/json",
                              data=f'{{"type": "email", "payload": {_raw_json(levels)}}}')
        # The field is named, unless the body is too deep for the parser itself to follow.
        assert _problem(refused, 422)["errors"] in ({"payload": too_deep}, {"_body": too_deep})
    deepest = _nested(MAX_JSON_DEPTH, leaf="bottom")
    job_id = api.enqueue(producer, payload=deepest).get_json()["id"]
    other_id = api.enqueue(producer, payload={"n": 2}).get_json()["id"]

    claimed = client.post("/jobs/claim-many", json={"max_jobs": 10}, headers=worker.headers)

    assert claimed.status_code == 200
    jobs = {job["id"]: job for job in claimed.get_json()["jobs"]}
    assert jobs[job_id]["payload"] == deepest
    assert jobs[other_id]["payload"] == {"n": 2}

    too_deep = client.post(f"/jobs/{job_id}/complete", headers=worker.headers,
                           content_type="application/json",
                           data=f'{{"result": {_raw_json(MAX_JSON_DEPTH + 1)}}}')
    assert _problem(too_deep, 422)["errors"] == {
        "result": [f"Nested deeper than {MAX_JSON_DEPTH} levels."]}
    many_too_deep = client.post(
        "/jobs/complete-many", headers=worker.headers, content_type="application/json",
        data=(f'{{"items": [{{"id": {other_id}, "result": {{}}}}, '
              f'{{"id": {job_id}, "result": {_raw_json(MAX_JSON_DEPTH + 1)}}}]}}'))
    assert _problem(many_too_deep, 422)["errors"] == {
        "items.1.result": [f"Nested deeper than {MAX_JSON_DEPTH} levels."]}
    assert api.get(admin, job_id).get_json()["status"] == "running"
    assert api.get(admin, other_id).get_json()["status"] == "running"

    done = client.post("/jobs/complete-many", headers=worker.headers,
                       json={"items": [{"id": job_id, "result": deepest},
                                       {"id": other_id, "result": {"ok": True}}]})
    assert [item["status"] for item in done.get_json()["results"]] == [200, 200]
    assert api.get(admin, job_id).get_json()["result"] == deepest
    assert api.list(admin).status_code == 200
    assert client.post("/jobs/claim-many", json={}, headers=worker.headers).status_code == 200


def test_in_a_batch_a_payload_counts_its_own_depth_not_the_envelopes(
        client: FlaskClient, api: Any, producer: Key, admin: Key) -> None:
    deepest = _nested(MAX_JSON_DEPTH)
    batch = '{"jobs": [{"type": "email"}, {"type": "email", "payload": %s}]}'

    refused = client.post("/jobs/batch", headers=producer.headers,
                          content_type="application/json",
                          data=batch % _raw_json(MAX_JSON_DEPTH + 1))
    accepted = client.post("/jobs/batch", headers=producer.headers,
                           json={"jobs": [{"type": "email"},
                                          {"type": "email", "payload": deepest}]})

    assert _problem(refused, 422)["errors"] == {
        "jobs.1.payload": [f"Nested deeper than {MAX_JSON_DEPTH} levels."]}
    assert accepted.status_code == 201
    assert [job["payload"] for job in api.list(admin).get_json()["jobs"]] == [{}, deepest]


# -- the lone-surrogate scan recursed ------------------------------------------------

def test_a_small_deep_body_with_a_unicode_escape_is_a_422_not_a_500(
        client: FlaskClient, producer: Key, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    bodies = {
        # under 1 KB, a few hundred levels, one \u escape: the reported attack
        '{"type": "email", "payload": {"x": ' + "[" * 400 + '"\\u00e9"' + "]" * 400 + "}}":
            {"payload": [f"Nested deeper than {MAX_JSON_DEPTH} levels."]},
        # as deep as the parser itself goes
        '{"type": "email", "payload": ' + "[" * 100_000 + "]" * 100_000 + "}":
            {"_body": [f"Nested deeper than {MAX_JSON_DEPTH} levels."]},
        # an unpaired surrogate, within the depth limit but nested
        '{"type": "email", "payload": {"x": ' + "[" * 60 + '"\\ud800"' + "]" * 60 + "}}":
            {"_body": ["Invalid Unicode."]},
        '{"type": "email", "payload": {"\\udc00": 1}}': {"_body": ["Invalid Unicode."]},
    }
    for body, errors in bodies.items():
        response = client.post("/jobs", headers=producer.headers, data=body,
                               content_type="application/json")

        assert _problem(response, 422)["errors"] == errors
    # The same surrogate encoded straight into the bytes instead of escaped: not UTF-8.
    smuggled = client.post("/jobs", headers=producer.headers, content_type="application/json",
                           data=b'{"type": "email", "payload": {"x": "\xed\xa0\x80"}}')
    assert _problem(smuggled, 422)["errors"] == {"_body": ["Invalid JSON."]}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


# -- a revoked worker key's waiting claim ---------------------------------------------

def test_a_revoked_workers_waiting_claim_takes_nothing(
        app: Flask, api: Any, producer: Key, worker: Key, admin: Key) -> None:
    # The worker's key is in the process's cache (it has made a request), as in production.
    assert api.claim(worker).status_code == 204
    answers: list[Any] = []
    waiting = threading.Thread(target=lambda: answers.append(
        app.test_client().post("/jobs/claim", json={"wait_seconds": 10},
                               headers=worker.headers)))
    waiting.start()
    time.sleep(0.5)  # let it reach its wait (it finds nothing at first)
    assert waiting.is_alive()

    app.extensions["queuelog"].keys.revoke_key(worker.name)
    job_id = api.enqueue(producer).get_json()["id"]
    waiting.join(timeout=30)

    assert not waiting.is_alive()
    assert answers[0].status_code in (401, 204)
    assert api.get(admin, job_id).get_json()["status"] == "pending"
    assert api.get(admin, job_id).get_json()["worker_id"] is None


# -- world-readable files -------------------------------------------------------------

@pytest.fixture
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


@pytest.mark.parametrize("umask", [0o022, 0o000], indirect=True, ids=["umask 022", "umask 000"])
def test_database_wal_lock_and_backup_files_are_owner_only(
        umask: int, tmp_path: Path) -> None:
    database = tmp_path / "queuelog.sqlite3"
    url = f"sqlite:///{database}"
    upgrade(url)
    app = create_app({"TESTING": True, "DATABASE_URL": url, "JOB_TYPES": JOB_TYPES})
    try:
        token = app.extensions["queuelog"].keys.create_key("producer-1", Role.PRODUCER)
        response = app.test_client().post("/jobs", json={"type": "email", "payload": {"s": 1}},
                                          headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 201
        backup = tmp_path / "backup.sqlite3"
        result = app.test_cli_runner().invoke(args=["backup", str(backup)])
        assert result.exit_code == 0, result.output

        files = [database, Path(f"{database}-wal"), Path(f"{database}-shm"),
                 Path(f"{database}-writelock"), backup]
        modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in files}
    finally:
        app.extensions["queuelog"].db.engine.dispose()

    assert modes == {path.name: 0o600 for path in files}


# -- listings of escaped non-ASCII text -----------------------------------------------

def test_a_listing_of_large_non_ascii_payloads_stays_within_4_mib_and_pages_on(
        client: FlaskClient, api: Any, producer: Key, admin: Key) -> None:
    # 64 KiB payloads of a character outside the BMP: 4 bytes in UTF-8, 12 as \ud83d\ude00.
    text = "\U0001f600" * (65_536 // 4 - 4)
    sent = 80
    ids = [api.enqueue(producer, payload={"t": text}).get_json()["id"] for _ in range(sent)]

    seen: list[int] = []
    cursor = None
    pages = 0
    while True:
        query = {"limit": 500} | ({"cursor": cursor} if cursor else {})
        response = client.get("/jobs", query_string=query, headers=admin.headers)
        assert response.status_code == 200
        assert len(response.data) <= PAGE_BYTES.max
        assert "\U0001f600".encode() in response.data and b"\\ud83d" not in response.data
        body = response.get_json()
        assert all(job["payload"] == {"t": text} for job in body["jobs"])
        seen += [job["id"] for job in body["jobs"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break

    assert seen == ids
    assert pages >= 2  # 80 jobs of 64 KiB are more than one 4 MiB page


# -- PostgreSQL batches deadlocking ---------------------------------------------------

def _every_job(base_url: str, admin_token: str) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = []
    query: dict[str, Any] = {"limit": 500}
    while True:
        page = requests.get(f"{base_url}/jobs", params=query, timeout=30,
                            headers={"Authorization": f"Bearer {admin_token}"}).json()
        jobs += page["jobs"]
        if page["next_cursor"] is None:
            return jobs
        query["cursor"] = page["next_cursor"]


@pytest.mark.slow
def test_overlapping_batches_in_opposite_orders_never_deadlock(
        db_url: str, tmp_path: Path) -> None:
    producer_token = create_api_key(db_url, "producer-1", "producer")
    admin_token = create_api_key(db_url, "admin-1", "admin")
    server = LiveServer(db_url, log_path=tmp_path / "gunicorn.log", workers=4,
                        threads=2).start()
    threads, rounds, keys_per_batch = 4, 6, 300
    barrier = threading.Barrier(threads)
    statuses: list[int] = []

    def fire(thread: int) -> None:
        session = requests.Session()
        for round_ in range(rounds):
            keys = [f"r{round_}-k{n}" for n in range(keys_per_batch)]
            if thread % 2:
                keys.reverse()
            body = {"jobs": [{"type": "email", "payload": {"k": key}, "idempotency_key": key}
                             for key in keys]}
            barrier.wait(timeout=60)
            statuses.append(session.post(
                f"{server.url}/jobs/batch", json=body, timeout=60,
                headers={"Authorization": f"Bearer {producer_token}"}).status_code)

    try:
        firing = [threading.Thread(target=fire, args=(n,)) for n in range(threads)]
        for thread in firing:
            thread.start()
        for thread in firing:
            thread.join(timeout=300)
        stored = _every_job(server.url, admin_token)
    finally:
        server.stop()

    assert len(statuses) == threads * rounds
    assert all(200 <= status < 500 for status in statuses), statuses
    assert 201 in statuses
    assert sorted(job["idempotency_key"] for job in stored) == sorted(
        f"r{r}-k{n}" for r in range(rounds) for n in range(keys_per_batch))


def test_a_batch_keeps_its_request_order_whatever_its_keys(
        client: FlaskClient, api: Any, producer: Key, worker: Key) -> None:
    keys = ["zulu", "mike", "alpha"]
    body = {"jobs": [{"type": "email", "payload": {"k": key}, "idempotency_key": key}
                     for key in keys]}

    ids = [job["id"] for job in client.post("/jobs/batch", json=body,
                                            headers=producer.headers).get_json()["jobs"]]
    claimed = client.post("/jobs/claim-many", json={"max_jobs": 3}, headers=worker.headers)

    assert ids == sorted(ids)
    assert [job["payload"]["k"] for job in claimed.get_json()["jobs"]] == keys


# -- a chunked body past the cap was cut and stored -----------------------------------

def _send(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65_536):
            answer += chunk
    return answer


def _chunked_post(port: int, token: str, body: bytes) -> bytes:
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 100]), body[i:i + 100])
                      for i in range(0, len(body), 100))
    return _send(port, b"POST /jobs HTTP/1.1\r\nHost: queuelog\r\nConnection: close\r\n"
                       b"Authorization: Bearer " + token.encode() + b"\r\n"
                       b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                 + chunks + b"0\r\n\r\n")


@pytest.fixture
def small_cap_server(tmp_path: Path) -> Iterator[tuple[LiveServer, str, str]]:
    url = f"sqlite:///{tmp_path / 'queuelog.sqlite3'}"
    upgrade(url)
    producer_token = create_api_key(url, "producer-1", "producer")
    admin_token = create_api_key(url, "admin-1", "admin")
    server = LiveServer(url, log_path=tmp_path / "gunicorn.log", workers=1, threads=4,
                        settings={"MAX_CONTENT_LENGTH": "1024"}).start()
    try:
        yield server, producer_token, admin_token
    finally:
        server.stop()


@pytest.mark.slow
def test_a_chunked_body_past_the_cap_is_refused_not_truncated(
        small_cap_server: tuple[LiveServer, str, str]) -> None:
    server, producer_token, admin_token = small_cap_server
    # Exactly the cap, and valid JSON: cut at the cap, the longer body would be this one.
    body = b'{"type": "email", "payload": {"x": "' + b"a" * 900 + b'"}}'
    body += b" " * (1024 - len(body))

    at_cap = _chunked_post(server.port, producer_token, body)
    past_cap = _chunked_post(server.port, producer_token, body + b"  ")

    assert at_cap.startswith(b"HTTP/1.1 201")
    assert past_cap.startswith(b"HTTP/1.1 413")
    assert b"application/problem+json" in past_cap
    listing = _send(server.port, b"GET /jobs HTTP/1.1\r\nHost: queuelog\r\nConnection: close\r\n"
                                 b"Authorization: Bearer " + admin_token.encode() + b"\r\n\r\n")
    assert len(json.loads(listing.partition(b"\r\n\r\n")[2])["jobs"]) == 1


# -- Unicode digits, ids past the database's range, `//` and OPTIONS ----------------

def test_ids_limits_and_cursors_take_ascii_digits_only(
        client: FlaskClient, api: Any, producer: Key, worker: Key, admin: Key) -> None:
    job_id = api.enqueue(producer).get_json()["id"]
    assert job_id == 1
    unicode_ones = ["\u0661", "\uff11", "\u0967", "\U0001d7d9"]  # Arabic, fullwidth, Devanagari…
    for path in ([f"/jobs/{one}" for one in unicode_ones]
                 + [f"/jobs/{JOB_ID.max + 1}", f"/jobs/{10**30}", "/jobs/0", "/jobs/+1"]):
        _problem(client.get(path, headers=admin.headers), 404)
        _problem(client.post(f"{path}/cancel", headers=admin.headers), 404)
    assert api.get(admin, job_id).status_code == 200
    assert client.get(f"/jobs/{JOB_ID.max}", headers=admin.headers).status_code == 404

    for limit in ["\u0665", "\uff15", "5_0", " 5", "+5", "5.0"]:
        response = client.get("/jobs", query_string={"limit": limit}, headers=admin.headers)
        assert set(_problem(response, 422)["errors"]) == {"limit"}, limit
    for last_id in ["\u0661", "\u00b9", "1_0"]:
        cursor = base64.urlsafe_b64encode(f"v1:{last_id}".encode()).decode().rstrip("=")
        response = client.get("/jobs", query_string={"cursor": cursor}, headers=admin.headers)
        assert _problem(response, 422)["errors"] == {"cursor": ["Invalid cursor."]}

    api.claim(worker)
    beyond = client.post("/jobs/complete-many", headers=worker.headers,
                         json={"items": [{"id": JOB_ID.max + 1}]})
    assert set(_problem(beyond, 422)["errors"]) == {"items.0.id"}


def test_double_slashes_and_options_answer_problems(
        client: FlaskClient, admin: Key) -> None:
    options = client.options("/jobs", headers=admin.headers)
    assert _problem(options, 405)["status"] == 405
    assert set(options.headers["Allow"].split(", ")) == {"GET", "HEAD", "POST"}
    for path in ["/jobs//1", "/jobs//", "//"]:
        assert client.get(path, headers=admin.headers).mimetype == "application/problem+json"


@pytest.mark.slow
def test_double_slashes_and_options_answer_problems_from_gunicorn(
        small_cap_server: tuple[LiveServer, str, str]) -> None:
    server, _, admin_token = small_cap_server
    for method, target in [("GET", "//"), ("GET", "/jobs//1"), ("GET", "//jobs//1"),
                           ("OPTIONS", "/jobs"), ("OPTIONS", "//"), ("OPTIONS", "*"),
                           ("GET", "/jobs/%D9%A1")]:
        answer = _send(server.port, f"{method} {target} HTTP/1.1\r\nHost: queuelog\r\n"
                                    f"Authorization: Bearer {admin_token}\r\n"
                                    "Connection: close\r\n\r\n".encode())
        head = answer.partition(b"\r\n\r\n")[0].lower()
        assert b"content-type: application/problem+json" in head, (method, target, answer[:300])
        assert head.split(b" ")[1][:1] == b"4", (method, target, answer[:300])


# -- the property: any JSON the API accepts renders back unchanged -------------------------------

_scalars = (st.none() | st.booleans() | st.integers()
            | st.floats(allow_nan=False, allow_infinity=False) | st.text())
_json = st.recursive(_scalars, lambda children: st.lists(children, max_size=4)
                     | st.dictionaries(st.text(), children, max_size=4), max_leaves=20)


@st.composite
def _payloads(draw: st.DrawFn) -> dict[str, Any]:
    """Objects of every JSON kind, some wrapped deep: around and past the depth limit."""
    value: Any = draw(st.dictionaries(st.text(), _json, max_size=5))
    for _ in range(draw(st.sampled_from([0, 0, 1, 10, MAX_JSON_DEPTH - 3, MAX_JSON_DEPTH]))):
        value = draw(st.sampled_from([lambda v: {"k": v}, lambda v: [v]]))(value)
    return value if isinstance(value, dict) else {"wrapped": value}


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(payload=_payloads(), result=_payloads())
def test_any_json_the_api_accepts_renders_back_unchanged(
        client: FlaskClient, api: Any, producer: Key, worker: Key, admin: Key,
        payload: dict[str, Any], result: dict[str, Any]) -> None:
    enqueued = api.enqueue(producer, payload=payload)
    if _depth(payload) > MAX_JSON_DEPTH:
        assert _problem(enqueued, 422)["errors"] == {
            "payload": [f"Nested deeper than {MAX_JSON_DEPTH} levels."]}
        return
    assert enqueued.status_code == 201, enqueued.get_json()
    job_id = enqueued.get_json()["id"]
    assert api.get(admin, job_id).get_json()["payload"] == payload
    claimed = client.post("/jobs/claim-many", json={"max_jobs": 100}, headers=worker.headers)
    assert [job["payload"] for job in claimed.get_json()["jobs"]] == [payload]

    completed = api.complete(worker, job_id, result=result)
    if _depth(result) > MAX_JSON_DEPTH:
        assert _problem(completed, 422)["errors"] == {
            "result": [f"Nested deeper than {MAX_JSON_DEPTH} levels."]}
        assert api.complete(worker, job_id).status_code == 200
        return
    assert completed.status_code == 200, completed.get_json()
    assert completed.get_json()["result"] == result
    shown = api.get(admin, job_id).get_json()
    assert (shown["payload"], shown["result"]) == (payload, result)
