"""Reserved jobs from the client (contract section 18): `with client.reserve(...)` confirms
when the block succeeds and releases when it raises, confirm and release on their own, the
idempotency key's replay; and verify_check, the check endpoint's signature check, against
checks signed as the dispatcher signs them."""

from __future__ import annotations

import email.message
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from queuelog_client import (
    CheckRequest,
    Client,
    Conflict,
    SignatureError,
    ValidationFailed,
    verify_check,
)
from queuelog_client.signature import signature_header
from tests.client.conftest import LiveServer

SECRET = "qlchk_0123456789abcdef"
NOW = 1_800_000_000
QUERY = "job_id=5&idempotency_key=order-1001"
CHECK_PREFIX = "http://127.0.0.1:9/shop/"


def signed(query: str = QUERY, *, job_id: int = 5, attempt: int = 1, secret: str = SECRET,
           at: int = NOW) -> dict[str, str]:
    """The headers of a check, signed by the server's own code over the query's bytes."""
    return {"Queuelog-Signature": signature_header(secret, at, query.encode(), job_id=job_id,
                                                   attempt=attempt),
            "Queuelog-Job-Id": str(job_id), "Queuelog-Attempt": str(attempt)}


# -- verify_check ---------------------------------------------------------------------------------

def test_a_check_signed_by_queuelog_verifies_and_says_what_it_asks():
    asked = verify_check(SECRET, signed(attempt=3), QUERY, now=NOW)
    assert asked == CheckRequest(job_id=5, idempotency_key="order-1001", attempt=3)
    assert verify_check(SECRET, signed(), QUERY.encode(), now=NOW + 300) == asked._replace(
        attempt=1)


def test_the_headers_may_come_as_any_framework_gives_them():
    headers = signed()
    lower = {name.lower(): value for name, value in headers.items()}
    environ = {"HTTP_" + name.upper().replace("-", "_"): value
               for name, value in headers.items()}
    environ |= {"QUERY_STRING": QUERY, "REQUEST_METHOD": "GET", "wsgi.input": object()}
    message = email.message.Message()  # an http.server handler's self.headers
    for name, value in headers.items():
        message[name] = value
    for given in (lower, environ, message):
        assert verify_check(SECRET, given, QUERY, now=NOW).job_id == 5


def test_an_escaped_or_empty_idempotency_key_is_given_decoded():
    query = "job_id=7&idempotency_key=order%201001%2Fa"
    assert verify_check(SECRET, signed(query, job_id=7), query, now=NOW).idempotency_key == (
        "order 1001/a")
    empty = "job_id=7&idempotency_key="
    assert verify_check(SECRET, signed(empty, job_id=7), empty,
                        now=NOW).idempotency_key == ""


@pytest.mark.parametrize("change", [
    "another secret", "another query", "another job id header", "another attempt header",
    "v1 alone", "stale", "from the future", "no signature", "a query naming another job",
    "a repeated header", "no job id header",
])
def test_a_check_not_signed_for_this_request_now_is_refused(change):
    headers: Any = signed()
    query, now = QUERY, NOW
    if change == "another secret":
        headers = signed(secret="qlchk_other")
    elif change == "another query":
        query = "job_id=5&idempotency_key=order-1002"
    elif change == "another job id header":
        headers["Queuelog-Job-Id"] = "6"
    elif change == "another attempt header":
        headers["Queuelog-Attempt"] = "2"
    elif change == "v1 alone":
        headers["Queuelog-Signature"] = headers["Queuelog-Signature"].split(",v2=")[0]
    elif change == "stale":
        now = NOW + 301
    elif change == "from the future":
        now = NOW - 301
    elif change == "no signature":
        del headers["Queuelog-Signature"]
    elif change == "a query naming another job":
        query = "job_id=6&idempotency_key=order-1001"
        headers = signed(query, job_id=5)
    elif change == "a repeated header":
        message = email.message.Message()
        for name, value in [*headers.items(), ("Queuelog-Job-Id", "6")]:
            message[name] = value
        headers = message
    elif change == "no job id header":
        del headers["Queuelog-Job-Id"]
    with pytest.raises(SignatureError):
        verify_check(SECRET, headers, query, now=now)


def test_the_tolerance_is_the_callers():
    assert verify_check(SECRET, signed(), QUERY, tolerance_seconds=1000, now=NOW + 900)
    with pytest.raises(SignatureError):
        verify_check(SECRET, signed(), QUERY, tolerance_seconds=10, now=NOW + 11)


def test_without_now_the_clock_decides():
    at = int(time.time())
    assert verify_check(SECRET, signed(at=at), QUERY).job_id == 5
    with pytest.raises(SignatureError):
        verify_check(SECRET, signed(at=at - 3600), QUERY)


# -- against a live server ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, sqlite_template: str
           ) -> Iterator[LiveServer]:
    # One server for the module: each test has producer keys of its own (a producer sees only
    # its own jobs); only the claim test claims, and only "pdf" jobs, which only it makes.
    live = LiveServer(tmp_path_factory.mktemp("reserve-server"), sqlite_template,
                      QUEUELOG_CHECK_URL_ORIGINS=CHECK_PREFIX)
    live.start()
    yield live
    live.stop()


