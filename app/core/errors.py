"""The domain's errors: what went wrong, in the queue's own words. No HTTP status lives here;
app/web/problems.py maps each to the problem a client is shown (PROBLEM_TYPES), and the CLI
prints its detail."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class QueueError(Exception):
    """A request the queue refuses or cannot serve, told to whoever asked.

    `detail` says what happened in a sentence a client may read; `errors` names each field at
    fault (dotted paths, e.g. "jobs.3.type") with its messages; `retry_after_seconds`, when
    set, is how long the caller should wait before asking again (the service's state, not
    theirs)."""

    def __init__(self, detail: str, *, errors: Mapping[str, Sequence[str]] | None = None,
                 retry_after_seconds: int | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = errors
        self.retry_after_seconds = retry_after_seconds


class Unauthorized(QueueError):
    """No caller: the request named no key, or one that is unknown or revoked."""


class Forbidden(QueueError):
    """The caller is known and may not do this (role, priority ceiling, job types)."""


class NotFound(QueueError):
    """No such thing, or not one the caller may see."""


class Conflict(QueueError):
    """The thing exists and its state does not allow this now."""


class UniqueConflict(Conflict):
    """A job of the same unique scope stands in the way (`reject`, or `replace` of a job that
    is no longer pending). `existing_job_id` names it, when there is one the caller may see
    (a twin within the same batch has no id yet)."""

    def __init__(self, detail: str, existing_job_id: int | None) -> None:
        super().__init__(detail)
        self.existing_job_id = existing_job_id


class WaitEnded(Conflict):
    """A waitpoint token answered after its wait ended (docs/WAITS.md): `ended_at` (RFC 3339)
    and `ended_by` (token, timeout, cancel; None: not recorded) say when and how."""

    def __init__(self, detail: str, ended_at: str | None, ended_by: str | None) -> None:
        super().__init__(detail)
        self.ended_at = ended_at
        self.ended_by = ended_by


class TooManyRequests(QueueError):
    """The caller asks faster than the queue takes this request (a job's heartbeats, say):
    nothing was done; `retry_after_seconds` says when to ask again."""


class ValidationFailed(QueueError):
    """The request is well formed and its values are not acceptable; `errors` says which."""


class ServiceUnavailable(QueueError):
    """The service cannot serve this now (its database, its schema); the caller may retry."""


class CountingReadsBusy(ServiceUnavailable):
    """Every slot this process keeps for reads that count the backlog (explain, the type
    counts, /metrics, the dashboard) is taken: refused at once rather than left to queue for
    a connection that enqueues and claims need. The client may retry."""

    def __init__(self) -> None:
        super().__init__("Too many requests that count the backlog are being served; retry "
                         "in a moment.", retry_after_seconds=1)


class DatabaseUnavailable(ServiceUnavailable):
    """The database did not answer (unreachable, locked up, no pooled connection free): the
    service's state, not a bug. The client may retry."""

    def __init__(self) -> None:
        super().__init__("The database is not answering; retry later.", retry_after_seconds=1)


class StorageUnavailable(ServiceUnavailable):
    """The database answers and its storage refuses writes: its disk is full, or it is
    read-only or failing. The service's state, not a bug: the client may retry (reads go
    on meanwhile); the operator must free space or repair the disk."""

    def __init__(self, *, full: bool) -> None:
        super().__init__(
            "The database's disk is full; retry later." if full else
            "The database's storage refuses writes (read-only or failing); retry later.",
            retry_after_seconds=1)


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


class ScheduleNameTaken(UniqueIndexRefused):
    """A schedule of this name exists already (pk_schedules)."""
