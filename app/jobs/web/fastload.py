"""POST /jobs/batch's body loaded without marshmallow when every job in it is plainly valid.

marshmallow spends about 17 µs on each job of a batch (a schema load per item: its hooks,
its error store, a Field.deserialize per field), as much as all the rest of the request's
work on it. Most batches hold nothing but plain jobs: known fields, each of the JSON type
its field takes and within its limits. For those, this module builds exactly what
BatchEnqueueSchema().load would return. Anything else — a field it does not take on this
path (run_at, unique), a value that would fail, or that it is not sure of — makes it
decline, and the whole body goes through the schema, which then gives the answer and the
error messages, as it always did. It never refuses anything itself, so it can only be as
strict as the schema: tests/jobs/test_fastload.py checks the two agree.
"""

from __future__ import annotations

from typing import Any

from app.core.limits import (
    BATCH_JOBS,
    DELAY_SECONDS,
    EXPIRES_IN_SECONDS,
    KEY_CHARS,
    RETRIES,
    TAG_CHARS,
    TAGS,
    TIMEOUT_SECONDS,
    TYPE_CHARS,
    Limit,
)
from app.core.priorities import Priority
from app.jobs.web.requests import BatchEnqueueSchema
from app.web.fields import PRINTABLE_ASCII

# The fields a plain job may hold, and the defaults EnqueueSchema loads for those missing.
_PLAIN_FIELDS = frozenset({"type", "payload", "priority", "max_retries", "delay_seconds",
                           "idempotency_key", "concurrency_key", "run_at", "unique",
                           "timeout_seconds", "expires_at", "expires_in_seconds", "tags"})
_batch_schema = BatchEnqueueSchema()


class _Decline(Exception):
    """This body is not plainly valid: the schema must load it."""


def load_batch(body: dict[str, Any]) -> dict[str, Any]:
    """What BatchEnqueueSchema().load(body) returns; raises its ValidationError when the
    body does not load."""
    jobs = body.get("jobs")
    if len(body) == 1 and type(jobs) is list and BATCH_JOBS.min <= len(jobs) <= BATCH_JOBS.max:
        try:
            return {"jobs": [_plain_job(job) for job in jobs]}
        except _Decline:
            pass
    loaded: dict[str, Any] = _batch_schema.load(body)
    return loaded


def _plain_job(job: Any) -> dict[str, Any]:
    if type(job) is not dict or not _PLAIN_FIELDS.issuperset(job):
        raise _Decline()
    job_type = job.get("type")
    if type(job_type) is not str or not TYPE_CHARS.min <= len(job_type) <= TYPE_CHARS.max:
        raise _Decline()
    payload = job.get("payload", _MISSING)
    if payload is _MISSING:
        payload = {}
    elif type(payload) is dict:
        payload = dict(payload)  # as the Dict field loads it: a copy
    else:
        raise _Decline()
    return {
        "type": job_type,
        "payload": payload,
        "priority": _priority(job.get("priority")),
        "max_retries": _integer(job.get("max_retries", RETRIES.default), RETRIES),
        # Loaded by the schema (a date-time to parse, a nested schema) whenever given.
        "run_at": _none(job.get("run_at")),
        "unique": _none(job.get("unique")),
        "delay_seconds": _optional_integer(job.get("delay_seconds"), DELAY_SECONDS),
        "idempotency_key": _key(job.get("idempotency_key")),
        "concurrency_key": _key(job.get("concurrency_key")),
        "timeout_seconds": _optional_integer(job.get("timeout_seconds"), TIMEOUT_SECONDS),
        "expires_at": _none(job.get("expires_at")),
        "expires_in_seconds": _optional_integer(job.get("expires_in_seconds"),
                                                EXPIRES_IN_SECONDS),
        "tags": _tags(job.get("tags")),
    }


_MISSING = object()


def _none(value: Any) -> Any:
    if value is not None:
        raise _Decline()
    return value


def _priority(label: Any) -> Priority | None:
    if label is None:
        return None
    if type(label) is not str:
        raise _Decline()
    try:
        return Priority.from_label(label)
    except ValueError:
        raise _Decline() from None


def _integer(value: Any, limit: Limit[int]) -> int:
    if type(value) is not int or not limit.min <= value <= limit.max:
        raise _Decline()
    return value


def _optional_integer(value: Any, limit: Limit[int]) -> int | None:
    return None if value is None else _integer(value, limit)


def _tags(value: Any) -> list[str] | None:
    """As TagSet loads them: sorted, each once."""
    if value is None:
        return None
    if type(value) is not list or len(value) > TAGS.max:
        raise _Decline()
    for tag in value:
        if (type(tag) is not str or not TAG_CHARS.min <= len(tag) <= TAG_CHARS.max
                or not PRINTABLE_ASCII.match(tag)):
            raise _Decline()
    return sorted(set(value))


def _key(value: Any) -> str | None:
    if value is None:
        return None
    if (type(value) is not str or not KEY_CHARS.min <= len(value) <= KEY_CHARS.max
            or not PRINTABLE_ASCII.match(value)):
        raise _Decline()
    return value
