"""Flow control: the job types' settings and what runs, turned into the limits of a claim.

`FlowControl` is the claim's FlowPolicy (app/jobs/domain/flow.py). It answers each claim with
ClaimLimits, which `limits_for_claim` computes from the types' settings: the types to pass
over, how many jobs of each limited type the claim may start, the concurrency keys that are
full. Where writers are serialised (SQLite's BEGIN IMMEDIATE) that read is final. Where
they run concurrently (PostgreSQL) a claim reads its limits without locks, and `settle`
checks the claimed jobs under the claimed types' row locks just before the commit; when a
limit was reached meanwhile the claim is rolled back and made again on limits read under
the locks, which cannot miss.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from sqlalchemy import Connection

from app.core.clock import MICROS, Clock
from app.jobs.domain.flow import ClaimLimits, LimitReached, RunningCounts, running_by_type
from app.jobs.domain.models import Job
from app.jobs.sql.repository import JobRepository
from app.storage.dialects import writers_serialised
from app.storage.engine import Database
from app.types.models import SkipReason, TypeSettings, whole_tokens
from app.types.repository import TypeRepository
from app.types.settings_copy import TypeSettingsCopy

# Told of each claim that passed over due work of a type (or of a key) held back by its
# limit: (type, reason). Metrics count them.
SkipSink = Callable[[str, str], None]


def _ignore_skip(_type: str, _reason: str) -> None:
    pass


# A cap that the last check of a claim in this process found at most this share used, no more
# than this long ago, lets the next claims of the type choose their jobs without counting
# what runs (their check under the lock counts). Nearer its cap, every claim counts first, so
# that it chooses the jobs that fit rather than be rolled back and made again.
FAR_SHARE = 0.5
FAR_FOR_SECONDS = 1.0

# last_claim_at is written at most this often per type and process: a write per claim would
# make every claim of a type queue on its one row, which is what flow control must not cost.
LAST_CLAIM_RESOLUTION_US = MICROS


def limits_for_claim(settings: Iterable[TypeSettings], running: RunningCounts, now_us: int,
                     *, push: bool = False) -> ClaimLimits:
    """The limits of a worker's claim, or of the dispatcher's (`push`): each takes only its
    own kind of type, under the same limits. This is the one place that decides who claims
    a push type."""
    settings = list(settings)
    pushed = frozenset(s.type for s in settings if s.is_push)
    of_type = running_by_type(running)
    blocked: dict[str, str] = {}
    budgets: dict[str, int] = {}
    key_caps: dict[str, int] = {}
    key_running: dict[str, dict[str, int]] = {}
    tokens_now: dict[str, float] = {}
    bucket_at: dict[str, int] = {}
    fair = frozenset(s.type for s in settings if s.is_fair and s.is_push == push)
    for s in settings:
        if s.is_push != push:
            continue
        if s.paused:
            blocked[s.type] = SkipReason.PAUSED
            continue
        budget = math.inf
        reason = ""
        if s.max_running is not None:
            budget = max(0, s.max_running - of_type.get(s.type, 0))
            reason = SkipReason.MAX_RUNNING
        circuit_cap = s.circuit_cap(now_us)
        if circuit_cap is not None and circuit_cap - of_type.get(s.type, 0) < budget:
            budget = max(0, circuit_cap - of_type.get(s.type, 0))
            reason = SkipReason.CIRCUIT
        if s.rate_per_second is not None:
            tokens_now[s.type] = s.tokens_available(now_us)
            bucket_at[s.type] = s.bucket_at(now_us)
            tokens = whole_tokens(tokens_now[s.type])
            if tokens < budget:
                budget, reason = max(0, tokens), SkipReason.RATE
        if budget <= 0:
            blocked[s.type] = reason
            continue
        if budget != math.inf:
            budgets[s.type] = int(budget)
        if s.max_running_per_key is not None:
            key_caps[s.type] = s.max_running_per_key
            key_running[s.type] = {key: n for (t, key), n in running.items()
                                   if t == s.type and key is not None}
    return ClaimLimits(blocked, frozenset() if push else pushed, budgets, key_caps,
                       key_running, tokens_now, bucket_at, only=pushed if push else None,
                       fair=fair - frozenset(blocked))


def buckets_after(limits: ClaimLimits,
                  claimed_types: Iterable[str]) -> dict[str, tuple[float, int]]:
    """(tokens, as of when) of each rated type's bucket once the claimed jobs (one type per
    job) are paid for; only the types that claimed something."""
    spent: dict[str, int] = {}
    for job_type in claimed_types:
        if job_type in limits.tokens:
            spent[job_type] = spent.get(job_type, 0) + 1
    return {t: (max(0.0, limits.tokens[t] - n), limits.bucket_at[t]) for t, n in spent.items()}


def _capped(settings: Iterable[TypeSettings]) -> list[TypeSettings]:
    return [s for s in settings if s.max_running is not None or s.max_running_per_key is not None
            or s.circuit_state is not None]


class FlowControl:
    """The claim's FlowPolicy: its questions, each on the claim's own connection."""

    def __init__(self, db: Database, clock: Clock, on_skip: SkipSink = _ignore_skip,
                 settings_copy: TypeSettingsCopy | None = None) -> None:
        self.db = db
        self.clock = clock
        self.on_skip = on_skip
        # This process's copy of the types' settings (None: the rows are read by every claim).
        self.settings_copy = settings_copy
        self._last_noted: dict[str, int] = {}
        self._noted_lock = threading.Lock()
        # type -> until when (time.monotonic) its caps count as far from reached.
        self._far_until: dict[str, float] = {}
        self._far_lock = threading.Lock()

    def limits(self, conn: Connection, wanted: frozenset[str] | None, now_us: int, *,
               lock: bool = False, push: bool = False) -> ClaimLimits | None:
        """The limits of a claim of `wanted` types (None: any), or None when no limit
        concerns it. The dispatcher's claim (`push`) always has some: it takes push types
        alone.

        With `lock` where writers run concurrently (PostgreSQL), the rows of the types with
        a cap or a rate are locked as they are read, in type order, and the running jobs are
        counted in a statement after the lock (so with a snapshot that sees the claim before
        it committed): the limits are final, as they always are where writers are
        serialised. Without it there, they are a guess that `settle` checks under the
        locks, and the running jobs are not even counted while this process's last checks
        found every cap concerned far from reached.
        """
        if (self.settings_copy is not None and not lock
                and not self.settings_copy.under_flow_control(wanted)):
            # None of the types is under flow control as far as this process knows: no row
            # read, and the claim's own statement passes over a type put under it since
            # (JobRepository.claim_next_jobs, free_types_only).
            return None
        types = TypeRepository(conn)
        final = lock or writers_serialised(conn)
        if lock and not writers_serialised(conn):
            relevant = types.lock_limited_settings(wanted)
        else:
            relevant = [s for s in types.limited_settings()
                        if wanted is None or s.type in wanted]
        if push:
            relevant = [s for s in relevant if s.is_push]
        if not relevant and not push:
            return None
        capped = [s.type for s in _capped(relevant)]
        count = capped and (final or not self._all_far(capped))
        running = JobRepository(conn).count_running() if count else {}
        return limits_for_claim(relevant, running, now_us, push=push)

    def may_limit(self, wanted: frozenset[str] | None) -> bool:
        copy = self.settings_copy
        return (copy is None or copy.under_flow_control(wanted)
                or copy.orders_keys(wanted))

    def aging(self) -> Mapping[str, int]:
        return {} if self.settings_copy is None else self.settings_copy.aging()

    def put_under_control_since(self, wanted: frozenset[str] | None) -> bool:
        if self.settings_copy is None:
            return False
        self.settings_copy.refresh()
        return self.settings_copy.under_flow_control(wanted)

    def settle(self, conn: Connection, limits: ClaimLimits, claimed: list[Job], now_us: int,
               *, check: bool) -> bool:
        """Take the claimed jobs' tokens from their types' buckets, in the claim's
        transaction.

        With `check` where writers run concurrently (the limits were read without locks),
        the claimed types' rows are locked first, in type order, and the claim is checked
        against the settings, running counts and buckets as they are now; LimitReached when
        it no longer fits. The locks are taken this late so that concurrent claims of a
        type take turns only from here to their commit (two statements and the commit), not
        for their whole transaction. True when it locked rows, for which it may have waited:
        the claim holds what it needs from then on.
        """
        limited = {job.type for job in claimed} & (
            set(limits.budgets) | set(limits.key_caps) | set(limits.tokens))
        if not limited:
            # No cap or rate concerns what it claimed (a fair type's, say): nothing to pay or
            # to check, as for a type without settings.
            return False
        if not (check and claimed and not writers_serialised(conn)):
            TypeRepository(conn).save_buckets(buckets_after(limits,
                                                            (job.type for job in claimed)))
            return False
        types = TypeRepository(conn)
        fresh = types.lock_limited_settings({job.type for job in claimed})
        if not fresh:
            return False
        push = limits.only is not None  # the dispatcher's claim judges push types alone
        buckets = buckets_after(limits_for_claim(fresh, {}, now_us, push=push),
                                (job.type for job in claimed))
        capped = _capped(fresh)
        running: dict[tuple[str, str | None], int] = {}
        if capped:
            # Counted in a statement after the locks: it sees every claim of these types
            # that took the locks before this one (they hold them to their commit), and
            # this one's own jobs, which are taken out to ask whether they fit beside the
            # others. The bucket does not depend on what runs, so its write rides on the
            # count's statement; a claim found not to fit rolls it back with the rest.
            spend = None
            if len(buckets) == 1:
                ((job_type, (tokens, at)),) = buckets.items()
                spend = types.spend_bucket(job_type, tokens, at)
            elif buckets:  # a claim of several rated types: each bucket on its own
                types.save_buckets(buckets)
            running = JobRepository(conn).count_running(along_with=spend)
            self._note_room(capped, running)
            for job in claimed:
                running[job.type, job.concurrency_key] -= 1
        elif buckets:
            types.save_buckets(buckets)
        if not limits_for_claim(fresh, running, now_us, push=push).admits(claimed):
            raise LimitReached
        return True

    def claimed(self, limits: ClaimLimits | None, claimed: list[Job], now_us: int) -> None:
        """Once the claim committed, outside its write lock: count the skips, and note when
        each claimed type was last claimed."""
        if limits is not None:
            for job_type, reason in self._skips(limits, now_us):
                self.on_skip(job_type, reason)
        if claimed:
            self._note_claimed(claimed)

    def _skips(self, limits: ClaimLimits, now_us: int) -> list[tuple[str, str]]:
        """The (type, reason) a claim under `limits` passed over: only a limit that held
        back due work counts (a paused type with nothing pending skips nothing). Probed in a
        read of its own, and only when a limit was reached: limits with room cost nothing."""
        full_keys = {job_type: full for job_type in sorted(limits.key_caps)
                     if (full := limits.full_keys(job_type))}
        if not (limits.blocked or full_keys):
            return []
        with self.db.read() as conn:
            jobs = JobRepository(conn)
            found = [(job_type, reason) for job_type, reason in sorted(limits.blocked.items())
                     if jobs.has_due_work_of(job_type, now_us)]
            found += [(job_type, SkipReason.KEY_MAX_RUNNING)
                      for job_type, full in full_keys.items()
                      if jobs.has_due_work_of(job_type, now_us, full)]
        return found

    def _note_claimed(self, claimed: list[Job]) -> None:
        """Record when each type was last claimed; at most once a second per type and
        process, in a short transaction of its own."""
        now = self.clock.now_us()
        with self._noted_lock:
            due = {job.type for job in claimed
                   if now - self._last_noted.get(job.type, -LAST_CLAIM_RESOLUTION_US)
                   >= LAST_CLAIM_RESOLUTION_US}
            for job_type in due:
                self._last_noted[job_type] = now
        if due:
            self.db.run_write(lambda conn: TypeRepository(conn).note_last_claim(due, now))

    def _all_far(self, job_types: list[str]) -> bool:
        now = time.monotonic()
        with self._far_lock:
            return all(self._far_until.get(job_type, 0.0) > now for job_type in job_types)

    def _note_room(self, capped: list[TypeSettings], running: RunningCounts) -> None:
        until = time.monotonic() + FAR_FOR_SECONDS
        with self._far_lock:
            for s in capped:
                if s.far_from_caps(running, FAR_SHARE):
                    self._far_until[s.type] = until
                else:
                    self._far_until.pop(s.type, None)
