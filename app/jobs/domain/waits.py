"""Waits, as values (docs/WAITS.md): what a suspended job waits for, how a wait ends, and the
waitpoint tokens that end one. Free of HTTP and SQL."""

from __future__ import annotations

import enum
import hashlib
import json
import secrets
from dataclasses import dataclass
from typing import Any

from app.core.clock import MICROS, to_rfc3339


class WaitKind(enum.StrEnum):
    TIME = "time"  # a durable sleep, to a moment
    EVENT = "event"  # an event of the job's producer, by name and key
    TOKEN = "token"  # noqa: S105 (a kind of wait, not a secret): a waitpoint token's completion


class ResumedBy(enum.StrEnum):
    TIME = "time"
    EVENT = "event"
    TOKEN = "token"  # noqa: S105 (how a wait ended, not a secret)
    TIMEOUT = "timeout"
    # Not a resume: the job was cancelled while it waited (the wait's end, as stored).
    CANCEL = "cancel"


@dataclass(frozen=True, slots=True)
class Wait:
    """One suspend's wait: a moment (`until_us`, for a sleep), or an event (`event`, `key`) or
    a token, each with its `timeout_seconds`."""

    kind: WaitKind
    until_us: int | None = None
    event: str | None = None
    key: str = ""
    timeout_seconds: int | None = None

    def wake_at(self, now_us: int) -> int:
        """When maintenance resumes the job unless something else does first: the sleep's
        moment, or the wait's timeout."""
        if self.kind is WaitKind.TIME:
            assert self.until_us is not None
            return self.until_us
        assert self.timeout_seconds is not None
        return now_us + self.timeout_seconds * MICROS


def waiting_for(kind: str, until_us: int, event: str | None, key: str | None) -> dict[str, Any]:
    """What a suspended job waits for, as the API shows it."""
    shown: dict[str, Any] = {"kind": kind, "until": to_rfc3339(until_us)}
    if kind == WaitKind.EVENT:
        shown |= {"event": event, "key": key or ""}
    return shown


def resumed_text(by: ResumedBy, data: str | None, at_us: int) -> str:
    """How a wait ended, as the row keeps it (compact JSON): by what, the event's or the
    token's data (compact JSON text, or None), and when."""
    return json.dumps({"by": by.value, "data": None if data is None else json.loads(data),
                       "at": to_rfc3339(at_us)}, separators=(",", ":"), ensure_ascii=False)


def new_token() -> str:
    """A waitpoint token: 256 random bits, URL-safe. Shown once; only its hash is stored."""
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """What is stored of a token, and looked up by: its SHA-256, in hex. The look-up is by
    the hash, so how long it takes says nothing of how much of a guess was right."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
