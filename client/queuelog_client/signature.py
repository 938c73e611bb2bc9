"""Signatures of push deliveries: how queuelog signs each POST to a push type's endpoint, and
how a receiver checks one (contract section 12).

    Queuelog-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">

The HMAC key is the type's secret as UTF-8 bytes; the body is the request's raw bytes, as
received (parse the JSON only after checking). A receiver also refuses a `t` too far from
its own clock, so that a delivery captured once cannot be replayed later.
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
    """The hex HMAC-SHA256 of "<timestamp>.<body>" under the secret's UTF-8 bytes."""
    message = str(timestamp).encode("ascii") + b"." + body
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def signature_header(secret: str, timestamp: int, body: bytes) -> str:
    """The Queuelog-Signature header's value for `body` sent at `timestamp`."""
    return f"t={timestamp},v1={compute_signature(secret, timestamp, body)}"


def _parse(header: str | None) -> tuple[int, list[str]]:
    if not header:
        raise SignatureError(f"no {SIGNATURE_HEADER} header")
    timestamp: int | None = None
    signatures: list[str] = []
    for part in header.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep:
            raise SignatureError(f"malformed {SIGNATURE_HEADER} header: {part.strip()!r}")
        if name == "t":
            if not value.isascii() or not value.isdigit() or timestamp is not None:
                raise SignatureError(f"malformed {SIGNATURE_HEADER} header: bad or repeated t")
            timestamp = int(value)
        elif name == "v1":
            signatures.append(value)
        # Other schemes (v2=…) are skipped: a receiver keeps working when one is added.
    if timestamp is None or not signatures:
        raise SignatureError(f"malformed {SIGNATURE_HEADER} header: needs t= and v1=")
    return timestamp, signatures


def verify_signature(secret: str, header: str | None, body: bytes, tolerance: int = 300, *,
                     now: float | None = None) -> bool:
    """True when `header` (the Queuelog-Signature value) signs `body` under `secret` with a
    timestamp within `tolerance` seconds of now; False for a wrong signature or a stale (or
    future) timestamp. Raises SignatureError when the header is missing or malformed: that is
    a client that does not speak the protocol, not a forgery to count.

    The comparison runs in constant time. Pass the raw request body (bytes), not re-encoded
    JSON: any change of a byte changes the signature.
    """
    if not isinstance(body, (bytes, bytearray)):
        raise TypeError("body must be the raw request bytes (request.get_data()), not text")
    timestamp, signatures = _parse(header)
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        return False
    expected = compute_signature(secret, timestamp, body)
    # Every candidate is compared (no early exit), each in constant time.
    matched = False
    for candidate in signatures:
        # compare_digest takes ASCII text alone; anything else matches nothing anyway.
        if candidate.isascii():
            matched |= hmac.compare_digest(expected, candidate.lower())
    return matched
