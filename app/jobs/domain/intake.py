"""From an enqueue request to a new job row, and the rules that decide whether a request makes a
job, replays one (idempotency) or meets a twin (unique). Pure: no database, no HTTP.

Order of the rules: an idempotency replay first (a replay is never a duplicate), then a
unique twin, then a new job."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from app.core.callers import Caller
from app.core.clock import MICROS
from app.core.errors import Forbidden, UniqueConflict, ValidationFailed
from app.core.limits import DELAY_SECONDS, EXPIRES_IN_SECONDS
from app.core.origins import check_url_refusal
from app.core.priorities import Priority
from app.core.statuses import JobStatus
from app.core.tracecontext import Trace
from app.jobs.domain.models import Job
from app.jobs.domain.uniqueness import (
    NOT_UNIQUE_COLUMNS,
    Deduplicated,
    OnConflict,
    UniqueRequest,
    resolve_unique,
)

# run_at may be as far ahead as delay_seconds may say; expires_at as expires_in_seconds.
_RUN_AT_AHEAD_US = DELAY_SECONDS.max * MICROS
_EXPIRES_AHEAD_US = EXPIRES_IN_SECONDS.max * MICROS


@dataclass(frozen=True)
class IntakeRules:
    """What the configuration says about new jobs."""

    job_types: frozenset[str]
    max_payload_bytes: int
    check_url_prefixes: tuple[str, ...] = ()


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


@dataclass(frozen=True)
class NewReservation:
    """A reserve's deadline (µs) and its own check url (None: its key's, if any)."""

    confirm_by: int
    check_url: str | None


@dataclass(frozen=True)
class NewJob:
    """A validated enqueue request: the row it stores, its unique options, whether it
    named a schedule (a replacing request without one keeps its twin's run_at), its
    reservation when it is reserved, and its context beside the row (docs/API.md): its
    tags (sorted, each once) and the trace context of the request that sent it."""

    values: dict[str, Any]
    unique: UniqueRequest | None
    scheduled: bool
    reservation: NewReservation | None = None
    tags: tuple[str, ...] = ()
    trace: Trace | None = None

    @property
    def stored_alone(self) -> bool:
        """Whether the job is its row and nothing else: no unique key (a twin to meet), no
        reservation, tags or trace context (rows of their own), no concurrency key (its
        key's modes to read). Such a job of a type without key modes is stored by its INSERT
        alone (an idempotency key's replay aside)."""
        return (self.unique is None and self.reservation is None and not self.tags
                and self.trace is None and self.values.get("concurrency_key") is None)


def new_job(rules: IntakeRules, caller: Caller, request: dict[str, Any],
            header_key: str | None, now: int, trace: Trace | None = None) -> NewJob:
    """The job a validated enqueue request makes, with the trace context of the request
    that sent it. Raises ValidationFailed or Forbidden."""
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
        if not 0 <= run_at <= now + _RUN_AT_AHEAD_US:
            raise ValidationFailed(
                "run_at is out of range.",
                errors={"run_at": ["Must be between 1970-01-01 and one year from now."]})
        schedule = ["run_at", run_at]
    elif request.get("delay_seconds") is not None:
        run_at = now + request["delay_seconds"] * MICROS
        schedule = ["delay_seconds", request["delay_seconds"]]

    expires_at, expiry = _expiry(request, now, run_at)
    reservation = _reservation(rules, request, now)
    concurrency_key = request.get("concurrency_key")
    # The schema gives them sorted, each once; a template stored before tags existed has none.
    tags = tuple(sorted(set(request.get("tags") or ())))
    fingerprint = None
    if idempotency_key is not None:
        fingerprint = request_fingerprint(job_type, request["payload"], priority,
                                          request["max_retries"], schedule, concurrency_key,
                                          dependencies_as_sent(request),
                                          _controls_as_sent(request, expiry),
                                          request.get("reserve"), tags)
    unique = None
    if request.get("unique") is not None:
        unique = resolve_unique(request["unique"], job_type, request["payload"], run_at)

    values = {
        "type": job_type,
        "payload": payload,
        "priority": int(priority),
        "status": (JobStatus.PENDING if reservation is None else JobStatus.RESERVED).value,
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
        **(NOT_UNIQUE_COLUMNS if unique is None else unique.columns),
        "timeout_seconds": request.get("timeout_seconds"),
        "expires_at": expires_at,
    }
    return NewJob(values, unique, scheduled=schedule is not None, reservation=reservation,
                  tags=tags, trace=trace)


def _reservation(rules: IntakeRules, request: dict[str, Any],
                 now: int) -> NewReservation | None:
    reserve = request.get("reserve")
    if reserve is None:
        return None
    for excluded in ("unique", "depends_on"):
        if request.get(excluded):
            raise ValidationFailed(f"A reserved job takes no {excluded}.", errors={
                "reserve": [f"Not with {excluded}: a reservation is one job's, confirmed on "
                            "its own."]})
    check_url = reserve.get("check_url")
    if check_url is not None:
        refused = check_url_refusal(check_url, rules.check_url_prefixes)
        if refused is not None:
            raise ValidationFailed(f"reserve.check_url is refused: {refused}.", errors={
                "reserve.check_url": [f"Refused: {refused}."]})
    return NewReservation(now + reserve["confirm_within_seconds"] * MICROS, check_url)


def _expiry(request: dict[str, Any], now: int, run_at: int) -> tuple[int | None, list[Any] | None]:
    """The job's expires_at (µs, None: none) and the expiry as sent (for the fingerprint)."""
    if request.get("expires_in_seconds") is not None:
        seconds = request["expires_in_seconds"]
        expires_at, field, expiry = now + seconds * MICROS, "expires_in_seconds", [
            "expires_in_seconds", seconds]
    elif request.get("expires_at") is not None:
        expires_at, field = request["expires_at"], "expires_at"
        expiry = ["expires_at", expires_at]
        if not now < expires_at <= now + _EXPIRES_AHEAD_US:
            raise ValidationFailed("expires_at is out of range.", errors={
                "expires_at": ["Must be in the future, within a year from now."]})
    else:
        return None, None
    if expires_at <= run_at:
        # It could never be claimed: said at once rather than stored to be cancelled.
        raise ValidationFailed(f"The job would expire before it is due ({field}).", errors={
            field: ["Must fall after the job's run_at (or delay_seconds)."]})
    return expires_at, expiry


def _controls_as_sent(request: dict[str, Any], expiry: list[Any] | None) -> list[Any] | None:
    """A request's timeout_seconds and expiry as sent (None without either)."""
    if request.get("timeout_seconds") is None and expiry is None:
        return None
    return [request.get("timeout_seconds"), expiry]


def dependencies_as_sent(request: dict[str, Any]) -> list[Any] | None:
    """A request's depends_on and on_dependency_failure as sent (None without any)."""
    if not request.get("depends_on"):
        return None
    return [list(request["depends_on"]), request.get("on_dependency_failure") or "cancel"]


def request_fingerprint(job_type: str, payload: dict[str, Any], priority: int,
                        max_retries: int, schedule: list[Any] | None,
                        concurrency_key: str | None = None,
                        dependencies: list[Any] | None = None,
                        controls: list[Any] | None = None,
                        reserve: dict[str, Any] | None = None,
                        tags: Sequence[str] = ()) -> str:
    """What makes two requests "the same request": type, canonical payload (keys sorted,
    compact), effective priority, max_retries, the schedule as sent, the concurrency key, the
    dependencies, the timeout and expiry as sent, the reservation and the tags (as a set:
    sorted). The trace context is not: a retried request is a new span of the same work. A
    request without the later fields fingerprints as it did before they existed, so replays
    of jobs stored earlier are still recognised."""
    fields: list[Any] = [job_type, payload, int(priority), max_retries, schedule]
    if concurrency_key is not None:
        fields.append(["concurrency_key", concurrency_key])
    if dependencies is not None:
        fields.append(["depends_on", dependencies])
    if controls is not None:
        fields.append(["controls", controls])
    if reserve is not None:
        fields.append(["reserve", reserve])
    if tags:
        fields.append(["tags", sorted(tags)])
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


def replacement_values(new: NewJob) -> dict[str, Any]:
    """What `replace` (debounce) changes on the pending twin: the new payload, priority,
    max_retries, while set, timeout and expiry, and the new schedule when one was named. Its
    id, idempotency key, producer and created_at stay."""
    values = new.values
    replacement = {name: values[name] for name in
                   ("payload", "priority", "max_retries", "unique_while", "updated_at",
                    "timeout_seconds", "expires_at")}
    if new.scheduled:
        replacement["run_at"] = values["run_at"]
    return replacement


def twin_conflict(twin: Job | None, new: NewJob, position: int | None = None
                  ) -> UniqueConflict:
    at = "" if position is None else f"jobs.{position}: "
    assert new.unique is not None
    if new.unique.on_conflict is OnConflict.REPLACE:
        detail = f"{at}the job holding this unique key is {twin.status if twin else 'taken'}; " \
                 "only a pending job can be replaced."
    else:
        detail = f"{at}a job holds this unique key."
    return UniqueConflict(detail, None if twin is None else twin.id)


def resolve_unique_conflict(twin: Job, new: NewJob, position: int | None = None
                     ) -> dict[str, Any] | None:
    """What `new` does to the stored twin holding its key: None to return the twin as it is,
    else the replacement values. Raises UniqueConflict (reject, or replace of a job that is
    no longer pending)."""
    assert new.unique is not None
    on_conflict = new.unique.on_conflict
    if on_conflict is OnConflict.RETURN:
        return None
    if on_conflict is OnConflict.REPLACE and twin.status == JobStatus.PENDING:
        return replacement_values(new)
    raise twin_conflict(twin, new, position)


@dataclass
class BatchPlan:
    """What each item of a batch becomes: ("replay", job) a replay of a stored job,
    ("replay_item", position) of an earlier item, ("new", index into new_rows),
    ("twin", job id, Deduplicated) a stored twin (replaced through `replacements`),
    ("twin_item", position, Deduplicated) the job of an earlier item."""

    steps: list[tuple[str, Any, Any]]
    new_rows: list[dict[str, Any]]
    replacements: dict[int, dict[str, Any]]  # stored twin's id → its replacement values

    def results(self, inserted: list[Job], replaced: dict[int, Job]
                ) -> list[tuple[Job, bool, Deduplicated]]:
        """(job, replayed, deduplicated) per item, once `new_rows` are stored as `inserted`
        and the replacements made as `replaced` (by id; the twins as they were otherwise)."""
        results: list[tuple[Job, bool, Deduplicated]] = []
        for kind, ref, how in self.steps:
            if kind == "replay":
                results.append((ref, True, Deduplicated.NO))
            elif kind == "replay_item":
                results.append((results[ref][0], True, Deduplicated.NO))
            elif kind == "new":
                results.append((inserted[ref], False, Deduplicated.NO))
            elif kind == "twin":
                results.append((replaced.get(ref.id, ref), False, how))
            else:
                results.append((results[ref][0], False, how))
        # An item whose job a later item replaced shows the job as it was finally stored.
        final = {job.id: job for job, _, _ in results}
        return [(final[job.id], replayed, how) for job, replayed, how in results]


def plan_batch(items: list[NewJob], stored: dict[str, Job], twins: dict[str, Job]
               ) -> BatchPlan:
    """Decide each item of a batch, given the producer's stored jobs by idempotency key and
    the stored jobs holding the items' unique scopes, by scope. Raises ValidationFailed (an
    idempotency key reused) or UniqueConflict."""
    first_item_with_key: dict[str, int] = {}
    # Each unique scope met so far: the earlier item that holds it, or the stored twin.
    holder_item: dict[str, int] = {}
    plan = BatchPlan([], [], {})
    new_row_of_item: dict[int, int] = {}
    for position, item in enumerate(items):
        row = item.values
        key = row["idempotency_key"]
        scope = item.unique.scope if item.unique is not None else None
        if key is not None and key in stored:
            plan.steps.append(("replay", replayed(stored[key], row, position), None))
        elif key is not None and key in first_item_with_key:
            earlier = items[first_item_with_key[key]].values
            if earlier["request_fingerprint"] != row["request_fingerprint"]:
                raise key_reused(position)
            plan.steps.append(("replay_item", first_item_with_key[key], None))
        elif scope is not None and scope in twins:
            twin = twins[scope]
            replacement = resolve_unique_conflict(twin, item, position)
            if replacement is not None:
                plan.replacements[twin.id] = plan.replacements.get(twin.id, {}) | replacement
            plan.steps.append(("twin", twin, Deduplicated.RETURNED if replacement is None
                               else Deduplicated.REPLACED))
        elif scope is not None and scope in holder_item:
            earlier_position = holder_item[scope]
            how = _meet_earlier_item(plan, new_row_of_item[earlier_position], item, position)
            plan.steps.append(("twin_item", earlier_position, how))
        else:
            if key is not None:
                first_item_with_key[key] = position
            if scope is not None:
                holder_item[scope] = position
            new_row_of_item[position] = len(plan.new_rows)
            plan.steps.append(("new", len(plan.new_rows), None))
            plan.new_rows.append(dict(row))
    return plan


def _meet_earlier_item(plan: BatchPlan, new_row: int, item: NewJob, position: int
                       ) -> Deduplicated:
    """A later item meeting the unique scope of an earlier new item of its batch: the
    earlier item's row is the twin, still pending."""
    assert item.unique is not None
    on_conflict = item.unique.on_conflict
    if on_conflict is OnConflict.RETURN:
        return Deduplicated.RETURNED
    if on_conflict is OnConflict.REJECT:
        raise twin_conflict(None, item, position)
    plan.new_rows[new_row].update(replacement_values(item))
    return Deduplicated.REPLACED
