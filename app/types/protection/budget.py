"""A type's retry budget, as rules over numbers (docs/FLOW-CONTROL.md, "Retry budget").

Retries of the type (failed attempts sent back to pending) may run at most `ratio` times the
first attempts started in the window, plus `minimum`, per window. A retry beyond it is never
dropped: its run_at is pushed to when the budget has room. The budget spaces its retries
`window / allowed` apart, so that no window of its length holds more than `allowed`, and the
type's row keeps one number, the earliest the next retry may run (job_types.retry_budget_at).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from app.core.clock import MICROS


@dataclass(frozen=True)
class RetryBudgetSettings:
    """PATCH /types's "retry_budget" (bounds: app/core/limits.py, RETRY_BUDGET_…)."""

    ratio: float
    window_seconds: int
    minimum: int

    @classmethod
    def parse(cls, stored: str | None) -> RetryBudgetSettings | None:
        return None if stored is None else cls(**json.loads(stored))

    def stored(self) -> str:
        return json.dumps(self.shown(), separators=(",", ":"), sort_keys=True)

    def shown(self) -> dict[str, Any]:
        return {"ratio": self.ratio, "window_seconds": self.window_seconds,
                "minimum": self.minimum}

    @property
    def window_us(self) -> int:
        return self.window_seconds * MICROS

    def allowed(self, first_attempts: int) -> int:
        """Retries per window, the window's first attempts being `first_attempts`."""
        return math.floor(self.ratio * first_attempts + self.minimum)


@dataclass(frozen=True)
class Slot:
    """Where the budget puts a retry: when it runs, and the schedule after it."""

    run_at: int
    next_at: int | None


def slot(settings: RetryBudgetSettings, first_attempts: int, scheduled_at: int | None,
         backoff_at: int, now_us: int) -> Slot:
    """The retry's run_at, given its own backoff (`backoff_at`) and the schedule as stored
    (`scheduled_at`: the earliest a retry may run next; None: none yet).

    The budget's retries run at least `window / allowed` apart, so that any window holds at
    most `allowed` of them: a retry runs at its backoff when the schedule has come that far,
    else at the schedule's next slot. A retry whose backoff is over a window away runs at its
    backoff and leaves the schedule as it was (its backoff spaces it already; taking a slot
    so far ahead would hold back every retry due before it)."""
    allowed = max(1, settings.allowed(first_attempts))
    interval = -(-settings.window_us // allowed)  # rounded up: `allowed` a window at most
    if backoff_at > now_us + settings.window_us:
        return Slot(backoff_at, scheduled_at)
    run_at = backoff_at if scheduled_at is None else max(backoff_at, scheduled_at)
    return Slot(run_at, run_at + interval)
