"""The aged claim order in SQL (app/jobs/domain/aging.py): the candidates a claim reads for
the types that age, and the order it takes them in.

A type that ages is read one priority level at a time, each level a range of the claim-order
index in (created_at, id) order, which within a level is the aged order itself. The claim of
any type reads its usual candidates (in the claim order, where an aging type's jobs stand at
their own level) beside those ranges, and takes the best of them all in the aged order, so
that a job of any type is taken only when no job ahead of it in the aged order is left: a job
ahead of it in its own range, or in the usual claim order, is ahead of it in the aged order
too (aging only raises a job). The types and their intervals are bind parameters, so one
statement is compiled per number of aging types.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from sqlalchemy import (
    BigInteger,
    and_,
    bindparam,
    case,
    func,
    literal_column,
    or_,
    select,
    union,
    union_all,
)

from app.core.priorities import Priority
from app.jobs.domain.aging import AGING_LEVELS, level_index
from app.jobs.sql.job_rows import CLAIMABLE_ROW, claim_limit
from app.storage.schema import jobs

# What a candidate of the aged order carries: enough to place it.
CANDIDATE_COLUMNS = (jobs.c.id, jobs.c.type, jobs.c.priority, jobs.c.created_at)


def aging_params(aging_us: Mapping[str, int]) -> dict[str, Any]:
    """The bind parameters of the aging types (sorted, so that a statement's parameters
    follow its parts)."""
    params: dict[str, Any] = {}
    for i, (job_type, interval) in enumerate(sorted(aging_us.items())):
        params[f"aging_type_{i}"] = job_type
        params[f"aging_us_{i}"] = interval
    return params


def level_ranges(due: tuple[Any, ...], job_type: Any, one: bool) -> list[Any]:
    """One type's candidates, a range of the claim-order index per aging level, each at most
    claim_limit(one) long and locked (SKIP LOCKED on PostgreSQL), as subqueries."""
    return [
        select(*CANDIDATE_COLUMNS)
        .where(*due, jobs.c.type == job_type, jobs.c.priority == literal_column(str(level)))
        .order_by(jobs.c.created_at, jobs.c.id)
        .limit(claim_limit(one))
        .with_for_update(skip_locked=True)
        .subquery()
        for level in AGING_LEVELS
    ]


def aged_order(candidates: Any, aging_types: int) -> tuple[Any, ...]:
    """ORDER BY of `candidates` (a subquery with CANDIDATE_COLUMNS' names) in the aged order
    at :now, for the `aging_types` types bound by aging_params."""
    c = candidates.c
    interval = case(*((c.type == bindparam(f"aging_type_{i}"),
                       bindparam(f"aging_us_{i}", type_=BigInteger))
                      for i in range(aging_types)), else_=None)
    index = case(*((c.priority == level, literal_column(str(i)))
                   for i, level in enumerate(AGING_LEVELS)), else_=None)
    ages = and_(interval.is_not(None), index.is_not(None))
    virtual = c.created_at - index * interval
    risen = (bindparam("now", type_=BigInteger) - virtual) // interval
    top = len(AGING_LEVELS) - 1
    level = case((risen >= top, top), (risen <= index, index), else_=risen)
    priority = case((~ages, c.priority),
                    *((level == i, literal_column(str(lvl)))
                      for i, lvl in enumerate(AGING_LEVELS)), else_=c.priority)
    reached_at = case((~ages, c.created_at), else_=virtual + level * interval)
    return priority.desc(), reached_at, c.id


@functools.cache
def aged_any_type_candidates(usual: Any, due: tuple[Any, ...], aging_types: int,
                             one: bool) -> Any:
    """The candidates of a claim of any type with `aging_types` aging types: `usual` (the
    claim's own candidates, a Select of CANDIDATE_COLUMNS with its LIMIT) beside each aging
    type's level ranges, the first :limit of them in the aged order, as a CTE."""
    parts = [usual.subquery()]
    for i in range(aging_types):
        parts += level_ranges(due, bindparam(f"aging_type_{i}"), one)
    # UNION, not UNION ALL: an aging type's job may be both among the usual candidates and
    # in its level's range, and must take one place of the limit only.
    every = union(*(select(part) for part in parts)).subquery()
    chosen = (select(every.c.id).order_by(*aged_order(every, aging_types))
              .limit(claim_limit(one)))
    # MATERIALIZED as the usual candidates are (claim_repository.py says why).
    return chosen.cte("candidates").prefix_with("MATERIALIZED")


def _count_ahead_of_type_aged() -> Any:
    """How many of one aging type's pending jobs come before a job in the aged order: within
    a type that order is the virtual time's (aging.py), so per aging level the jobs ahead
    are a range of the type's claim-order index, up to the created_at that level's virtual
    time would equal the job's (:created_<level>, ids below :job_id at it); critical jobs are
    all ahead. Each range and the whole read no more than :cap_plus_one pending rows, as
    read_repository's count of the claim order does."""
    ranges: list[tuple[Any, ...]] = [
        (jobs.c.priority == literal_column(str(Priority.CRITICAL)),)]
    for level in AGING_LEVELS:
        bound = bindparam(f"created_{level}", type_=BigInteger)
        ranges.append((jobs.c.priority == literal_column(str(level)),
                       or_(jobs.c.created_at < bound,
                           and_(jobs.c.created_at == bound, jobs.c.id < bindparam("job_id")))))
    branches = []
    for conditions in ranges:
        stmt = select(jobs.c.run_at).where(CLAIMABLE_ROW, jobs.c.type == bindparam("type"),
                                           *conditions)
        branches.append(select(stmt.limit(bindparam("cap_plus_one")).subquery().c.run_at))
    examined = union_all(*branches).limit(bindparam("cap_plus_one")).subquery()
    return select(func.count(),
                  func.coalesce(func.sum(case((examined.c.run_at <= bindparam("now"), 1),
                                              else_=0)), 0))


AHEAD_OF_TYPE_AGED = _count_ahead_of_type_aged()


def ahead_aged_params(priority: int, created_at: int, aging_us: int) -> dict[str, int]:
    """The per-level bounds of AHEAD_OF_TYPE_AGED for a job that is not critical: a job of
    level index i created at c has the job's virtual time when c = virtual + i * interval."""
    index = level_index(priority)
    assert index is not None
    virtual = created_at - index * aging_us
    return {f"created_{level}": virtual + i * aging_us for i, level in enumerate(AGING_LEVELS)}
