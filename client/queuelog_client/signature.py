"""Signatures of push deliveries: how queuelog signs each POST to a push type's endpoint, and
how a receiver checks one (contract section 12).

    Queuelog-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">,
                        v2=<hex HMAC-SHA256 of "<t>.<job id>.<attempt>.<body>">

The HMAC key is the type's secret as UTF-8 bytes; the body is the request's raw bytes, as
received (parse the JSON only after checking); the job id and attempt are the decimal
Queuelog-Job-Id and Queuelog-Attempt headers. v2 binds those headers, on which a receiver
dedupes, to the body: under v1 alone a captured delivery could be replayed with another job
id and be taken for a new job. v1 is still sent for receivers that do not check v2 yet. A
receiver also refuses a `t` too far from its own clock, so that a delivery captured once
cannot be replayed later.
"""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "Queuelog-Signature"
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
