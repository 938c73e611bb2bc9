"""Reservations' checks (contract §18), asked by the dispatcher's Checker with the app's own
services against a real check endpoint on loopback, on both engines: what each answer does,
the signature a producer verifies, and that nothing leaks or reaches another job."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from app.dispatch.check_rounds import Checker
from app.dispatch.checks import backoff_us
from app.dispatch.http import PushClient
from queuelog_client.signature import SIGNATURE_HEADER, verify_check
from tests.conftest import Api, Key


@dataclass
class Asked:
    path: str
    query: str
    headers: dict[str, str]


@dataclass
class CheckEndpoint:
    """A producer's check url: answers each GET with `answer(job_id)` -> (status, body)."""

    answer: Callable[[int], tuple[int, bytes]]
    asked: list[Asked] = field(default_factory=list)

    def __post_init__(self) -> None:
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                endpoint.asked.append(Asked(parts.path, parts.query, dict(self.headers)))
                job_id = int(parse_qs(parts.query)["job_id"][0])
                status, body = endpoint.answer(job_id)
                self.send_response(status)
                if status in (301, 302):
                    self.send_header("Location", "http://127.0.0.1:1/elsewhere")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/queuelog/check"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def check_endpoint() -> Iterator[CheckEndpoint]:
    """The producer's check endpoint, started before the app so that the operator's list
    (its port included) can name it; each test sets its answer."""
    endpoint = CheckEndpoint(lambda _job: (500, b""))
    yield endpoint
    endpoint.close()


@pytest.fixture
def app_config(app_config: dict[str, Any], check_endpoint: CheckEndpoint) -> dict[str, Any]:
    return {**app_config,
            "CHECK_URL_ORIGINS": check_endpoint.url.removesuffix("check") + ",http://127.0.0.1:9"}


@pytest.fixture
def endpoint(check_endpoint: CheckEndpoint) -> Callable[..., CheckEndpoint]:
    def answering(answer: Callable[[int], tuple[int, bytes]]) -> CheckEndpoint:
        check_endpoint.answer = answer
        return check_endpoint

    return answering


class Rounds:
    """The dispatcher's Checker a round at a time, each round's checks waited for."""

    def __init__(self, checker: Checker) -> None:
        self.checker = checker

    def run_once(self) -> int:
        taken = self.checker.run_once()
        assert self.checker.wait_idle(timeout=30), "the round's checks did not end"
        return taken


@pytest.fixture
def checker(app: Any, clock: Any) -> Rounds:
    services = app.extensions["queuelog"]
    return Rounds(Checker(services.jobs.reservations, PushClient(4), clock))


def reserve(api: Api, producer: Key, check_url: str, **body: Any) -> int:
    made = api.enqueue(producer, reserve={"confirm_within_seconds": 30,
                                          "check_url": check_url}, **body)
    assert made.status_code == 201, made.json
    job_id: int = made.json["id"]
    return job_id


def last_event(client: Any, admin: Key, job_id: int) -> tuple[str, str, Any]:
    event = client.get(f"/jobs/{job_id}/events", headers=admin.headers).json["events"][-1]
    return event["event"], event["actor"], event["detail"]


@pytest.mark.parametrize("commit,status", [(True, "pending"), (False, "cancelled")])
def test_a_checks_answer_decides_a_reservation_left_unanswered(
        app, api, client, producer, admin, clock, checker, endpoint, commit, status):
    secret = app.extensions["queuelog"].keys.rotate_check_secret("producer-1")
    check = endpoint(lambda _job: (200, json.dumps({"commit": commit}).encode()))
    job_id = reserve(api, producer, check.url, headers={"Idempotency-Key": "order-7"})
    assert checker.run_once() == 0  # not before its deadline
    clock.advance(30)

    assert checker.run_once() == 1

    assert api.get(admin, job_id).json["status"] == status
    event, actor, detail = last_event(client, admin, job_id)
    assert (event, actor) == ("confirmed" if commit else "released", "queuelog")
    assert detail == {"by": "check", "check_url": check.url}
    [asked] = check.asked
    assert parse_qs(asked.query) == {"job_id": [str(job_id)], "idempotency_key": ["order-7"]}
    assert asked.headers["Queuelog-Job-Id"] == str(job_id)
    assert asked.headers["Queuelog-Attempt"] == "1"
    verify_check(secret, asked.headers, asked.query)  # raises unless signed by this secret
    # The producer's own late answer: the same outcome is 200, the other 409.
    same, other = ("confirm", "release") if commit else ("release", "confirm")
    assert client.post(f"/jobs/{job_id}/{same}", headers=producer.headers).status_code == 200
    assert client.post(f"/jobs/{job_id}/{other}", headers=producer.headers).status_code == 409


