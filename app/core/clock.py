"""The one clock queuelog reads. Times are integers: microseconds since the Unix epoch.

Integers compare, index and round-trip identically on SQLite and PostgreSQL, and cost
nothing to convert on the hot paths; the API renders them as RFC 3339.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Naive, for rendering: isoformat of a naive datetime is strftime's format without an offset,
# several times cheaper (every answer renders up to seven timestamps per job).
_NAIVE_EPOCH = datetime(1970, 1, 1)
MICROS = 1_000_000

# RFC 3339 date-time: a full date, a time with optional fraction, and an explicit offset.
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})\Z"
)


class Clock:
    """Wall-clock time."""

    def now_us(self) -> int:
        return time.time_ns() // 1000

    def on_advance(self, listener: Callable[[], object]) -> bool:
        """Have `listener` called each time this clock is moved by hand, in the thread that
        moves it; False (nothing registered) for a clock that moves on its own, as this
        one does: whoever waits on it must watch it themselves."""
        return False


class ManualClock(Clock):
    """A clock that only moves when told to: lease and backoff tests run without sleeping.

    What waits on time registers with `on_advance`: moving the clock runs what fell due
    before `advance` returns, as the passing of that time would have."""

    def __init__(self, start_us: int | None = None) -> None:
        self._now = time.time_ns() // 1000 if start_us is None else start_us
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], object]] = []

    def now_us(self) -> int:
        with self._lock:
            return self._now

    def on_advance(self, listener: Callable[[], object]) -> bool:
        with self._lock:
            self._listeners.append(listener)
        return True

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += round(seconds * MICROS)
            listeners = list(self._listeners)
        # Outside the lock: a listener reads the clock.
        for listener in listeners:
            listener()


def to_rfc3339(micros: int | None) -> str | None:
    """`2026-11-30T18:15:43.123456Z`: UTC, always six fraction digits."""
    if micros is None:
        return None
    return _rfc3339(micros)


# Every job shown renders five or six times, and a batch's jobs share most of theirs (one
# created_at, one claimed_at): remembered, the text costs a look-up. isoformat gives what
# strftime("%Y-%m-%dT%H:%M:%S.%f") gives, at a third of the cost (and four-digit years
# before 1000, as RFC 3339 wants).
@functools.lru_cache(maxsize=4096)
def _rfc3339(micros: int) -> str:
    return (_NAIVE_EPOCH + timedelta(microseconds=micros)).isoformat(timespec="microseconds") + "Z"


def parse_rfc3339(text: str) -> int:
    """Microseconds since the epoch of an RFC 3339 timestamp with an offset.

    Raises ValueError for anything else (a date alone, a missing offset, a bad field).
    """
    match = _RFC3339.match(text)
    if match is None:
        raise ValueError("not an RFC 3339 date-time with an offset")
    # fromisoformat takes at most 6 fraction digits; RFC 3339 allows more.
    fraction = match.group(1)
    if fraction:
        text = text.replace(fraction, fraction[:7].ljust(7, "0"), 1)
    moment = datetime.fromisoformat(text.replace("z", "Z"))
    return (moment - EPOCH) // timedelta(microseconds=1)
