"""From an enqueue request to a new job row, and the idempotency rules that decide whether a
request makes a job or replays one. Pure: no database, no HTTP."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from app.clock import MICROS
from app.errors import Forbidden, ValidationFailed
from app.jobs.models import Job, JobStatus, Priority
from app.keys.models import Caller

ONE_YEAR_US = 365 * 24 * 3600 * MICROS


@dataclass(frozen=True)
class IntakeRules:
    """What the configuration says about new jobs."""

    job_types: frozenset[str]
    max_payload_bytes: int


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def sized_json(value: dict[str, Any], name: str, limit: int) -> str:
    """`value` as compact JSON text; ValidationFailed past `limit` bytes of UTF-8."""
    text = compact_json(value)
    # A character is at most 4 bytes: short texts need no encoding to be measured.
    if len(text) > limit // 4 and len(text.encode("utf-8")) > limit:
        raise ValidationFailed(
            f"The {name} is larger than {limit} bytes as compact JSON.",
            errors={name: [f"At most {limit} bytes as compact UTF-8 JSON."]})
    return text


def require_configured_types(configured: frozenset[str], requested: Iterable[str],
                             field: str) -> None:
    """ValidationFailed naming the requested types that are not configured, and the ones
    that are: a misspelt type is refused, never silently matched against nothing."""
    unknown = sorted(set(requested) - configured)
    if unknown and not configured:
        raise ValidationFailed(
            "No job types are configured; the operator sets QUEUELOG_JOB_TYPES.",
            errors={field: ["No job types are configured."]})
    if unknown:
        listed = ", ".join(sorted(configured))
        raise ValidationFailed(
            f"Not configured: {', '.join(unknown)}. The configured job types: {listed}.",
            errors={field: [f"Not configured: {', '.join(unknown)} (configured: {listed})."]})


def new_job_values(rules: IntakeRules, caller: Caller, request: dict[str, Any],
                   header_key: str | None, now: int) -> dict[str, Any]:
    """The row a validated enqueue request stores. Raises ValidationFailed or Forbidden."""
    job_type = request["type"]
    require_configured_types(rules.job_types, [job_type], "type")
    if caller.allowed_types is not None and job_type not in caller.allowed_types:
        raise Forbidden("This key may not enqueue jobs of this type.")

    ceiling = caller.max_priority
    priority = request.get("priority")
    if priority is None:
        priority = min(Priority.MEDIUM, ceiling)
    elif priority > ceiling:
        raise Forbidden(f"This key may enqueue at priority {ceiling.label} at most.")

    payload = sized_json(request["payload"], "payload", rules.max_payload_bytes)

    body_key = request.get("idempotency_key")
    if header_key is not None and body_key is not None and header_key != body_key:
        raise ValidationFailed(
            "The Idempotency-Key header and the body's idempotency_key differ.",
            errors={"idempotency_key": ["Differs from the Idempotency-Key header."]})
    idempotency_key = header_key if header_key is not None else body_key

    run_at, schedule = now, None
    if request.get("run_at") is not None:
        run_at = request["run_at"]
        if not 0 <= run_at <= now + ONE_YEAR_US:
            raise ValidationFailed(
                "run_at is out of range.",
                errors={"run_at": ["Must be between 1970-01-01 and one year from now."]})
        schedule = ["run_at", run_at]
    elif request.get("delay_seconds") is not None:
        run_at = now + request["delay_seconds"] * MICROS
        schedule = ["delay_seconds", request["delay_seconds"]]

    concurrency_key = request.get("concurrency_key")
    fingerprint = None
    if idempotency_key is not None:
        fingerprint = request_fingerprint(job_type, request["payload"], priority,
                                          request["max_retries"], schedule, concurrency_key)

    return {
        "type": job_type,
        "payload": payload,
        "priority": int(priority),
        "status": JobStatus.PENDING.value,
        "retry_count": 0,
        "max_retries": request["max_retries"],
        "producer": caller.name,
        "idempotency_key": idempotency_key,
        "request_fingerprint": fingerprint,
        "run_at": run_at,
        "claimed_at": None,
        "worker_id": None,
        "lease_expires_at": None,
        "lease_token": None,
        "result": None,
        "error": None,
        "created_at": now,
        "updated_at": now,
        "concurrency_key": concurrency_key,
    }


def request_fingerprint(job_type: str, payload: dict[str, Any], priority: int,
                        max_retries: int, schedule: list[Any] | None,
                        concurrency_key: str | None = None) -> str:
    """What makes two requests "the same request": type, canonical payload (keys sorted,
    compact), effective priority, max_retries, the schedule as sent, and the concurrency key.
    A request without a concurrency key fingerprints as it did before the field existed, so
    replays of jobs stored earlier are still recognised."""
    fields: list[Any] = [job_type, payload, int(priority), max_retries, schedule]
    if concurrency_key is not None:
        fields.append(["concurrency_key", concurrency_key])
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def key_reused(position: int | None) -> ValidationFailed:
    field = "idempotency_key" if position is None else f"jobs.{position}.idempotency_key"
    return ValidationFailed("This idempotency key was used with a different request.",
                            errors={field: ["Already used with a different request."]})


def replayed(twin: Job, values: dict[str, Any], position: int | None = None) -> Job:
    """The stored job, when `values` is the same request as the one that made it."""
    if twin.request_fingerprint != values["request_fingerprint"]:
        raise key_reused(position)
    return twin


@dataclass(frozen=True)
class BatchPlan:
    """What each row of a batch becomes: ("stored", job) a replay of a stored job,
    ("earlier", position) a replay of an earlier row, ("new", index into new_rows)."""

    steps: list[tuple[str, Any]]
    new_rows: list[dict[str, Any]]

    def results(self, inserted: list[Job]) -> list[tuple[Job, bool]]:
        """(job, replayed) per row, once `new_rows` are stored as `inserted`."""
        results: list[tuple[Job, bool]] = []
        for kind, ref in self.steps:
            if kind == "stored":
                results.append((ref, True))
            elif kind == "new":
                results.append((inserted[ref], False))
            else:
                results.append((results[ref][0], True))
        return results


def plan_batch(rows: list[dict[str, Any]], stored: dict[str, Job]) -> BatchPlan:
    """Decide each row of a batch, given the producer's stored jobs by idempotency key."""
    first_row_with_key: dict[str, int] = {}
    steps: list[tuple[str, Any]] = []
    new_rows: list[dict[str, Any]] = []
    for position, row in enumerate(rows):
        key = row["idempotency_key"]
        if key is not None and key in stored:
            steps.append(("stored", replayed(stored[key], row, position)))
        elif key is not None and key in first_row_with_key:
            if rows[first_row_with_key[key]]["request_fingerprint"] != row["request_fingerprint"]:
                raise key_reused(position)
            steps.append(("earlier", first_row_with_key[key]))
        else:
            if key is not None:
                first_row_with_key[key] = position
            steps.append(("new", len(new_rows)))
            new_rows.append(row)
    return BatchPlan(steps, new_rows)
