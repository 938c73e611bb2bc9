"""Priority aging (docs/FLOW-CONTROL.md, "Priority aging"): a pending job of a type with
`aging_seconds` is claimed as if its priority rose one level per interval since it was
enqueued, through low, medium and high, never to critical.

The order is a static one per job: a job of level index i (low 0, medium 1, high 2) created
at c has the virtual time c - i * interval, and among the jobs of its type the earlier virtual
time goes first. At a claim's moment `now` the level it has reached is
min(2, (now - virtual) // interval), never below its own, and it reached it at
virtual + level * interval. Across types, the claim takes the highest level reached first,
then the job that reached it first, then the lower id: for a job that does not age (another
type's, or a critical one) the level is its own and it reached it when it was enqueued, which
is exactly today's claim order.

So within a type and a level the aged order is the claim-order index's own (created_at, id),
and a claim reads each aging type's levels from that index, one range each (app/jobs/sql/
aging_claims.py): nothing is stored per job, and a change of the setting applies at once to
the jobs already pending.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.core.priorities import Priority

# The levels a job ages through, lowest first; a critical job neither ages nor is reached.
AGING_LEVELS: tuple[int, ...] = (Priority.LOW, Priority.MEDIUM, Priority.HIGH)
_TOP = len(AGING_LEVELS) - 1


def level_index(priority: int) -> int | None:
    """The job's place among AGING_LEVELS (None: it does not age: critical)."""
    try:
        return AGING_LEVELS.index(priority)
    except ValueError:
        return None


def reached(priority: int, created_at: int, aging_us: int | None,
            now_us: int) -> tuple[int, int]:
    """(the priority the job is claimed at `now_us`, the moment it reached it)."""
    index = level_index(priority)
    if aging_us is None or index is None:
        return priority, created_at
    virtual = created_at - index * aging_us
    level = max(index, min(_TOP, (now_us - virtual) // aging_us))
    return AGING_LEVELS[level], virtual + level * aging_us


def next_rise_at(priority: int, created_at: int, aging_us: int | None,
                 now_us: int) -> int | None:
    """When the job next rises a level (None: it does not age, or has reached the top)."""
    index = level_index(priority)
    if aging_us is None or index is None:
        return None
    now_priority, at = reached(priority, created_at, aging_us, now_us)
    if now_priority == AGING_LEVELS[_TOP]:
        return None
    return at + aging_us


def order_key(priority: int, created_at: int, job_id: int, aging_us: int | None,
              now_us: int) -> tuple[int, int, int]:
    """The sort key of a job of a type aging by `aging_us` (None: it does not) in the aged
    claim order at `now_us`; the claim order itself for a type that does not age."""
    reached_priority, at = reached(priority, created_at, aging_us, now_us)
    return -reached_priority, at, job_id


def claim_key(job: Any, aging_us: Mapping[str, int], now_us: int) -> tuple[int, int, int]:
    """order_key of a job (anything with type, priority, created_at and id), the aging
    types given by name."""
    return order_key(job.priority, job.created_at, job.id, aging_us.get(job.type), now_us)
