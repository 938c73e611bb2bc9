"""When the serving worker hands a request to a thread (queuelog_gunicorn/framing.py): only once
it is whole, at once when gunicorn or the app will refuse it from what is there, never after
more framing than a body needs."""

from __future__ import annotations

import pytest
from gunicorn.config import Config

from app.config import SETTINGS
from queuelog_gunicorn.framing import FRAMING_ALLOWANCE, Limits, RequestProgress, Verdict
from queuelog_gunicorn.worker import DEFAULT_MAX_CONTENT_LENGTH, max_content_length

LIMITS = Limits(head=8192, body=1000, chunk_line=100, trailers=500)
HEAD = b"POST /jobs HTTP/1.1\r\nHost: q\r\nAuthorization: Bearer t\r\n"


def verdicts(request: bytes, step: int = 1) -> list[Verdict]:
    """The verdict after each `step` bytes, as if they arrived that way."""
    progress = RequestProgress(LIMITS)
    data = bytearray()
    seen = []
    for start in range(0, len(request), step):
        data += request[start:start + step]
        seen.append(progress.check(data))
        if seen[-1] is not Verdict.INCOMPLETE:
            break
    return seen


def ready_only_at_the_end(request: bytes) -> bool:
    seen = verdicts(request)
    return seen[-1] is Verdict.READY and len(seen) == len(request)


@pytest.mark.parametrize("request_bytes", [
    b"GET /healthz HTTP/1.1\r\nHost: q\r\n\r\n",
    b"\r\nGET /healthz HTTP/1.1\r\n\r\n",  # one empty line may come first
    HEAD + b"Content-Length: 11\r\n\r\n" + b'{"type": 1}',
    HEAD + b"Content-Length: 0\r\n\r\n",
    HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n3;x=y\r\n 1}\r\n0\r\n\r\n",
    HEAD + b"Transfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\nX-Sum: 1\r\n\r\n",
])
def test_a_request_is_handed_over_when_its_last_byte_arrives_and_not_before(
        request_bytes: bytes) -> None:
    assert ready_only_at_the_end(request_bytes)
    # Arriving at once, or in two pieces, changes nothing.
    assert verdicts(request_bytes, step=len(request_bytes)) == [Verdict.READY]
    assert verdicts(request_bytes, step=len(request_bytes) // 2 + 1)[-1] is Verdict.READY


def test_bytes_beyond_the_request_are_the_next_request_and_change_nothing() -> None:
    first = HEAD + b"Content-Length: 2\r\n\r\n{}"
    assert RequestProgress(LIMITS).check(first + b"GET / HTTP/1.1\r\n") is Verdict.READY


@pytest.mark.parametrize("request_bytes", [
    b"GET /healthz HTTP/1.1\nHost: q\n",  # bare LF: gunicorn answers 400
    b"GET /" + b"x" * 9000,  # past the head limit: gunicorn answers 414 or 431
    HEAD + b"Content-Length: 1\r\nContent-Length: 1\r\n\r\n",
    HEAD + b"Content-Length: 1e3\r\n\r\n",
    HEAD + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
    HEAD + b"Transfer-Encoding: gzip\r\n\r\n",
    HEAD + b"Broken header line\r\n\r\n",
    HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
    HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"1" * 200,  # chunk line past its limit
    HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}xx",  # no CRLF after the data
])
def test_what_gunicorn_refuses_is_handed_over_without_waiting_for_more(
        request_bytes: bytes) -> None:
    progress = RequestProgress(LIMITS)
    assert progress.check(request_bytes) is Verdict.READY
    assert not progress.cut


def test_a_declared_body_over_the_cap_is_handed_over_at_its_head_for_the_apps_413() -> None:
    progress = RequestProgress(LIMITS)
    assert progress.check(HEAD + b"Content-Length: 1001\r\n\r\n") is Verdict.READY
    assert progress.cut
    within = RequestProgress(LIMITS)
    assert within.check(HEAD + b"Content-Length: 1000\r\n\r\n") is Verdict.INCOMPLETE
    assert not within.cut


def test_a_chunked_body_is_held_until_one_byte_past_the_cap_then_handed_over_cut() -> None:
    head = HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
    progress = RequestProgress(LIMITS)
    assert progress.check(head + b"3e8\r\n" + b"a" * 1000 + b"\r\n") is Verdict.INCOMPLETE
    assert progress.check(head + b"3e8\r\n" + b"a" * 1000 + b"\r\n1\r\nb") is Verdict.READY
    assert progress.cut
    # Declaring a huge chunk is not enough: the bytes past the cap must have arrived.
    huge = RequestProgress(LIMITS)
    assert huge.check(head + b"ffffffff\r\n" + b"a" * 1000) is Verdict.INCOMPLETE
    assert huge.check(head + b"ffffffff\r\n" + b"a" * 1001) is Verdict.READY


def test_a_chunked_body_made_mostly_of_framing_closes_the_connection() -> None:
    # Empty chunk extensions make each chunk line long while adding almost nothing.
    body = (b"1;a=" + b"b" * 80 + b"\r\nx\r\n") * ((LIMITS.body + FRAMING_ALLOWANCE) // 85 + 1)
    seen = verdicts(HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + body, step=4096)
    assert seen[-1] is Verdict.REFUSE


def test_a_client_waiting_for_100_continue_is_invited_only_when_its_body_is_missing() -> None:
    expect = HEAD + b"Expect: 100-continue\r\nContent-Length: 2\r\n\r\n"
    waiting = RequestProgress(LIMITS)
    assert waiting.check(expect) is Verdict.INCOMPLETE and waiting.wants_continue
    assert not RequestProgress(LIMITS).wants_continue
    http10 = RequestProgress(LIMITS)
    http10.check(expect.replace(b"HTTP/1.1", b"HTTP/1.0"))
    assert not http10.wants_continue


def test_the_limits_are_gunicorns_and_the_body_cap_is_the_apps() -> None:
    cfg = Config()
    for name, value in (("limit_request_line", 2048), ("limit_request_fields", 50),
                        ("limit_request_field_size", 4096)):
        cfg.set(name, value)
    limits = Limits.of_gunicorn(cfg, 5000)
    assert limits == Limits(head=2 + 2048 + 2 + 50 * 4098 + 4, body=5000, chunk_line=4096,
                            trailers=50 * 4098 + 4)
    app_default = next(s.default for s in SETTINGS if s.key == "MAX_CONTENT_LENGTH")
    assert app_default == DEFAULT_MAX_CONTENT_LENGTH
    assert max_content_length({}) == app_default
    assert max_content_length({"QUEUELOG_MAX_CONTENT_LENGTH": "2048"}) == 2048