def _producer(server: LiveServer) -> Client:
    return server.client(server.create_key(f"shop-{uuid.uuid4().hex[:8]}", "producer"))


class Rollback(Exception):
    """The producer's own transaction failed."""


@pytest.mark.slow
def test_a_block_that_succeeds_confirms_its_job_which_a_worker_then_claims(server):
    queue = _producer(server)
    worker = server.client(server.create_key(f"mailer-{uuid.uuid4().hex[:8]}", "worker"))

    with queue.reserve("pdf", {"order": 1001}) as job:
        assert job["status"] == "reserved" and job["replayed"] is False
        assert queue.get_job(job["id"])["status"] == "reserved"
        assert worker.claim(types=["pdf"]) is None  # never claimed while reserved

    assert queue.get_job(job["id"])["status"] == "pending"
    claimed = worker.claim(types=["pdf"])
    assert claimed is not None and claimed["id"] == job["id"]


@pytest.mark.slow
def test_a_block_that_raises_releases_its_job_and_the_error_is_raised(server):
    queue = _producer(server)
    with pytest.raises(Rollback), queue.reserve("email", {"order": 1002}) as job:
        raise Rollback("the order's INSERT failed")

    assert queue.get_job(job["id"])["status"] == "cancelled"
    assert queue.release(job["id"])["status"] == "cancelled"  # a repeat answers the same
    with pytest.raises(Conflict):
        queue.confirm(job["id"])  # the other outcome


@pytest.mark.slow
def test_a_confirm_that_finds_the_job_released_raises_conflict(server):
    # What the producer hears when the deadline or the check released its job first.
    queue = _producer(server)
    with pytest.raises(Conflict), queue.reserve("email", {"order": 1003}) as job:
        server.client().release(job["id"])  # an admin, standing in for the check
    assert queue.get_job(job["id"])["status"] == "cancelled"


@pytest.mark.slow
def test_a_release_that_finds_the_job_confirmed_leaves_the_blocks_error_first(server):
    queue = _producer(server)
    with pytest.raises(Rollback) as raised, queue.reserve("email", {"order": 1004}) as job:
        assert queue.confirm(job["id"])["status"] == "pending"  # as the check's commit: true
        raise Rollback("after the commit")

    assert queue.get_job(job["id"])["status"] == "pending"
    assert any(f"job {job['id']} was not released" in note
               for note in raised.value.__notes__)


@pytest.mark.slow
def test_an_idempotency_key_replays_the_reservation_until_it_is_decided(server):
    queue = _producer(server)
    key = f"order-{uuid.uuid4().hex[:8]}"
    # The producer's retry while the first is still open: the same reservation.
    with queue.reserve("email", {"order": 1005}, idempotency_key=key) as first, \
            queue.reserve("email", {"order": 1005}, idempotency_key=key) as again:
        assert (again["id"], again["replayed"]) == (first["id"], True)
    assert queue.get_job(first["id"])["status"] == "pending"

    # Once decided, a replay does not run the block again (its work was committed).
    ran = []
    with pytest.raises(Conflict) as raised, queue.reserve("email", {"order": 1005},
                                                          idempotency_key=key):
        ran.append(True)
    assert not ran
    assert raised.value.problem["job"]["id"] == first["id"]
    assert raised.value.problem["job"]["status"] == "pending"
    # The same key with another request is refused, as any enqueue's.
    with pytest.raises(ValidationFailed), queue.reserve("email", {"order": 1005},
                                                        confirm_within_seconds=61,
                                                        idempotency_key=key):
        pass


@pytest.mark.slow
def test_confirm_and_release_on_their_own(server):
    queue = _producer(server)
    with queue.reserve("email", {"order": 1006}) as job:
        assert queue.confirm(job["id"])["status"] == "pending"
    # The block's own confirm was a repeat of that one: 200, and the job still pending.
    assert queue.confirm(job["id"])["status"] == "pending"
    with pytest.raises(Conflict):
        queue.release(job["id"])
    with pytest.raises(Conflict):  # a job never reserved has nothing to confirm
        queue.confirm(queue.enqueue("email", {"order": 1007})["id"])


@pytest.mark.slow
def test_a_check_url_must_start_with_one_of_the_operators_prefixes(server):
    queue = _producer(server)
    with queue.reserve("email", {"order": 1009}, check_url=CHECK_PREFIX + "check") as job:
        assert job["status"] == "reserved"
    with pytest.raises(ValidationFailed) as refused, queue.reserve(
            "email", {"order": 1010}, check_url="http://127.0.0.1:9/elsewhere"):
        pass
    assert "reserve.check_url" in refused.value.errors


@pytest.mark.slow
def test_enqueue_options_pass_through_and_unique_is_refused(server):
    queue = _producer(server)
    with queue.reserve("email", {"order": 1011}, priority="low", max_retries=7,
                       concurrency_key="acct-1") as job:
        assert (job["priority"], job["max_retries"], job["concurrency_key"]) == (
            "low", 7, "acct-1")
    with pytest.raises(ValidationFailed) as refused, queue.reserve(
            "email", {"order": 1012}, unique={"key": "k"}):
        pass
    assert "reserve" in refused.value.errors
    with pytest.raises(TypeError), queue.reserve("email", no_such_option=1):
        pass
