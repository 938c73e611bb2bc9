"""Job types as resources: their settings and counts (GET/PATCH /types, and the per-type gauges
of /metrics). The flow control every claim asks is app/types/flow.py."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Connection

from app.core.clock import MICROS, Clock
from app.core.errors import NotFound, ValidationFailed
from app.core.origins import push_origin
from app.core.statuses import JobStatus
from app.jobs.domain.flow import running_by_type
from app.jobs.sql.counts import BacklogCounts, BacklogSnapshot
from app.jobs.sql.key_repository import KeyRepository, KeyTurn
from app.jobs.sql.repository import JobRepository
from app.jobs.tx.key_rules import change_modes
from app.jobs.usecases.retention import NO_RETENTION, RetentionWindows
from app.storage.engine import Database
from app.types.models import (
    TypeSettings,
    defaults,
    new_push_secret,
    push_origin_refusal,
)
from app.types.origin_repository import OriginFigure, OriginRepository
from app.types.protection import circuit
from app.types.protection.budget import RetryBudgetSettings
from app.types.protection.circuit import CircuitSettings
from app.types.repository import TypeRepository
from app.types.settings_copy import TypeSettingsCopy

log = logging.getLogger(__name__)

# The PATCH fields of a type's protection (docs/FLOW-CONTROL.md): protection_columns' own.
PROTECTION_FIELDS = ("circuit", "retry_budget", "circuit_state")

# The statuses a type's "retention" names, as its fields' and columns' prefixes.
RETENTION_STATUSES = ("completed", "failed", "cancelled")


def retention_columns(retention: Mapping[str, Any] | None) -> dict[str, Any]:
    """The job_types columns a PATCH's "retention" sets: each status named, its seconds (null:
    kept for ever, stored as 0); a status left out keeps its window; retention null: every
    status back to the QUEUELOG_RETENTION_… defaults."""
    if retention is None:
        return {f"retention_{status}_seconds": None for status in RETENTION_STATUSES}
    return {f"retention_{status}_seconds": 0 if retention[f"{status}_seconds"] is None
            else retention[f"{status}_seconds"]
            for status in RETENTION_STATUSES if f"{status}_seconds" in retention}


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


def protection_columns(current: TypeSettings, patch: Mapping[str, Any],
                       now_us: int) -> dict[str, Any]:
    """The job_types columns a PATCH's "circuit", "retry_budget" and "circuit_state" set. A
    circuit or budget set null forgets its state too; a circuit opened by hand waits its
    cooldown before its probe, one closed by hand counts its window from then."""
    values: dict[str, Any] = {}
    if "circuit" in patch:
        given = patch["circuit"]
        values["circuit"] = None if given is None else CircuitSettings(**given).stored()
        if given is None:
            values |= {"circuit_state": None, "circuit_since": None, "circuit_opened_by": None}
    if "retry_budget" in patch:
        given = patch["retry_budget"]
        values["retry_budget"] = None if given is None else RetryBudgetSettings(**given).stored()
        if given is None:
            values["retry_budget_at"] = None
    if "circuit_state" in patch:
        if values.get("circuit", current.circuit) is None:
            raise ValidationFailed(
                "The type has no circuit to open or close: set \"circuit\" first.",
                errors={"circuit_state": ["The type has no circuit."]})
        state = None if patch["circuit_state"] == circuit.CLOSED else circuit.OPEN
        values |= {"circuit_state": state, "circuit_since": now_us, "circuit_opened_by": None}
    return values


@dataclass(frozen=True)
class TypeCounts:
    reserved: int
    waiting: int
    pending: int
    suspended: int
    scheduled: int
    running: int
    completed: int
    failed: int
    cancelled: int

    def of_status(self, status: JobStatus) -> int:
        """The jobs stored in `status` (pending ones include the scheduled)."""
        count: int = getattr(self, status.value)
        return count


def _age_seconds(now_us: int, run_at: int | None) -> float | None:
    return None if run_at is None else max(0.0, (now_us - run_at) / MICROS)


@dataclass(frozen=True)
class TypeStats:
    """Every type's counts at one moment: what GET /types and the gauges of /metrics show.
    Pending, scheduled and finished counts come from the backlog cache (app/jobs/sql/counts.py):
    they grow with what is stored. The running ones, bounded by the workers, are live."""

    now_us: int
    backlog: BacklogSnapshot
    running: Mapping[str, int]
    # Ordered keys a failure blocks, by type (their partial index: as few as the blocks).
    blocked_keys: Mapping[str, int] = field(default_factory=dict)

    def types(self) -> set[str]:
        """Every type with a job stored, configured or not."""
        return self.backlog.types() | set(self.running)

    def counts_of(self, job_type: str) -> TypeCounts:
        summary = self.backlog.pending_of(job_type)
        finished = self.backlog.finished
        return TypeCounts(
            reserved=self.backlog.reserved.get(job_type, 0),
            waiting=self.backlog.waiting.get(job_type, 0),
            suspended=self.backlog.suspended.get(job_type, 0),
            pending=summary.pending, scheduled=summary.scheduled,
            running=self.running.get(job_type, 0),
            completed=finished.get((job_type, JobStatus.COMPLETED.value), 0),
            failed=finished.get((job_type, JobStatus.FAILED.value), 0),
            cancelled=finished.get((job_type, JobStatus.CANCELLED.value), 0))

    def oldest_claimable_age_seconds(self, job_type: str | None = None) -> float | None:
        """How long the oldest claimable job (of `job_type`; None: of any) has been
        claimable; None when none is."""
        oldest = (self.backlog.oldest_due_run_at() if job_type is None
                  else self.backlog.pending_of(job_type).oldest_due_run_at)
        return _age_seconds(self.now_us, oldest)


@dataclass(frozen=True)
class TypeView:
    """A job type as GET /types shows it."""

    settings: TypeSettings
    counts: TypeCounts
    oldest_claimable_age_seconds: float | None
    # The push signing secret this very change made (push set for the first time, or
    # rotated): shown once, in the PATCH's answer; None otherwise.
    new_secret: str | None = None
    # A push type's origin's concurrency, as the dispatcher last wrote it (None: never).
    push_concurrency: OriginFigure | None = None
    blocked_keys: int = 0  # ordered keys a failure blocks now
    retention: RetentionWindows = NO_RETENTION  # its windows, the defaults included
    now_us: int = 0  # when it was read (a half-open circuit's wave is of that moment)


class TypeService:
    def __init__(self, db: Database, clock: Clock, job_types: frozenset[str],
                 counts: BacklogCounts, *,
                 push_origins: frozenset[str] | None = None,
                 retention_defaults: RetentionWindows = NO_RETENTION,
                 settings_copy: TypeSettingsCopy | None = None) -> None:
        self.db = db
        # This process's copy of the settings (the hot path's): read again after a change.
        self.settings_copy = settings_copy
        self.clock = clock
        self.job_types = job_types
        self.push_origins = push_origins  # None: a push url may name any origin
        self.counts = counts
        self.retention_defaults = retention_defaults  # QUEUELOG_RETENTION_…

    def retention_windows(self) -> dict[str, RetentionWindows]:
        """Every configured type's retention (maintenance's retention reads it each pass)."""
        with self.db.read() as conn:
            stored = TypeRepository(conn).settings_of(sorted(self.job_types))
        return {name: stored.get(name, defaults(name)).retention(self.retention_defaults)
                for name in sorted(self.job_types)}

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
        settings_patch = {name: value for name, value in patch.items()
                          if name not in ("push", "retention", *PROTECTION_FIELDS)}
        if "retention" in patch:
            settings_patch |= retention_columns(patch["retention"])

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
            values |= protection_columns(current, patch, now)
            changed = current.changed(now, values)
            if changed.aging_seconds is not None and changed.fairness is not None:
                # A fair type's claims take rounds, not claim order: nothing there to age.
                raise ValidationFailed(
                    "A fair type's jobs are claimed in rounds: aging does not apply to them. "
                    "Set fairness or aging_seconds to null first.",
                    errors={"aging_seconds": ["Not with fairness."]})
            repo.save(changed)
            if changed.circuit_state != current.circuit_state or "circuit_state" in patch:
                moved.append((circuit.shown_state(current.circuit_state),
                              circuit.shown_state(changed.circuit_state)))
            if changed.key_mode != current.key_mode:
                change_modes(JobRepository(conn), KeyRepository(conn), job_type,
                             current.key_mode, changed.key_mode, now)
            return secret

        moved: list[tuple[str, str]] = []
        secret = self.db.run_write(change)
        for before, after in moved[-1:]:
            log.info("circuit of type %s: %s -> %s (%s)", job_type, before, after,
                     "by hand" if "circuit_state" in patch else "its circuit was removed")
        if self.settings_copy is not None:
            # At once in this process; the others read it within a second
            # (docs/FLOW-CONTROL.md, Type settings across processes).
            self.settings_copy.refresh()
        return replace(self.get_type(job_type), new_secret=secret)

    def paused_types(self) -> frozenset[str]:
        """The configured types paused now (the dashboard marks their jobs)."""
        with self.db.read() as conn:
            stored = TypeRepository(conn).settings_of(sorted(self.job_types))
        return frozenset(name for name, settings in stored.items() if settings.paused)

    def circuit_states(self) -> dict[str, str]:
        """Where each configured type's circuit stands, of the types with a breaker."""
        with self.db.read() as conn:
            stored = TypeRepository(conn).settings_of(sorted(self.job_types))
        return {name: circuit.shown_state(s.circuit_state)
                for name, s in sorted(stored.items()) if s.circuit is not None}

    def push_targets(self) -> dict[str, TypeSettings]:
        """The push types' settings, by type (what the dispatcher delivers to)."""
        with self.db.read() as conn:
            return {s.type: s for s in TypeRepository(conn).pushed_settings()
                    if s.type in self.job_types}

    def _known(self, job_type: str) -> None:
        if job_type not in self.job_types:
            raise NotFound("No such job type: it is not in QUEUELOG_JOB_TYPES.")

    def stats(self) -> TypeStats:
        """Every type's counts now (see TypeStats)."""
        backlog = self.counts.get()
        with self.db.read() as conn:
            return self._stats_in(conn, backlog)

    def _stats_in(self, conn: Connection, backlog: BacklogSnapshot) -> TypeStats:
        now = self.clock.now_us()
        return TypeStats(now, backlog, running_by_type(JobRepository(conn).count_running()),
                         KeyRepository(conn).count_blocked())

    def _views(self, names: list[str]) -> list[TypeView]:
        backlog = self.counts.get()
        with self.db.read() as conn:
            stats = self._stats_in(conn, backlog)
            stored = TypeRepository(conn).settings_of(names)
            pushed = {s.type: push_origin(s.push_url) or "" for s in stored.values()
                      if s.push_url}
            figures = OriginRepository(conn).figures_of(set(pushed.values()) - {""})
        views = []
        for name in names:
            settings = stored.get(name, defaults(name))
            views.append(TypeView(settings, stats.counts_of(name),
                                  stats.oldest_claimable_age_seconds(name),
                                  blocked_keys=stats.blocked_keys.get(name, 0),
                                  retention=settings.retention(self.retention_defaults),
                                  now_us=stats.now_us))
        # A push type's origin's figure (GET /types' push.concurrency).
        return [replace(view, push_concurrency=figures.get(pushed.get(view.settings.type, "")))
                for view in views]

    def blocked_keys(self, limit: int = 50) -> list[KeyTurn]:
        """Ordered keys a failed job blocks, longest blocked first (the dashboard's)."""
        with self.db.read() as conn:
            return KeyRepository(conn).blocked_turns(limit)
