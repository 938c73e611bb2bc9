"""What each answer means for the job (app/dispatch/outcome.py), without I/O."""

from __future__ import annotations

import pytest

from app.dispatch.http import Answer, Endpoint
from app.dispatch.outcome import Kind, outcome_of, retry_after_seconds

NOW = 1_800_000_000.0


def answer(status: int, body: bytes = b"", retry_after: str | None = None,
           truncated: bool = False) -> Answer:
    return Answer(status, body, truncated, retry_after)


@pytest.mark.parametrize("value,seconds", [
    ("0", 0), ("120", 120), (" 7 ", 7), ("999999999", 86_400),
    ("Fri, 15 Jan 2027 08:00:30 GMT", 30), ("Fri, 15 Jan 2027 07:00:00 GMT", 0),
    (None, None), ("soon", None), ("-5", None), ("1.5", None), ("", None),
])
def test_retry_after_is_seconds_or_an_http_date(value, seconds):
    # NOW is 2027-01-15 08:00:00 UTC.
    assert retry_after_seconds(value, NOW) == seconds


def test_2xx_completes_and_only_a_whole_json_object_is_the_result():
    assert outcome_of(answer(200, b'{"a": 1}'), NOW).result == {"a": 1}
    assert outcome_of(answer(201, b'{"a": 1}', truncated=True), NOW).result is None
    assert outcome_of(answer(204), NOW).kind is Kind.COMPLETED


def test_429_and_503_with_retry_after_retry_after_it_and_others_take_the_backoff():
    retried = outcome_of(answer(429, b"slow down", "5"), NOW)
    assert (retried.kind, retried.retry_in_seconds, retried.error) == (
        Kind.RETRY_AFTER, 5, "HTTP 429: slow down")
    for status, retry_after in ((503, None), (500, "5"), (302, None), (404, None)):
        failed = outcome_of(answer(status, b"x" * 500, retry_after), NOW)
        assert failed.kind is Kind.HTTP_ERROR and failed.retry_in_seconds is None
        assert failed.error == f"HTTP {status}: " + "x" * 200


def test_url_credentials_become_a_basic_header_and_leave_the_url():
    endpoint = Endpoint.parse("https://us%40er:p%3Ass@svc.internal:8443/hook?a=1")
    assert endpoint.url == "https://svc.internal:8443/hook?a=1"
    assert endpoint.authorization == "Basic dXNAZXI6cDpzcw=="
    assert Endpoint.parse("http://svc/x").authorization is None
