"""The retry budget at a failed attempt (docs/FLOW-CONTROL.md, "Retry budget"): the jobs'
RetryPolicy. A fail of a type with a budget runs in a transaction (the one-statement fail
passes it over, app/jobs/sql/fail_repository.py); there, with its retries left, it locks the
type's row, reads the window's first attempts (every process's tallies) and takes the
retry's slot from the schedule on the row (app/types/protection/budget.py). Types without a
budget pay nothing: this process's copy of the settings says so without a statement."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from sqlalchemy import Connection

from app.core.clock import MICROS
from app.types.models import TypeSettings
from app.types.protection.budget import slot
from app.types.protection.repository import ProtectionRepository


class RetryBudgets:
    def __init__(self, copy: Callable[[], Mapping[str, TypeSettings] | None],
                 unflushed_firsts: Callable[[str, int], int]) -> None:
        self._copy = copy
        # This process's first attempts of the type since a second, not yet in the tallies.
        self._unflushed_firsts = unflushed_firsts

    def may_hold_back(self, job_type: str) -> bool:
        current = self._copy()
        if current is None:
            return True
        settings = current.get(job_type)
        return settings is not None and settings.retry_budget is not None

    def retry_at(self, conn: Connection, job_type: str, backoff_at: int, now_us: int) -> int:
        repo = ProtectionRepository(conn)
        settings, scheduled = repo.lock_retry_budget(job_type)
        if settings is None:
            return backoff_at
        since = now_us // MICROS - settings.window_seconds
        window = repo.windows({job_type: since}).get(job_type)
        firsts = (0 if window is None else window.started_first) + self._unflushed_firsts(
            job_type, since)
        taken = slot(settings, firsts, scheduled, backoff_at, now_us)
        if taken.next_at != scheduled and taken.next_at is not None:
            repo.save_retry_schedule(job_type, taken.next_at)
        return taken.run_at
