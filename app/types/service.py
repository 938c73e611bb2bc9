"""Job types as resources: their settings and counts (GET/PATCH /types), and the flow control
every claim asks, inside its own transaction, which types and keys may run now."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection

from app.core.clock import MICROS, Clock
from app.core.errors import NotFound, ValidationFailed
from app.core.statuses import JobStatus
from app.jobs.counts import BacklogCounts
from app.jobs.models import Job
from app.jobs.repository import JobRepository
from app.storage.engine import Database
from app.types.models import (
    ClaimGate,
    RunningCounts,
    SkipReason,
    TypeSettings,
    defaults,
    new_push_secret,
    push_origin_refusal,
)
from app.types.repository import TypeRepository

# Told of each claim that passed over due work of a type (or of a key) held back by its
# limit: (type, reason). Metrics count them.
SkipSink = Callable[[str, str], None]


def _ignore_skip(_type: str, _reason: str) -> None:
    pass


class LimitReached(Exception):
    """A claim made on a gate read without locks no longer fits the limits under the locks:
    its transaction is rolled back and the claim made again on a locked gate."""


# A cap that the last check of a claim in this process found at most this share used, no more
# than this long ago, lets the next claims of the type choose their jobs without counting
# what runs (their check under the lock counts). Nearer its cap, every claim counts first, so
# that it chooses the jobs that fit rather than be rolled back and made again.
FAR_SHARE = 0.5
FAR_FOR_SECONDS = 1.0

# last_claim_at is written at most this often per type and process: a write per claim would
# make every claim of a type queue on its one row, which is what flow control must not cost.
LAST_CLAIM_RESOLUTION_US = MICROS


class FlowControl:
    """The claim's questions to flow control; each runs on the claim's own connection."""

    def __init__(self, db: Database, clock: Clock, job_types: frozenset[str],
                 on_skip: SkipSink = _ignore_skip) -> None:
        self.db = db
        self.clock = clock
        self.job_types = job_types
        self.on_skip = on_skip
        self._last_noted: dict[str, int] = {}
        self._noted_lock = threading.Lock()
        # type -> until when (time.monotonic) its caps count as far from reached.
        self._far_until: dict[str, float] = {}
        self._far_lock = threading.Lock()

    def gate(self, conn: Connection, wanted: frozenset[str] | None, now_us: int, *,
             lock: bool = False, push: bool = False) -> ClaimGate | None:
        """The gate of a claim of `wanted` types (None: any), or None when no limit concerns
        it, which leaves the claim exactly as it is without flow control. The dispatcher's
        claim (`push`) always has one: it takes push types alone.

        With `lock` on PostgreSQL, the rows of the types with a cap or a rate are locked as
        they are read, in type order, and the running jobs are counted in a statement after
        the lock (so with a snapshot that sees the claim before it committed): the gate is
        final, as every gate is on SQLite, where BEGIN IMMEDIATE makes claims take turns.
        Without it on PostgreSQL, the gate is a guess that `settle` checks under the locks,
        and the running jobs are not even counted while this process's last checks found
        every cap concerned far from reached.
        """
        types = TypeRepository(conn)
        final = lock or conn.dialect.name != "postgresql"
        if lock and conn.dialect.name == "postgresql":
            relevant = types.lock_limited_settings(wanted)
        else:
            relevant = [s for s in types.limited_settings()
                        if wanted is None or s.type in wanted]
        if push:
            relevant = [s for s in relevant if s.is_push]
        if not relevant and not push:
            return None
        capped = [s.type for s in relevant
                  if s.max_running is not None or s.max_running_per_key is not None]
        count = capped and (final or not self._all_far(capped))
        running = JobRepository(conn).count_running() if count else {}
        return ClaimGate.for_claim(relevant, running, now_us, push=push)

    def allowed_types(self, gate: ClaimGate, wanted: frozenset[str] | None) -> frozenset[str]:
        """The types a gated claim reads: the wanted ones (any configured type when None)
        but the blocked."""
        return gate.allowed(self.job_types if wanted is None else wanted)

    def settle(self, conn: Connection, gate: ClaimGate, claimed: list[Job], now_us: int, *,
               check: bool) -> bool:
        """Take the claimed jobs' tokens from their types' buckets, in the claim's
        transaction.

        With `check` on PostgreSQL (the gate was read without locks), the claimed types'
        rows are locked first, in type order, and the claim is checked against the settings,
        running counts and buckets as they are now; LimitReached when it no longer fits.
        The locks are taken this late so that concurrent claims of a type take turns only
        from here to their commit (two statements and the commit), not for their whole
        transaction. True when it locked rows, for which it may have waited: the claim holds
        what it needs from then on.
        """
        if not (check and claimed and conn.dialect.name == "postgresql"):
            TypeRepository(conn).save_buckets(gate.buckets_after(job.type for job in claimed))
            return False
        types = TypeRepository(conn)
        fresh = types.lock_limited_settings({job.type for job in claimed})
        if not fresh:
            return False
        # The bucket does not depend on what runs, so its write rides on the count's
        # statement; a claim found not to fit rolls it back with the rest.
        push = gate.only is not None  # the dispatcher's claim judges push types alone
        buckets = ClaimGate.for_claim(fresh, {}, now_us, push=push).buckets_after(
            job.type for job in claimed)
        capped = [s for s in fresh
                  if s.max_running is not None or s.max_running_per_key is not None]
        running: dict[tuple[str, str | None], int] = {}
        if capped:
            # Counted in a statement after the locks: it sees every claim of these types
            # that took the locks before this one (they hold them to their commit), and
            # this one's own jobs, which are taken out to ask whether they fit beside the
            # others.
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
        if not ClaimGate.for_claim(fresh, running, now_us, push=push).admits(claimed):
            raise LimitReached
        return True

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

    def skips(self, conn: Connection, gate: ClaimGate, now_us: int) -> list[tuple[str, str]]:
        """The (type, reason) a claim under `gate` passes over: only a limit that held back
        due work counts (a paused type with nothing pending skips nothing). Told to on_skip
        by `report_skips` once the claim committed."""
        jobs = JobRepository(conn)
        found = [(job_type, reason) for job_type, reason in sorted(gate.blocked.items())
                 if reason != SkipReason.PUSH and jobs.has_due_work_of(job_type, now_us)]
        for job_type in sorted(gate.key_caps):
            full = gate.full_keys(job_type)
            if full and jobs.has_due_work_of(job_type, now_us, full):
                found.append((job_type, SkipReason.KEY_MAX_RUNNING))
        return found

    def report_skips(self, skips: list[tuple[str, str]]) -> None:
        for job_type, reason in skips:
            self.on_skip(job_type, reason)

    def note_claimed(self, claimed: list[Job]) -> None:
        """Record when each type was last claimed; at most once a second per type and
        process, in a short transaction of its own after the claim committed."""
        now = self.clock.now_us()
        with self._noted_lock:
            due = {job.type for job in claimed
                   if now - self._last_noted.get(job.type, -LAST_CLAIM_RESOLUTION_US)
                   >= LAST_CLAIM_RESOLUTION_US}
            for job_type in due:
                self._last_noted[job_type] = now
        if due:
            self.db.run_write(lambda conn: TypeRepository(conn).note_last_claim(due, now))


def push_columns(current: TypeSettings, push: Mapping[str, Any] | None) -> dict[str, Any]:
    """The push columns a PATCH's `push` sets. null forgets the url and the secret; a push
    object keeps the type's secret unless it has none yet or asks for a new one."""
    if push is None:
        return {"push_url": None, "push_timeout_seconds": None, "push_secret": None}
    secret = current.push_secret
    if secret is None or push.get("rotate_secret", False):
        secret = new_push_secret()
    return {"push_url": push["url"], "push_timeout_seconds": push["timeout_seconds"],
            "push_secret": secret}


