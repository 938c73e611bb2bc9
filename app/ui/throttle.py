"""Throttling of failed dashboard sign-ins: past a number of failures in a fixed window, from
one client address or from all of them together, a sign-in is answered 429 with Retry-After
until the window ends, without its token being looked at. The counts live in the database,
so every gunicorn process and every host share them.

Fixed windows, not an exponential delay: a delay holds a request thread per guess (a flood
would hold them all), while a refusal costs one indexed read. Only failures count, and a
refused attempt is not one, so an admin locked out by someone else's guesses gets back in when
the window ends. Requests racing past the check at once may each add a failure beyond the
limit: the overshoot is bounded by the requests in flight, not by the guesses."""

from __future__ import annotations

import math
from typing import Any

from flask import current_app

from app.core.clock import MICROS
from app.ui.repository import SignInFailureRepository

WINDOW_SECONDS = 60
FAILURES_PER_ADDRESS = 10
# Well above what the admins of one deployment get wrong in a minute, far below a guesser's
# rate; spread over many addresses a flood still stops here.
FAILURES_OVERALL = 100
_OVERALL = "*"


def _scopes(address: str) -> list[str]:
    return [f"address:{address}"[:100], _OVERALL]


def _window(now_us: int) -> tuple[int, int]:
    size = WINDOW_SECONDS * MICROS
    return now_us - now_us % size, size


def _services() -> Any:
    return current_app.extensions["queuelog"]


def retry_after(address: str) -> int | None:
    """Seconds until sign-ins from this address may be tried again; None when they may be
    now."""
    services = _services()
    now = services.clock.now_us()
    start, size = _window(now)
    with services.db.read() as conn:
        counts = SignInFailureRepository(conn).failures(_scopes(address), start)
    per_address = counts.get(_scopes(address)[0], 0)
    if per_address < FAILURES_PER_ADDRESS and counts.get(_OVERALL, 0) < FAILURES_OVERALL:
        return None
    wait: int = max(1, math.ceil((start + size - now) / MICROS))
    return wait


def count_failure(address: str) -> None:
    services = _services()
    start, _ = _window(services.clock.now_us())
    services.db.run_write(
        lambda conn: SignInFailureRepository(conn).count_failure(_scopes(address), start))
