"""Where a claimable job stands in line (docs/JOBS.md, "Position and estimate"): how many
claimable jobs of its type a claim takes before it, and about when it starts.

The position counts the type's due pending jobs ahead in the order its claims take them:
claim order (priority, then age, then id) through the type's claim-order index (for a type
that ages, the aged order: app/jobs/domain/aging.py, one range of that index per level), or,
for a fair type, round order through its fair-order index; exactly up to POSITION_LIMIT, a lower
bound beyond (`capped`). Jobs waiting for their dependencies or for an ordered key's turn
are not claimable and not counted. Limits do not reorder a type's jobs, so they change the
estimate, not the position.

The estimate is the jobs ahead at the type's claim rate over the last ESTIMATE_WINDOW_US
(the per-minute stats: the last minutes and the current one so far), no faster than its
rate limit: null when nothing of the type was claimed in that window, while the type is
paused, and while its circuit is open (when it closes is not known in advance)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection

from app.core.clock import MICROS
from app.core.statuses import JobStatus
from app.jobs.domain import aging
from app.jobs.domain.models import Job
from app.jobs.sql.key_repository import KeyRepository
from app.jobs.sql.repository import JobRepository
from app.jobs.timeline.stats_repository import MINUTE_US, StatsRepository, minute_of
from app.types.models import TypeSettings
from app.types.protection.circuit import OPEN

POSITION_LIMIT = 10_000
ESTIMATE_WINDOW_US = 5 * MINUTE_US


@dataclass(frozen=True)
class Aged:
    """Where a job of a type that ages stands (app/jobs/domain/aging.py)."""

    priority_now: int  # the priority claims take it at now
    next_rise_at: int | None  # when it next rises a level (None: at the top, or critical)


@dataclass(frozen=True)
class Place:
    position: int | None  # None: not known (a fair type's job not yet given its round)
    capped: bool  # the count stopped at POSITION_LIMIT: at least `position`
    estimated_start_seconds: float | None
    aged: Aged | None = None  # None: its type does not age


def estimate_seconds(position: int, claimed: int, window_seconds: float,
                     settings: TypeSettings | None) -> float | None:
    """Seconds until `position` jobs ahead are claimed at the observed rate (`claimed` over
    `window_seconds`), capped by the type's rate limit; None when it cannot be known."""
    if settings is not None and (settings.paused or settings.circuit_state == OPEN):
        return None
    if claimed <= 0 or window_seconds <= 0:
        return None
    rate = claimed / window_seconds
    if settings is not None and settings.rate_per_second is not None:
        rate = min(rate, settings.rate_per_second)
    return round(position / rate, 3)


def aging_interval_us(settings: TypeSettings | None) -> int | None:
    """The type's aging interval in µs (None: its jobs do not age; a fair type's never do)."""
    if settings is None or settings.aging_seconds is None or settings.is_fair:
        return None
    return settings.aging_seconds * MICROS


def place_in_line(conn: Connection, job: Job, now_us: int,
                  settings: TypeSettings | None) -> Place | None:
    """The job's place (None for a job that is not pending and due)."""
    if job.status != JobStatus.PENDING or job.run_at > now_us:
        return None
    position: int | None
    aging_us = aging_interval_us(settings)
    if settings is not None and settings.is_fair:
        if job.fair_round is None:
            position, capped = None, False
        else:
            ahead, capped = KeyRepository(conn).keys_ahead(
                job.type, job.priority, job.fair_round, job.created_at, job.id, now_us,
                POSITION_LIMIT)
            position = len(ahead)
    else:
        counted = JobRepository(conn).count_claimable_ahead(job, now_us, same_type=True,
                                                            cap=POSITION_LIMIT,
                                                            aging_us=aging_us)
        position, capped = counted.value, counted.capped
    since = minute_of(now_us) - ESTIMATE_WINDOW_US + MINUTE_US
    claimed = sum(counts[1] for counts in StatsRepository(conn).counts_by_minute(
        job.type, since, now_us + 1).values())
    estimate = (None if position is None else
                estimate_seconds(position, claimed, (now_us - since) / MICROS, settings))
    aged = None
    if aging_us is not None:
        priority_now, _at = aging.reached(job.priority, job.created_at, aging_us, now_us)
        aged = Aged(priority_now,
                    aging.next_rise_at(job.priority, job.created_at, aging_us, now_us))
    return Place(position, capped, estimate, aged)