@dataclass(frozen=True)
class TypeCounts:
    pending: int
    scheduled: int
    running: int
    completed: int
    failed: int
    cancelled: int


@dataclass(frozen=True)
class TypeView:
    """A job type as GET /types shows it."""

    settings: TypeSettings
    counts: TypeCounts
    oldest_claimable_age_seconds: float | None
    # The push signing secret this very change made (push set for the first time, or
    # rotated): shown once, in the PATCH's answer; None otherwise.
    new_secret: str | None = None


class TypeService:
    def __init__(self, db: Database, clock: Clock, job_types: frozenset[str],
                 counts: BacklogCounts, *,
                 push_origins: frozenset[str] | None = None) -> None:
        self.db = db
        self.clock = clock
        self.job_types = job_types
        self.push_origins = push_origins  # None: a push url may name any origin
        self.counts = counts

    def list_types(self) -> list[TypeView]:
        return self._views(sorted(self.job_types))

    def get_type(self, job_type: str) -> TypeView:
        self._known(job_type)
        return self._views([job_type])[0]

    def update_type(self, job_type: str, patch: Mapping[str, Any]) -> TypeView:
        """Apply a PATCH's fields to the type's settings; from the next claim on."""
        self._known(job_type)
        refused = patch.get("push") and push_origin_refusal(patch["push"]["url"],
                                                            self.push_origins)
        if refused:
            raise ValidationFailed(f"The push url is refused: {refused}.",
                                   errors={"push.url": [f"Refused: {refused}."]})
        settings_patch = {name: value for name, value in patch.items() if name != "push"}

        def change(conn: Connection) -> str | None:
            repo = TypeRepository(conn)
            now = self.clock.now_us()
            repo.ensure_row(TypeSettings(type=job_type, updated_at=now))
            # FOR UPDATE on PostgreSQL: the bucket is changed by claims too.
            current = repo.lock_settings([job_type])[0]
            values, secret = dict(settings_patch), None
            if "push" in patch:
                values, secret = values | push_columns(current, patch["push"]), None
                if values["push_secret"] != current.push_secret:
                    secret = values["push_secret"]
            repo.save(current.changed(now, values))
            return secret

        secret = self.db.run_write(change)
        return replace(self.get_type(job_type), new_secret=secret)

    def push_targets(self) -> dict[str, TypeSettings]:
        """The push types' settings, by type (what the dispatcher delivers to)."""
        with self.db.read() as conn:
            return {s.type: s for s in TypeRepository(conn).pushed_settings()
                    if s.type in self.job_types}

    def _known(self, job_type: str) -> None:
        if job_type not in self.job_types:
            raise NotFound("No such job type: it is not in QUEUELOG_JOB_TYPES.")

    def _views(self, names: list[str]) -> list[TypeView]:
        # Pending, scheduled and finished counts from the backlog cache (app/jobs/counts.py):
        # they grow with what is stored. The running ones, bounded by the workers, live.
        backlog = self.counts.get()
        with self.db.read() as conn:
            now = self.clock.now_us()
            stored = TypeRepository(conn).settings_of(names)
            running = JobRepository(conn).count_running()
        views = []
        for name in names:
            summary = backlog.pending_of(name)
            counts = TypeCounts(
                pending=summary.pending, scheduled=summary.scheduled,
                running=sum(n for (t, _key), n in running.items() if t == name),
                completed=backlog.finished.get((name, JobStatus.COMPLETED.value), 0),
                failed=backlog.finished.get((name, JobStatus.FAILED.value), 0),
                cancelled=backlog.finished.get((name, JobStatus.CANCELLED.value), 0))
            oldest = summary.oldest_due_run_at
            age = None if oldest is None else max(0.0, (now - oldest) / MICROS)
            views.append(TypeView(stored.get(name, defaults(name)), counts, age))
        return views
