"""A type's circuit breaker, as rules over numbers (docs/FLOW-CONTROL.md, "Circuit breaker").

A circuit is closed (its type's claims run as its other settings let them), open (none runs,
but after each cooldown one probe) or half-open (its claims run in waves that double each
cooldown: 1, 2, 4, … at once). The breaker acts on claims through a cap on the type's
running jobs (`cap`), which flow control enforces like max_running, across processes and
hosts; the moves between states (`after_window`, `after_end`, `closes_at`) are made by
app/types/protection/tallies.py, one conditional UPDATE each.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from app.core.clock import MICROS

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"


@dataclass(frozen=True)
class CircuitSettings:
    """PATCH /types's "circuit" (bounds: app/core/limits.py, CIRCUIT_…)."""

    failure_ratio: float
    min_attempts: int
    window_seconds: int
    cooldown_seconds: int

    @classmethod
    def parse(cls, stored: str | None) -> CircuitSettings | None:
        """From job_types.circuit (None: no breaker)."""
        return None if stored is None else cls(**json.loads(stored))

    def stored(self) -> str:
        return json.dumps(self.shown(), separators=(",", ":"), sort_keys=True)

    def shown(self) -> dict[str, Any]:
        return {"failure_ratio": self.failure_ratio, "min_attempts": self.min_attempts,
                "window_seconds": self.window_seconds,
                "cooldown_seconds": self.cooldown_seconds}

    @property
    def cooldown_us(self) -> int:
        return self.cooldown_seconds * MICROS

    def trips(self, finished: int, failed: int) -> bool:
        """The window's attempts open the circuit: at least min_attempts ended, and the failed
        share reached the ratio."""
        return finished >= self.min_attempts and failed >= self.failure_ratio * finished

    def wave(self, half_open_since: int, now_us: int) -> int:
        """How many of the type's jobs may run at once `now_us` in a circuit half-open since
        `half_open_since`: 1 at first, doubling each cooldown."""
        doublings = max(0, now_us - half_open_since) // self.cooldown_us
        return int(2 ** min(doublings, 62))

    def closes_at(self, half_open_since: int) -> int:
        """When a half-open circuit with no failure closes: once its wave reaches
        min_attempts (a full window's sample then runs beside the ratio again)."""
        doublings = math.ceil(math.log2(self.min_attempts)) if self.min_attempts > 1 else 0
        return half_open_since + doublings * self.cooldown_us


def cap(settings: CircuitSettings | None, state: str | None, since: int | None,
        now_us: int) -> int | None:
    """The most jobs of the type the circuit lets run at `now_us` (None: no cap).

    Open: none until the cooldown has passed since it opened (or since its last probe
    failed), then one, the probe. Half-open: the wave. A half-open circuit whose wave has
    reached min_attempts caps nothing, though its row may not say closed yet."""
    if settings is None or state is None or since is None:
        return None
    if state == OPEN:
        return 1 if now_us >= since + settings.cooldown_us else 0
    if now_us >= settings.closes_at(since):
        return None
    return settings.wave(since, now_us)


@dataclass(frozen=True)
class Move:
    """A change of a circuit's state: to `state` (None: closed), from `current` as read at
    `since` (the conditional UPDATE's guard)."""

    state: str | None
    current: str | None
    since: int | None
    why: str


def after_end(settings: CircuitSettings, state: str | None, since: int | None,
              completed: int, failed: int, now_us: int) -> Move | None:
    """What attempts of the type that ended at about `now_us` do to a tripped circuit.

    Open: once its cooldown has passed (so a probe may have run), a failure starts the
    cooldown again, else a completion half-opens it; before, what ends is what ran before it
    opened, and changes nothing. Half-open: a failure opens it again."""
    if state is None or since is None:
        return None
    if state == OPEN:
        if now_us < since + settings.cooldown_us:
            return None
        if failed:
            return Move(OPEN, OPEN, since, "the probe failed")
        if completed:
            return Move(HALF_OPEN, OPEN, since, "the probe completed")
        return None
    if failed:
        return Move(OPEN, HALF_OPEN, since, f"{failed} attempt(s) failed while half-open")
    return None


def shown_state(state: str | None) -> str:
    return CLOSED if state is None else state
