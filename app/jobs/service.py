"""The use cases of the queue. Each opens its transaction, applies the rules, and returns records.

Nothing here sees the HTTP request: handlers pass plain values and the authenticated caller.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import random
import secrets
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError

from app.clock import MICROS, Clock
from app.db import Database
from app.errors import Conflict, Forbidden, NotFound, Problem, ValidationFailed
from app.jobs.models import (
    LEASE_EXPIRED_ERROR,
    TERMINAL_STATUSES,
    Backoff,
    Job,
    JobStatus,
    Priority,
    Transition,
    after_failure,
)
from app.jobs.repository import JobRepository
from app.jobs.waiting import POLL_SECONDS, JobSignal
from app.keys.models import Caller, Role
from app.redaction import redact_error

# Ids beyond a signed 64-bit integer exist in no table of ours; answer 404 without asking.
MAX_JOB_ID = 2**63 - 1
ONE_YEAR_US = 365 * 24 * 3600 * MICROS
# Expired leases rescued by one claim at most, so one claim's transaction stays short.
RESCUE_BATCH = 100
# A batch whose keys race a concurrent request on PostgreSQL is run again this many times.
_BATCH_ATTEMPTS = 3


@dataclass(frozen=True)
class QueueSettings:
    job_types: frozenset[str]
    lease_seconds: int
    max_payload_bytes: int
    backoff: Backoff
    max_waiting_claims: int = 8


@dataclass(frozen=True)
class Claimed:
    job: Job
    lease_token: str


# Confirms, inside a transaction, that the caller's key is still live (raises otherwise).
CallerCheck = Callable[[Connection, Caller], None]


def _trust_caller(_conn: Connection, _caller: Caller) -> None:
    pass


# Told of what happened to jobs ("enqueued", "claimed", "rescued", …) and how many: metrics.
EventSink = Callable[[str, int], None]


def _ignore_event(_name: str, _count: int) -> None:
    pass


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def encode_cursor(last_id: int) -> str:
    return base64.urlsafe_b64encode(f"v1:{last_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        version, _, last_id = text.partition(":")
        # No job has an id past 64 bits, and neither database can bind one as its id type.
        if version != "v1" or not last_id.isdigit() or int(last_id) > MAX_JOB_ID:
            raise ValueError(cursor)
        return int(last_id)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ValidationFailed("The cursor is not one this service issued.",
                               errors={"cursor": ["Invalid cursor."]}) from None


def _key_reused(position: int | None) -> ValidationFailed:
    field = "idempotency_key" if position is None else f"jobs.{position}.idempotency_key"
    return ValidationFailed("This idempotency key was used with a different request.",
                            errors={field: ["Already used with a different request."]})


class JobService:
    def __init__(self, db: Database, clock: Clock, settings: QueueSettings,
                 rng: random.Random | None = None, on_event: EventSink = _ignore_event,
                 confirm_caller: CallerCheck = _trust_caller) -> None:
        self.db = db
        self.on_event = on_event
        self.confirm_caller = confirm_caller
        self.clock = clock
        self.settings = settings
        self.rng = rng or random.SystemRandom()
        self.signal = JobSignal()
        # A waiting claim holds a server thread; past this many, claims answer at once, so
        # that waiting claims can never take every thread from the other requests.
        self._waiting_slots = threading.BoundedSemaphore(max(settings.max_waiting_claims, 1))
        self._may_wait = settings.max_waiting_claims > 0

    def _repo(self, conn: Connection, caller: Caller) -> JobRepository:
        """The repository on `conn`, once the caller's key is confirmed live in the same
        transaction: a revoked key changes nothing, even on a request already under way."""
        self.confirm_caller(conn, caller)
        return JobRepository(conn)

    # -- producers ------------------------------------------------------------------------

    def enqueue(self, caller: Caller, request: dict[str, Any],
                header_idempotency_key: str | None = None) -> tuple[Job, bool]:
        """Store a new job, or find the one this idempotency key made before.

        Returns (job, replayed). Raises ValidationFailed, Forbidden or Conflict.
        """
        now = self.clock.now_us()
        values = self._new_job_values(caller, request, header_idempotency_key, now)
        job, replayed = self.db.run_write(
            lambda conn: self._insert_or_replay(self._repo(conn, caller), values))
        if not replayed:
            self.on_event("enqueued", 1)
            self.signal.notify()
        return job, replayed

    def enqueue_many(self, caller: Caller,
                     requests: list[dict[str, Any]]) -> list[tuple[Job, bool]]:
        """Store several jobs in one transaction, all or nothing; (job, replayed) in order.

        Every item is checked before anything is written; field errors are keyed by position
        (`jobs.3.type`). Idempotency keys work per item, a repeat within the batch included.
        """
        now = self.clock.now_us()
        rows, errors = [], {}
        for position, request in enumerate(requests):
            try:
                rows.append(self._new_job_values(caller, request, None, now))
            except ValidationFailed as exc:
                errors.update({f"jobs.{position}.{field}": messages
                               for field, messages in (exc.errors or {}).items()})
            except Forbidden as exc:
                raise Forbidden(f"jobs.{position}: {exc.detail}") from None
        if errors:
            raise ValidationFailed("Some jobs did not validate; nothing was stored.",
                                   errors=errors)
        for attempt in range(_BATCH_ATTEMPTS):
            try:
                results = self.db.run_write(
                    lambda conn: self._insert_or_replay_many(self._repo(conn, caller), rows))
                break
            except IntegrityError:
                # A concurrent request stored one of these keys between our look-up and
                # insert (PostgreSQL only; SQLite's BEGIN IMMEDIATE serialises writers).
                # Run again: its job is now a replay.
                if attempt == _BATCH_ATTEMPTS - 1:
                    raise Conflict("Requests with these idempotency keys are in flight; "
                                   "retry.") from None
        created = sum(1 for _, replayed in results if not replayed)
        if created:
            self.on_event("enqueued", created)
            self.signal.notify()
        return results

    def _insert_or_replay_many(self, repo: JobRepository,
                               rows: list[dict[str, Any]]) -> list[tuple[Job, bool]]:
        keys = {row["idempotency_key"] for row in rows if row["idempotency_key"] is not None}
        stored = repo.find_by_idempotency_keys(rows[0]["producer"], keys) if keys else {}
        # Decide each row: a replay of a stored job, of an earlier row, or a new job.
        first_row_with_key: dict[str, int] = {}
        plan: list[tuple[str, Any]] = []
        new_rows: list[dict[str, Any]] = []
        for position, row in enumerate(rows):
            key = row["idempotency_key"]
            if key is not None and key in stored:
                plan.append(("stored", self._replayed(stored[key], row, position)))
            elif key is not None and key in first_row_with_key:
                earlier = rows[first_row_with_key[key]]
                if earlier["request_fingerprint"] != row["request_fingerprint"]:
                    raise _key_reused(position)
                plan.append(("earlier", first_row_with_key[key]))
            else:
                if key is not None:
                    first_row_with_key[key] = position
                plan.append(("new", len(new_rows)))
                new_rows.append(row)
        inserted = repo.insert_jobs(new_rows)
        results: list[tuple[Job, bool]] = []
        for kind, ref in plan:
            if kind == "stored":
                results.append((ref, True))
            elif kind == "new":
                results.append((inserted[ref], False))
            else:
                results.append((results[ref][0], True))
        return results

    def _new_job_values(self, caller: Caller, request: dict[str, Any],
                        header_key: str | None, now: int) -> dict[str, Any]:
        job_type = request["type"]
        if not self.settings.job_types:
            raise ValidationFailed(
                "No job types are configured; the operator sets QUEUELOG_JOB_TYPES.",
                errors={"type": ["No job types are configured."]})
        if job_type not in self.settings.job_types:
            raise ValidationFailed("Unknown job type.",
                                   errors={"type": ["Not one of the configured job types."]})
        if caller.allowed_types is not None and job_type not in caller.allowed_types:
            raise Forbidden("This key may not enqueue jobs of this type.")

        ceiling = caller.max_priority
        priority = request.get("priority")
        if priority is None:
            priority = min(Priority.MEDIUM, ceiling)
        elif priority > ceiling:
            raise Forbidden(f"This key may enqueue at priority {ceiling.label} at most.")

        payload = self._sized_json(request["payload"], "payload")

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

        fingerprint = None
        if idempotency_key is not None:
            # "The same request": type, canonical payload, effective priority, max_retries
            # and the schedule as sent.
            canonical = json.dumps(
                [job_type, request["payload"], int(priority), request["max_retries"], schedule],
                sort_keys=True, separators=(",", ":"), ensure_ascii=False,
            )
            fingerprint = hashlib.sha256(canonical.encode("utf-8")).hexdigest()

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
        }

    def _insert_or_replay(self, repo: JobRepository, values: dict[str, Any]) -> tuple[Job, bool]:
        job = repo.insert_job(values)
        if job is not None:
            return job, False
        # The unique index on (producer, idempotency_key) refused the row: replay the twin.
        twin = repo.find_by_idempotency_key(values["producer"], values["idempotency_key"])
        if twin is None:
            raise Conflict("A request with this idempotency key is still in flight; retry.")
        return self._replayed(twin, values), True

    @staticmethod
    def _replayed(twin: Job, values: dict[str, Any], position: int | None = None) -> Job:
        """The stored job, when `values` is the same request as the one that made it."""
        if twin.request_fingerprint != values["request_fingerprint"]:
            raise _key_reused(position)
        return twin

    def _sized_json(self, value: dict[str, Any], name: str) -> str:
        text = compact_json(value)
        limit = self.settings.max_payload_bytes
        if len(text) > limit // 4 and len(text.encode("utf-8")) > limit:
            raise ValidationFailed(
                f"The {name} is larger than {limit} bytes as compact JSON.",
                errors={name: [f"At most {limit} bytes as compact UTF-8 JSON."]})
        return text

    # -- reading --------------------------------------------------------------------------

    def get_job(self, caller: Caller, job_id: int) -> Job:
        """The job, if the caller may see it; NotFound otherwise (the two look alike)."""
        if job_id > MAX_JOB_ID:
            raise NotFound("No such job.")
        with self.db.read() as conn:
            job = self._repo(conn, caller).get_job(job_id)
        if job is None or not self._visible_to(caller, job):
            raise NotFound("No such job.")
        return job

    def list_jobs(self, caller: Caller, *, status: str | None, job_type: str | None,
                  limit: int, cursor: str | None) -> tuple[list[Job], str | None]:
        """A page of the jobs the caller may see, by id, and the cursor of the next page."""
        after_id = decode_cursor(cursor) if cursor is not None else 0
        with self.db.read() as conn:
            page = self._repo(conn, caller).list_jobs(
                after_id=after_id,
                limit=limit + 1,
                producer=caller.name if caller.role is Role.PRODUCER else None,
                worker=caller.name if caller.role is Role.WORKER else None,
                status=status,
                job_type=job_type,
            )
        if len(page) > limit:
            page = page[:limit]
            return page, encode_cursor(page[-1].id)
        return page, None

    @staticmethod
    def _visible_to(caller: Caller, job: Job) -> bool:
        if caller.role is Role.ADMIN:
            return True
        if caller.role is Role.PRODUCER:
            return job.producer == caller.name
        return job.worker_id == caller.name

    # -- workers --------------------------------------------------------------------------

    def claim(self, caller: Caller, *, types: Iterable[str] | None = None,
              lease_seconds: int | None = None, limit: int = 1,
              wait_seconds: float = 0) -> list[Claimed]:
        """Claim up to `limit` jobs for the caller, most urgent first; [] when none is due
        within `wait_seconds`.

        Expired leases are rescued in the same transaction first, so a job whose worker died
        is claimable again by this very claim. While waiting no connection is held.
        """
        wanted = self._claimable_types(caller, types)
        if wanted is not None and not wanted:
            return []
        seen = self.signal.generation
        claimed = self._claim_now(caller, wanted, lease_seconds, limit)
        if claimed or wait_seconds <= 0:
            return claimed
        if not (self._may_wait and self._waiting_slots.acquire(blocking=False)):
            return claimed
        try:
            deadline = time.monotonic() + wait_seconds
            while not claimed and self._wait_for_work(wanted, seen, deadline):
                seen = self.signal.generation
                claimed = self._claim_now(caller, wanted, lease_seconds, limit)
            return claimed
        finally:
            self._waiting_slots.release()

    def _claim_now(self, caller: Caller, wanted: frozenset[str] | None,
                   lease_seconds: int | None, limit: int) -> list[Claimed]:
        lease_us = (lease_seconds or self.settings.lease_seconds) * MICROS
        nonce = secrets.token_hex(16)

        def claim_in(conn: Connection) -> list[Job]:
            repo = self._repo(conn, caller)
            now = self.clock.now_us()
            self._rescue_expired_leases(repo, now)
            return repo.claim_next_jobs(
                now_us=now, worker=caller.name, lease_expires_at=now + lease_us,
                nonce=nonce, limit=limit, types=wanted,
            )

        jobs = self.db.run_write(claim_in)
        self.on_event("claimed", len(jobs))
        return [Claimed(job, job.lease_token or "") for job in jobs]

    def _wait_for_work(self, wanted: frozenset[str] | None, seen_generation: int,
                       deadline: float) -> bool:
        """Sleep until a job may be claimable (True) or the deadline passes (False)."""
        while (remaining := deadline - time.monotonic()) > 0:
            if self.signal.wait(seen_generation, timeout=min(POLL_SECONDS, remaining)):
                return True
            with self.db.read() as conn:
                if JobRepository(conn).has_claimable_work(self.clock.now_us(), wanted):
                    return True
        return False

    @staticmethod
    def _claimable_types(caller: Caller, requested: Iterable[str] | None) -> frozenset[str] | None:
        """The types a claim may take: requested ∩ the key's; None means any type."""
        requested_set = None if requested is None else frozenset(requested)
        if requested_set is None:
            return caller.allowed_types
        if caller.allowed_types is None:
            return requested_set
        return requested_set & caller.allowed_types

    def _rescue_expired_leases(self, repo: JobRepository, now: int) -> int:
        # A lease that ran out is a failed attempt whose worker is presumed dead: back to
        # pending at once (no backoff), or failed when no retries are left.
        rescued_count = 0
        for job in repo.find_expired_leases(now, RESCUE_BATCH):
            rescued = repo.update_job_in_status(
                job.id,
                from_statuses=Transition.FAIL.from_statuses,
                lease_token=job.lease_token,
                values=after_failure(job, now, LEASE_EXPIRED_ERROR, retry_delay_us=0),
            )
            if rescued is not None:
                rescued_count += 1
                self.on_event("rescued", 1)
                self.on_event("retried" if rescued.status == JobStatus.PENDING else "failed", 1)
        return rescued_count

    def rescue_expired_leases(self) -> int:
        """Rescue every expired lease now (also done by each claim). Returns how many."""
        return self.db.run_write(
            lambda conn: self._rescue_expired_leases(JobRepository(conn), self.clock.now_us()))

    def heartbeat(self, caller: Caller, job_id: int, *, lease_token: str | None,
                  lease_seconds: int | None) -> Job:
        """Extend the caller's live lease on the job."""
        lease_us = (lease_seconds or self.settings.lease_seconds) * MICROS
        return self._update_held(caller, job_id, lease_token,
                                 lambda now: {"lease_expires_at": now + lease_us,
                                              "updated_at": now})

    def complete(self, caller: Caller, job_id: int, *, lease_token: str | None,
                 result: dict[str, Any] | None) -> Job:
        stored_result = None if result is None else self._sized_json(result, "result")
        job = self._update_held(caller, job_id, lease_token,
                                lambda now: self._completed_values(stored_result, now))
        self.on_event("completed", 1)
        return job

    def complete_many(self, caller: Caller,
                      items: list[dict[str, Any]]) -> list[tuple[int, Job | Problem]]:
        """Complete several held jobs in one transaction; each succeeds or fails on its own
        and is answered with the job or the problem a single complete would give."""
        results_json = [None if item.get("result") is None
                        else self._sized_json(item["result"], "result") for item in items]

        def complete_each(conn: Connection) -> list[tuple[int, Job | Problem]]:
            repo = self._repo(conn, caller)
            now = self.clock.now_us()
            answers: list[tuple[int, Job | Problem]] = []
            for item, stored_result in zip(items, results_json, strict=True):
                job_id, token = item["id"], item.get("lease_token")
                try:
                    if job_id > MAX_JOB_ID:
                        raise NotFound("No such job.")
                    job = repo.update_held_job(
                        job_id, worker=caller.name, now_us=now, lease_token=token,
                        values=self._completed_values(stored_result, now))
                    if job is None:
                        self._explain_not_held(repo.get_job(job_id), caller, now, token)
                    answers.append((job_id, job))
                except (NotFound, Conflict) as problem:
                    answers.append((job_id, problem))
            return answers

        answers = self.db.run_write(complete_each)
        completed = sum(1 for _, answer in answers if isinstance(answer, Job))
        self.on_event("completed", completed)
        return answers

    @staticmethod
    def _completed_values(stored_result: str | None, now: int) -> dict[str, Any]:
        return {"status": JobStatus.COMPLETED.value, "result": stored_result,
                "lease_expires_at": None, "lease_token": None, "updated_at": now}

    def _update_held(self, caller: Caller, job_id: int, lease_token: str | None,
                     values_at: Any) -> Job:
        if job_id > MAX_JOB_ID:
            raise NotFound("No such job.")

        def update_in(conn: Connection) -> Job:
            repo = self._repo(conn, caller)
            now = self.clock.now_us()
            job = repo.update_held_job(job_id, worker=caller.name, now_us=now,
                                       lease_token=lease_token, values=values_at(now))
            if job is None:
                self._explain_not_held(repo.get_job(job_id), caller, now, lease_token)
            return job

        return self.db.run_write(update_in)

    def fail(self, caller: Caller, job_id: int, *, lease_token: str | None, error: str,
             retry_in_seconds: int | None) -> Job:
        """Record a failed attempt: pending again after a backoff, or failed when none are left."""
        if job_id > MAX_JOB_ID:
            raise NotFound("No such job.")
        # PostgreSQL text cannot hold NUL; an error message is diagnostics, so it is kept with
        # each NUL shown as U+FFFD rather than refused, on every engine alike.
        error = redact_error(error).replace("\x00", "\ufffd")

        def fail_in(conn: Connection) -> Job:
            repo = self._repo(conn, caller)
            now = self.clock.now_us()
            job = repo.get_job(job_id, for_update=True)
            if job is None or not job.is_held_by(caller.name, now, lease_token):
                self._explain_not_held(job, caller, now, lease_token)
            if retry_in_seconds is not None:
                delay = retry_in_seconds * MICROS
            else:
                delay = self.settings.backoff.delay_us(job.retry_count, self.rng)
            failed = repo.update_job_in_status(
                job_id, from_statuses=Transition.FAIL.from_statuses,
                lease_token=job.lease_token, values=after_failure(job, now, error, delay))
            if failed is None:  # another transaction changed it first (PostgreSQL only)
                raise Conflict("The job changed while this request ran; its lease is gone.")
            return failed

        failed = self.db.run_write(fail_in)
        self.on_event("retried" if failed.status == JobStatus.PENDING else "failed", 1)
        return failed

    @staticmethod
    def _explain_not_held(job: Job | None, caller: Caller, now: int,
                          lease_token: str | None) -> None:
        if job is None:
            raise NotFound("No such job.")
        if job.status != JobStatus.RUNNING:
            raise Conflict(f"The job is {job.status}, not running.")
        if job.worker_id != caller.name:
            raise Conflict("The job is held by another worker.")
        if job.lease_expires_at is None or job.lease_expires_at <= now:
            raise Conflict("The lease on this job has expired.")
        if lease_token is not None and lease_token != job.lease_token:
            raise Conflict("The lease token names an earlier attempt.")
        raise Conflict("The job changed while this request ran.")

    # -- admins ---------------------------------------------------------------------------

    def cancel(self, caller: Caller, job_id: int) -> Job:
        """pending → cancelled."""
        return self._admin_transition(caller, job_id, Transition.CANCEL,
                                      lambda now: {"status": JobStatus.CANCELLED.value,
                                                   "updated_at": now})

    def retry(self, caller: Caller, job_id: int) -> Job:
        """failed | cancelled → pending, with a fresh retry budget, claimable at once."""
        return self._admin_transition(caller, job_id, Transition.RETRY,
                                      lambda now: {"status": JobStatus.PENDING.value,
                                                   "retry_count": 0,
                                                   "run_at": now,
                                                   "claimed_at": None,
                                                   "worker_id": None,
                                                   "lease_expires_at": None,
                                                   "lease_token": None,
                                                   "updated_at": now})

    def _admin_transition(self, caller: Caller, job_id: int, transition: Transition,
                          values_at: Any) -> Job:
        if job_id > MAX_JOB_ID:
            raise NotFound("No such job.")

        def transition_in(conn: Connection) -> Job:
            repo = self._repo(conn, caller)
            now = self.clock.now_us()
            job = repo.update_job_in_status(job_id, from_statuses=transition.from_statuses,
                                            values=values_at(now))
            if job is None:
                current = repo.get_job(job_id)
                if current is None:
                    raise NotFound("No such job.")
                allowed = " or ".join(transition.from_statuses)
                raise Conflict(f"The job is {current.status}; this needs it {allowed}.")
            return job

        return self.db.run_write(transition_in)

    # -- retention ------------------------------------------------------------------------

    def purge(self, *, older_than_seconds: float, statuses: Collection[str] | None = None,
              batch_size: int = 1000) -> int:
        """Delete finished jobs last updated before the cutoff, one short transaction per
        batch so that writers are never held up long. Returns how many were deleted."""
        chosen = set(statuses) if statuses else {s.value for s in TERMINAL_STATUSES}
        if not chosen <= {s.value for s in TERMINAL_STATUSES}:
            raise ValueError("only completed, failed and cancelled jobs can be purged")
        cutoff = self.clock.now_us() - round(older_than_seconds * MICROS)
        deleted, after_id = 0, 0
        while True:
            with self.db.write() as conn:
                count, last = JobRepository(conn).delete_finished_jobs(
                    statuses=sorted(chosen), updated_before_us=cutoff,
                    after_id=after_id, limit=batch_size)
            if last is None:
                return deleted
            deleted, after_id = deleted + count, last
