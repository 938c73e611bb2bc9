"""The domain's errors: what went wrong, in the queue's own words. No HTTP status lives here;
app/web/problems.py maps each to the problem a client is shown."""

from __future__ import annotations

# -- writes a unique index refused (named by app/storage/integrity.py)


class UniqueIndexRefused(Exception):
    """A write met a unique index: another row holds what this one would. Raised by the
    repositories in place of the database's IntegrityError; the use cases catch the one
    they expect and find the row that stands in the way."""


class IdempotencyKeyTaken(UniqueIndexRefused):
    """The producer's idempotency key names a job already (uq_jobs_producer_idempotency_key)."""


class UniqueScopeHeld(UniqueIndexRefused):
    """Another of the producer's jobs holds this unique scope in its while statuses
    (uq_jobs_producer_unique_scope)."""


class SlotTaken(UniqueIndexRefused):
    """The schedule's slot has its job already (uq_jobs_schedule_scheduled_for)."""
