"""The buckets GET /stats answers and the dashboard draws."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from app.core.clock import MICROS


class Step(enum.StrEnum):
    """A bucket's width."""

    MINUTE = "minute"
    HOUR = "hour"

    @property
    def micros(self) -> int:
        return (60 if self is Step.MINUTE else 3600) * MICROS


@dataclass(frozen=True, slots=True)
class Bucket:
    """One step of time from `at_us` (its first microsecond): the jobs enqueued, the attempts
    started (claimed), the jobs completed and the attempts that failed in it, and the pending
    jobs at its end (None: no count was taken by then, or none since the last before it)."""

    at_us: int
    enqueued: int
    claimed: int
    completed: int
    failed: int
    pending: int | None


@dataclass(frozen=True, slots=True)
class Series:
    """A type's buckets (every type's, summed, when `job_type` is None), oldest first, the
    empty ones included."""

    job_type: str | None
    step: Step
    buckets: list[Bucket]
