"""The settings the job use cases are built with (app/__init__.py reads them from the config)."""

from __future__ import annotations

from dataclasses import dataclass

from app.jobs.domain.models import Backoff


@dataclass(frozen=True)
class QueueSettings:
    job_types: frozenset[str]
    lease_seconds: int
    max_payload_bytes: int
    backoff: Backoff
    # Jobs one write transaction of a bulk retry or cancel, or of a purge, takes at most.
    bulk_batch_size: int
    max_waiting_claims: int = 8
    max_waiting_requests: int = 4
    # The url prefixes a reservation's check url must start with (docs/JOBS.md): none, none
    # allowed.
    check_url_prefixes: tuple[str, ...] = ()
    # How long a posted event is kept (docs/WAITS.md): for its Idempotency-Key, and, when it
    # woke nobody, for the first wait for it.
    event_keep_seconds: int = 86_400
