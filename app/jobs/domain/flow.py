"""What the claim asks of flow control, and the answer it gets: data, never a callback.

A flow-control policy (app/types/flow.py implements `FlowPolicy`; the factory wires it in)
reads the types' settings and what runs, and answers a claim with `ClaimLimits`: the types
it may take now, each type's budget, the concurrency keys at their cap. The job repository
turns that record into conditions of its claim statements (app/jobs/sql/repository.py), and the
claim (app/jobs/usecases/claim.py) hands it back to the policy to settle: so app/jobs needs nothing
of app/types, and a new rule is a new field here and a new condition there.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import Connection

from app.jobs.domain.models import Job

# (type, concurrency_key or None) -> jobs running
RunningCounts = Mapping[tuple[str, str | None], int]


def running_by_type(running: RunningCounts) -> dict[str, int]:
    """The running jobs of each type, whatever their key: the one place they are summed."""
    totals: dict[str, int] = {}
    for (job_type, _key), count in running.items():
        totals[job_type] = totals.get(job_type, 0) + count
    return totals


class LimitReached(Exception):
    """A claim made on limits read without locks no longer fits them under the locks: its
    transaction is rolled back and the claim made again on limits read under the locks."""


@dataclass(frozen=True)
class ClaimLimits:
    """What one claim may take now under flow control.

    `blocked` types are held back by a limit (paused, a cap or a rate: the reason), and
    `excluded` ones are never this kind of claim's (a worker's claim never takes a push
    type); both are left out of the claim altogether, so their backlog costs it nothing.
    Each type in `budgets` may start at most that many jobs; in each type of `key_caps`, a
    concurrency key may run at most its cap, and `key_running` holds what runs now.
    """

    blocked: Mapping[str, str] = field(default_factory=dict)
    excluded: frozenset[str] = frozenset()
    budgets: Mapping[str, int] = field(default_factory=dict)
    key_caps: Mapping[str, int] = field(default_factory=dict)
    key_running: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # The rated types' buckets as read (what settling the claim spends), and when each was
    # last filled: never earlier than a claim before this one had it (a claim that read the
    # clock, then waited for the row's lock, must not be credited again with time its
    # predecessor was already credited with).
    tokens: Mapping[str, float] = field(default_factory=dict)
    bucket_at: Mapping[str, int] = field(default_factory=dict)
    # The dispatcher's claim: only these types (the push types) may be taken. None: a
    # worker's claim.
    only: frozenset[str] | None = None
    # Fair types (docs/FLOW-CONTROL.md): their candidates are read in round order.
    fair: frozenset[str] = frozenset()

    def allowed(self, wanted: Collection[str]) -> frozenset[str]:
        """Of the `wanted` types, those this claim may read."""
        allowed = frozenset(wanted)
        if self.only is not None:
            allowed &= self.only
        return allowed - frozenset(self.blocked) - self.excluded

    def full_keys(self, job_type: str) -> list[str]:
        """The concurrency keys of `job_type` at their cap now."""
        cap = self.key_caps.get(job_type)
        if cap is None:
            return []
        return sorted(key for key, n in self.key_running.get(job_type, {}).items() if n >= cap)

    def restricts(self, limit: int) -> bool:
        """False when a claim of up to `limit` jobs in plain claim order cannot break any
        limit: nothing blocked or excluded, every budget at least `limit`, and no key at its
        cap (nor, for a claim of several, any key cap, since one claim may meet a key
        twice). The claim then runs as it would without flow control, which keeps limits
        that are not reached cheap. The dispatcher's claim is always restricted: to the push
        types."""
        if (self.only is not None or self.blocked or self.excluded or self.fair
                or any(budget < limit for budget in self.budgets.values())):
            return True
        if limit > 1:
            return bool(self.key_caps)
        return any(self.full_keys(job_type) for job_type in self.key_caps)

    def budget(self, job_type: str, limit: int) -> int:
        return min(limit, self.budgets.get(job_type, limit))

    def pick(self, job_type: str, candidates: Iterable[Any], limit: int) -> list[Any]:
        """The candidates of one type (rows with `concurrency_key`, in claim order) that the
        claim may take: at most its budget, and no key beyond its cap."""
        budget = self.budget(job_type, limit)
        cap = self.key_caps.get(job_type)
        running = dict(self.key_running.get(job_type, {}))
        chosen: list[Any] = []
        for row in candidates:
            if len(chosen) >= budget:
                break
            key = row.concurrency_key if cap is not None else None
            if cap is not None and key is not None:
                if running.get(key, 0) >= cap:
                    continue
                running[key] = running.get(key, 0) + 1
            chosen.append(row)
        return chosen

    def admits(self, claimed: Iterable[Any]) -> bool:
        """True when these claimed jobs (rows with `type` and `concurrency_key`, in claim
        order) fit: none of a blocked or excluded type, and each type's within its budget
        and its key caps."""
        by_type: dict[str, list[Any]] = {}
        for job in claimed:
            by_type.setdefault(job.type, []).append(job)
        return all(job_type not in self.blocked and job_type not in self.excluded
                   and len(self.pick(job_type, of_type, len(of_type))) == len(of_type)
                   for job_type, of_type in by_type.items())


class FlowPolicy(Protocol):
    """Flow control as the claim sees it. Every method but `claimed` runs in the claim's
    write transaction, on its connection."""

    def limits(self, conn: Connection, wanted: frozenset[str] | None, now_us: int, *,
               lock: bool, push: bool) -> ClaimLimits | None:
        """The limits of a claim of `wanted` types (None: any), or None when no limit
        concerns it (the claim then runs exactly as without flow control). With `lock`, read
        under the types' row locks where writers run concurrently: final. Without, on such
        an engine, a guess that `settle` checks."""

    def settle(self, conn: Connection, limits: ClaimLimits, claimed: list[Job], now_us: int,
               *, check: bool) -> bool:
        """Pay for the claimed jobs (the rate tokens). With `check`, where writers run
        concurrently, first lock the claimed types' rows and check the claim against the
        limits as they are now: LimitReached when it no longer fits. True when it locked
        rows (and so may have waited for them)."""

    def claimed(self, limits: ClaimLimits | None, claimed: list[Job], now_us: int) -> None:
        """After the claim committed: what only metrics and GET /types' last claim need."""

    def may_limit(self, wanted: frozenset[str] | None) -> bool:
        """Whether flow control may hold back a claim of `wanted` types (None: any), as far
        as this process knows without a statement (a cap, a rate, a pause, an ordered key:
        what frees a job for it is no job becoming claimable): True when it cannot tell."""

    def aging(self) -> Mapping[str, int]:
        """The types whose jobs age (app/jobs/domain/aging.py), with their interval in µs,
        as far as this process knows without a statement (a setting changed on another host
        shows within a second)."""

    def put_under_control_since(self, wanted: frozenset[str] | None) -> bool:
        """After a claim that read no type's row found nothing (outside its transaction):
        read the types' settings again; True when one of `wanted` (None: any) turns out to be
        under flow control now, which that claim's own statement passed over."""


class RetryPolicy(Protocol):
    """When a failed attempt's retry runs: its backoff, or later under its type's retry budget
    (app/types/protection/retry_budget.py implements it; the factory wires it in)."""

    def may_hold_back(self, job_type: str) -> bool:
        """Whether the type may have a retry budget (no statement: this process's copy of
        the settings, or True when it has none fresh)."""
        ...

    def retry_at(self, conn: Connection, job_type: str, backoff_at: int, now_us: int) -> int:
        """When the retry runs, in the failing transaction: `backoff_at`, or the slot the
        type's budget gives it."""
        ...


class NoRetryBudget:
    """Every retry runs at its backoff."""

    def may_hold_back(self, job_type: str) -> bool:
        return False

    def retry_at(self, conn: Connection, job_type: str, backoff_at: int, now_us: int) -> int:
        return backoff_at
