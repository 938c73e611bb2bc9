"""Signatures of push deliveries: how queuelog signs each POST to a push type's endpoint, and
how a receiver checks one (docs/PUSH.md).

    Queuelog-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">,
                        v2=<hex HMAC-SHA256 of "<t>.<job id>.<attempt>.<body>">

The HMAC key is the type's secret as UTF-8 bytes; the body is the request's raw bytes, as
received (parse the JSON only after checking); the job id and attempt are the decimal
Queuelog-Job-Id and Queuelog-Attempt headers. v2 binds those headers, on which a receiver
dedupes, to the body: under v1 alone a captured delivery could be replayed with another job
id and be taken for a new job. v1 is still sent for receivers that do not check v2 yet. A
receiver also refuses a `t` too far from its own clock, so that a delivery captured once
cannot be replayed later.

Reservations' checks (docs/JOBS.md, Reserved jobs) are signed the same way, with the request's raw
query string standing for the body: GET <check url>?job_id=<id>&idempotency_key=<key> under
the producer key's check secret. `verify_check` checks one in the producer's check endpoint.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Iterable
from typing import Any, NamedTuple, Protocol
from urllib.parse import parse_qsl

SIGNATURE_HEADER = "Queuelog-Signature"
JOB_ID_HEADER = "Queuelog-Job-Id"
ATTEMPT_HEADER = "Queuelog-Attempt"
DEFAULT_TOLERANCE_SECONDS = 300


class SignatureError(ValueError):
    """The Queuelog-Signature header is missing or not of the form t=<int>,v1=<hex>."""


def compute_signature(secret: str, timestamp: int, body: bytes) -> str:
    """v1: the hex HMAC-SHA256 of "<timestamp>.<body>" under the secret's UTF-8 bytes."""
    message = str(timestamp).encode("ascii") + b"." + body
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def compute_delivery_signature(secret: str, timestamp: int, job_id: int, attempt: int,
                               body: bytes) -> str:
    """v2: the hex HMAC-SHA256 of "<timestamp>.<job id>.<attempt>.<body>"."""
    message = f"{timestamp}.{job_id}.{attempt}.".encode("ascii") + body
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def signature_header(secret: str, timestamp: int, body: bytes, *, job_id: int | None = None,
                     attempt: int | None = None) -> str:
    """The Queuelog-Signature header's value for `body` sent at `timestamp`; with the job id
    and attempt (as queuelog always sends), v2 as well."""
    header = f"t={timestamp},v1={compute_signature(secret, timestamp, body)}"
    if job_id is not None and attempt is not None:
        header += (",v2=" + compute_delivery_signature(secret, timestamp, job_id, attempt,
                                                       body))
    return header


def _decimal(value: str | int) -> int | None:
    if isinstance(value, int):
        return value if value >= 0 else None
    value = value.strip()
    return int(value) if value.isascii() and value.isdigit() else None


def _parse(header: str | None) -> tuple[int, list[str], list[str]]:
    if not header:
        raise SignatureError(f"no {SIGNATURE_HEADER} header")
    timestamp: int | None = None
    v1: list[str] = []
    v2: list[str] = []
    for part in header.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep:
            raise SignatureError(f"malformed {SIGNATURE_HEADER} header: {part.strip()!r}")
        if name == "t":
            if not value.isascii() or not value.isdigit() or timestamp is not None:
                raise SignatureError(f"malformed {SIGNATURE_HEADER} header: bad or repeated t")
            timestamp = int(value)
        elif name == "v1":
            v1.append(value)
        elif name == "v2":
            v2.append(value)
        # Other schemes (v3=…) are skipped: a receiver keeps working when one is added.
    if timestamp is None or not (v1 or v2):
        raise SignatureError(f"malformed {SIGNATURE_HEADER} header: needs t= and v1= or v2=")
    return timestamp, v1, v2


def verify_signature(secret: str, header: str | None, body: bytes, tolerance: int = 300, *,
                     now: float | None = None, job_id: str | int | None = None,
                     attempt: str | int | None = None) -> bool:
    """True when `header` (the Queuelog-Signature value) signs `body` under `secret` with a
    timestamp within `tolerance` seconds of now; False for a wrong signature or a stale (or
    future) timestamp. Raises SignatureError when the header is missing or malformed: that is
    a client that does not speak the protocol, not a forgery to count.

    Pass `job_id` and `attempt` (the Queuelog-Job-Id and Queuelog-Attempt headers, as
    received): then the v2 signature must match, which binds them to the body, so that a
    delivery captured once cannot be replayed under another job id (a receiver dedupes on
    it). Without them only v1 is checked, which covers the body and `t` alone.

    The comparison runs in constant time. Pass the raw request body (bytes), not re-encoded
    JSON: any change of a byte changes the signature.
    """
    if not isinstance(body, (bytes, bytearray)):
        raise TypeError("body must be the raw request bytes (request.get_data()), not text")
    if (job_id is None) != (attempt is None):
        raise TypeError("pass job_id and attempt together (both are signed)")
    timestamp, v1, v2 = _parse(header)
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        return False
    if job_id is None or attempt is None:
        return _any_matches(compute_signature(secret, timestamp, bytes(body)), v1)
    job, number = _decimal(job_id), _decimal(attempt)
    if job is None or number is None:
        return False  # not a header queuelog sends: nothing it signed
    # v1 is never accepted in its place: a header stripped to v1 would undo the binding.
    return _any_matches(
        compute_delivery_signature(secret, timestamp, job, number, bytes(body)), v2)