@pytest.mark.parametrize("answer", [
    (500, b'{"commit": true}'), (200, b"yes"), (200, b'{"commit": "true"}'), (200, b"[]"),
    (302, b""), (200, b'{"commit": true, "pad": "' + b"x" * 5000 + b'"}'),
    (200, b'{"commit": false, "commit": true}'), (200, b'{"commit": true, "commit": false}'),
    (200, b'{"commit": true, "commit": true}'), (200, b'{"commit": true, "job_id": 1}'),
    (200, b'{"commit": 1}'), (200, b'{"commit": null}'), (200, b'[{"commit": true}]'),
    (200, b'{"Commit": true}'), (200, b'{"commit": true}{"commit": true}'),
], ids=["500", "not json", "a string", "not an object", "a redirect", "too long",
        "a key twice, true last", "a key twice, false last", "a key twice, alike",
        "another key", "a number", "null", "in an array", "another case", "two objects"])
def test_any_other_answer_asks_again_after_a_backoff(api, client, producer, admin, clock,
                                                     checker, endpoint, answer):
    check = endpoint(lambda _job: answer)
    job_id = reserve(api, producer, check.url)
    clock.advance(30)

    assert checker.run_once() == 1
    assert api.get(admin, job_id).json["status"] == "reserved"
    assert checker.run_once() == 0  # not again before its backoff
    clock.advance(backoff_us(0) / 1_000_000)
    assert checker.run_once() == 1
    assert [a.headers["Queuelog-Attempt"] for a in check.asked] == ["1", "2"]
    assert all(a.path == "/queuelog/check" for a in check.asked)  # no redirect followed


def test_an_unreachable_check_is_asked_again_and_the_day_after_released(
        app, api, client, producer, admin, clock, checker):
    job_id = reserve(api, producer, "http://127.0.0.1:9/queuelog/check")
    clock.advance(30)
    assert checker.run_once() == 1
    assert api.get(admin, job_id).json["status"] == "reserved"
    clock.advance(24 * 3600)  # maintenance, which moving the clock runs, releases it
    assert api.get(admin, job_id).json["status"] == "cancelled"
    assert last_event(client, admin, job_id)[2] == {"by": "check unanswered for 24 hours"}


def test_a_reservation_its_producer_answered_is_never_asked(api, client, producer, clock,
                                                            checker, endpoint):
    check = endpoint(lambda _job: (200, b'{"commit": false}'))
    job_id = reserve(api, producer, check.url)
    assert client.post(f"/jobs/{job_id}/confirm", headers=producer.headers).status_code == 200
    clock.advance(30)
    assert checker.run_once() == 0
    assert check.asked == []
    assert api.get(producer, job_id).json["status"] == "pending"


def test_a_check_urls_credentials_are_sent_as_basic_auth_and_never_shown(
        api, client, producer, admin, clock, checker, endpoint, caplog):
    check = endpoint(lambda _job: (500, b""))
    secret_url = check.url.replace("http://", "http://shop:s3cret-pw@")
    job_id = reserve(api, producer, secret_url)
    clock.advance(30)
    with caplog.at_level("INFO"):
        checker.run_once()
    [asked] = check.asked
    assert asked.headers["Authorization"].startswith("Basic ")
    assert "s3cret-pw" not in caplog.text
    shown = json.dumps([api.get(admin, job_id).json,
                        client.get(f"/jobs/{job_id}/events", headers=admin.headers).json])
    assert "s3cret-pw" not in shown
    check.answer = lambda _job: (200, b'{"commit": true}')
    clock.advance(backoff_us(0) / 1_000_000)
    checker.run_once()
    assert "s3cret-pw" not in json.dumps(last_event(client, admin, job_id))


def test_a_check_answers_for_its_own_job_alone(api, client, producer, admin, clock, checker,
                                              endpoint, make_key):
    """Two producers' reservations at one check url: each answer decides the job asked
    about; an answer that says anything more (another job's id) decides nothing."""
    other = make_key("producer-2", "producer")
    answers = {}
    check = endpoint(lambda job: (200, answers[job]))
    mine = reserve(api, producer, check.url)
    theirs = reserve(api, other, check.url)
    third = reserve(api, other, check.url)
    answers.update({mine: b'{"commit": true}', theirs: b'{"commit": false}',
                    third: json.dumps({"commit": True, "job_id": mine}).encode()})
    clock.advance(30)
    assert checker.run_once() == 3
    assert api.get(admin, mine).json["status"] == "pending"
    assert api.get(admin, theirs).json["status"] == "cancelled"
    assert api.get(admin, third).json["status"] == "reserved"
    assert SIGNATURE_HEADER not in check.asked[0].headers  # no check secret made yet