def _any_matches(expected: str, candidates: list[str]) -> bool:
    # Every candidate is compared (no early exit), each in constant time.
    matched = False
    for candidate in candidates:
        # compare_digest takes ASCII text alone; anything else matches nothing anyway.
        if candidate.isascii():
            matched |= hmac.compare_digest(expected, candidate.lower())
    return matched


# -- reservations' checks ------------------------------------------------------------------------

class Headers(Protocol):
    """Request headers as any framework gives them: a mapping of names (any case) to values,
    an http.server handler's `self.headers`, or a WSGI environ (HTTP_QUEUELOG_SIGNATURE)."""

    def items(self) -> Iterable[tuple[str, Any]]: ...


class CheckRequest(NamedTuple):
    """A check that verify_check found signed by queuelog: which reservation it asks about
    (its job id, and the idempotency key the reserve carried, "" when none) and which asking
    of it this is (1, 2, ...: a check unanswered is asked again)."""

    job_id: int
    idempotency_key: str
    attempt: int


def verify_check(secret: str, headers: Headers, query_string: str | bytes,
                 tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS, *,
                 now: float | None = None) -> CheckRequest:
    """Check that a request to a producer's check endpoint comes from queuelog and return
    what it asks; raise SignatureError when it does not (answer 401 then, without looking
    anything up).

    `headers` are the request's (Queuelog-Signature, Queuelog-Job-Id, Queuelog-Attempt are
    read; a WSGI environ will do); `query_string` is the raw query string as received, bytes
    or text, without the "?" (WSGI's QUERY_STRING, Flask's request.query_string): it is
    signed byte for byte, so pass it before any decoding. The v2 signature must match, over
    "<t>.<job id>.<attempt>.<query>" under the check secret, with `t` within
    `tolerance_seconds` of now (of `now`, unix seconds, when given): a check captured once
    cannot be replayed later.
    """
    found = _check_headers(headers)
    timestamp, _v1, v2 = _parse(found.get(SIGNATURE_HEADER.lower()))
    job_id = _decimal(found.get(JOB_ID_HEADER.lower(), ""))
    attempt = _decimal(found.get(ATTEMPT_HEADER.lower(), ""))
    if job_id is None or attempt is None:
        raise SignatureError(f"no decimal {JOB_ID_HEADER} and {ATTEMPT_HEADER} headers")
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_seconds:
        raise SignatureError(f"the signature's t is more than {tolerance_seconds} s from now")
    query = _raw_query(query_string)
    # v2 alone: it binds the job id and attempt headers to the query, v1 does not.
    if not _any_matches(compute_delivery_signature(secret, timestamp, job_id, attempt, query),
                        v2):
        raise SignatureError("the signature does not match (another secret, or a changed "
                             "request)")
    return _asked(query, job_id, attempt)


def _check_headers(headers: Headers) -> dict[str, str]:
    """The three headers a check is signed with, by lower-cased name; a repeated one is
    refused (which of two values would have been signed?)."""
    wanted = {name.lower() for name in (SIGNATURE_HEADER, JOB_ID_HEADER, ATTEMPT_HEADER)}
    found: dict[str, str] = {}
    for name, value in headers.items():
        # A WSGI environ names a header HTTP_QUEUELOG_JOB_ID.
        key = (name[5:].replace("_", "-") if name.startswith("HTTP_") else name).lower()
        if key in wanted and isinstance(value, str):
            if key in found:
                raise SignatureError(f"the {key} header is repeated")
            found[key] = value
    return found


def _raw_query(query_string: str | bytes) -> bytes:
    if isinstance(query_string, (bytes, bytearray)):
        return bytes(query_string).removeprefix(b"?")
    query_string = query_string.removeprefix("?")
    try:
        # WSGI gives the query string as latin-1 text: this gives its bytes back.
        return query_string.encode("latin-1")
    except UnicodeEncodeError:
        return query_string.encode("utf-8")


def _asked(query: bytes, job_id: int, attempt: int) -> CheckRequest:
    """What the signed query asks: its job_id must be the header's."""
    try:
        pairs = parse_qsl(query.decode("utf-8"), keep_blank_values=True)
    except UnicodeDecodeError:
        raise SignatureError("the query string is not UTF-8") from None
    values: dict[str, list[str]] = {}
    for name, value in pairs:
        values.setdefault(name, []).append(value)
    ids = values.get("job_id", [])
    keys = values.get("idempotency_key", [""])
    if len(ids) != 1 or _decimal(ids[0]) != job_id or len(keys) != 1:
        raise SignatureError(f"the query's job_id is not the {JOB_ID_HEADER} header's")
    return CheckRequest(job_id, keys[0], attempt)
