"""Why a job is or is not running: reason codes, each with its evidence and a sentence, the
most important first (docs/JOBS.md). Pure but for `flow_reasons`: the service
gathers the facts.

Reasons of flow control (type_paused, circuit_open, circuit_half_open, type_at_max_running,
key_at_max_running, rate_limited) come from `flow_reasons`, the one seam for them. For a
pending job that is otherwise due it reads the type's settings and the running counts through
the repositories, in the service's read transaction, and applies the rules a claim applies
(the token bucket's arithmetic is TypeSettings', the circuit's cap app/types/protection/
circuit.py's): every limit that holds the job back now, paused first. They rank after
`scheduled` (a job not yet due has none) and before `jobs_ahead`, and a job held back by any
of them is not `claimable_now`. `flow_reasons` adds `push_type` last for a job
of a push type: it says who takes the job (the dispatcher, not a worker), holds nothing
back, and stands in for the worker reasons, which do not concern such a job.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from app.core.clock import MICROS, to_rfc3339
from app.core.statuses import TERMINAL_STATUSES, JobStatus
from app.history.line import Place
from app.jobs.domain.flow import running_by_type
from app.jobs.domain.models import BoundedCount, Job
from app.jobs.sql.key_repository import KeyRepository
from app.jobs.sql.repository import JobRepository
from app.jobs.timeline.repository import HistoryRepository
from app.types.models import TypeSettings
from app.types.protection.circuit import OPEN
from app.types.repository import TypeRepository

# A type no live worker has claimed for this long is reported as without a worker.
IDLE_WORKER_US = 5 * 60 * MICROS

Reason = dict[str, Any]


class ReasonCode(enum.StrEnum):
    """Every code an explanation may give: /openapi.json documents exactly these."""

    FINISHED = "finished"
    RUNNING = "running"
    RESERVED = "reserved"
    WAITING_ON = "waiting_on"
    SCHEDULED = "scheduled"
    TYPE_PAUSED = "type_paused"
    TYPE_AT_MAX_RUNNING = "type_at_max_running"
    KEY_AT_MAX_RUNNING = "key_at_max_running"
    RATE_LIMITED = "rate_limited"
    PUSH_TYPE = "push_type"
    KEY_BLOCKED = "key_blocked"
    KEY_TURN = "key_turn"
    FAIR_SHARE = "fair_share"
    JOBS_AHEAD = "jobs_ahead"
    NO_WORKER_FOR_TYPE = "no_worker_for_type"
    SUSPENDED = "suspended"
    CIRCUIT_OPEN = "circuit_open"
    CIRCUIT_HALF_OPEN = "circuit_half_open"
    RETRY_BUDGET = "retry_budget"


@dataclass(frozen=True, slots=True)
class WorkerFacts:
    """What explain needs of one live worker key."""

    name: str
    types: frozenset[str] | None
    last_claim_at: int | None

    def may_claim(self, job_type: str) -> bool:
        return self.types is None or job_type in self.types


@dataclass(frozen=True, slots=True)
class Explanation:
    job_id: int
    status: str
    claimable_now: bool
    reasons: list[Reason]
    # A claimable job's place in line (app/history/line.py); None for any other.
    place: Place | None = None


def flow_reasons(conn: Connection, job: Job, now_us: int) -> list[Reason]:
    """The flow-control reasons holding `job` back now (see the module's docstring); none
    for a job that is not pending and due, or of a type without limits."""
    if job.status != JobStatus.PENDING or job.run_at > now_us:
        return []
    settings = TypeRepository(conn).settings_of([job.type]).get(job.type)
    if settings is None or not settings.is_limited:
        return []
    reasons: list[Reason] = []
    if settings.paused:
        reasons.append(_reason(ReasonCode.TYPE_PAUSED, f"Type {job.type} is paused: no claim takes "
                               "its jobs until an admin resumes it.", type=job.type))
    jobs = JobRepository(conn)
    capped = (settings.max_running is not None or settings.max_running_per_key is not None
              or settings.circuit_state is not None)
    running = jobs.count_running() if capped else {}
    reasons += circuit_reasons(settings, running_by_type(running).get(job.type, 0), now_us)
    if settings.max_running is not None:
        of_type = running_by_type(running).get(job.type, 0)
        if of_type >= settings.max_running:
            expiry = jobs.next_lease_expiry(job.type)
            when = ("" if expiry is None else
                    f"; a slot frees when one ends (the next lease runs out at "
                    f"{to_rfc3339(expiry)})")
            reasons.append(_reason(
                ReasonCode.TYPE_AT_MAX_RUNNING,
                f"{of_type} job(s) of type {job.type} run, its max_running is "
                f"{settings.max_running}{when}.",
                type=job.type, running=of_type, limit=settings.max_running,
                next_lease_expiry=to_rfc3339(expiry)))
    cap, key = settings.max_running_per_key, job.concurrency_key
    if cap is not None and key is not None:
        of_key = running.get((job.type, key), 0)
        if of_key >= cap:
            reasons.append(_reason(
                ReasonCode.KEY_AT_MAX_RUNNING,
                f"{of_key} job(s) of type {job.type} with concurrency key {key} run, its "
                f"max_running_per_key is {cap}.",
                type=job.type, concurrency_key=key, running=of_key, limit=cap))
    next_token_at = settings.next_token_at(now_us)
    if next_token_at is not None:
        reasons.append(_reason(
            ReasonCode.RATE_LIMITED,
            f"Type {job.type}'s rate ({settings.rate_per_second}/s) is spent: its next "
            f"token comes at {to_rfc3339(next_token_at)}.",
            type=job.type, rate_per_second=settings.rate_per_second,
            next_token_at=to_rfc3339(next_token_at)))
    if settings.is_push:
        reasons.append(_reason(
            ReasonCode.PUSH_TYPE,
            f"Type {job.type} is a push type: the dispatcher (queuelog dispatch) delivers its "
            "jobs to the type's endpoint; workers never claim them.",
            type=job.type))
    return reasons


def circuit_reasons(settings: TypeSettings, running: int, now_us: int) -> list[Reason]:
    """The reason a tripped circuit holds the type's jobs back now (docs/FLOW-CONTROL.md,
    "Circuit breaker"): open (until its probe, or while one runs), or half-open with its
    wave full."""
    config, state, since = settings.circuit_settings, settings.circuit_state, \
        settings.circuit_since
    cap = settings.circuit_cap(now_us)
    if config is None or since is None or cap is None or running < cap:
        return []
    opened_by = (None if settings.circuit_opened_by is None
                 else json.loads(settings.circuit_opened_by))
    cause = "" if opened_by is None else f" (failure group {opened_by['fingerprint']})"
    if state == OPEN:
        probe_at = since + config.cooldown_us
        when = (f"its probe may start at {to_rfc3339(probe_at)}" if now_us < probe_at
                else "its probe runs now")
        return [_reason(ReasonCode.CIRCUIT_OPEN,
                        f"Type {settings.type}'s circuit is open{cause} since "
                        f"{to_rfc3339(since)}: no job of it is claimed but one probe after "
                        f"each cooldown; {when}.", type=settings.type, since=to_rfc3339(since),
                        probe_at=to_rfc3339(probe_at), opened_by=opened_by)]
    next_wave_at = since + (((now_us - since) // config.cooldown_us) + 1) * config.cooldown_us
    return [_reason(ReasonCode.CIRCUIT_HALF_OPEN,
                    f"Type {settings.type}'s circuit is half-open: {cap} of its jobs may run "
                    f"at once and {running} run; the wave doubles at {to_rfc3339(next_wave_at)}.",
                    type=settings.type, wave=cap, running=running,
                    next_wave_at=to_rfc3339(next_wave_at))]


def retry_budget_reasons(conn: Connection, job: Job, now_us: int) -> list[Reason]:
    """A retry its type's retry budget holds back past its backoff (docs/FLOW-CONTROL.md,
    "Retry budget"), as the fail that scheduled it said in its retry_scheduled event; none
    once it is due, or with the events off."""
    if job.status != JobStatus.PENDING or job.run_at <= now_us or job.retry_count == 0:
        return []
    newest = HistoryRepository(conn).events_of(job.id, 1)
    if not newest or newest[0].event != "retry_scheduled" or newest[0].detail is None:
        return []
    held = json.loads(newest[0].detail).get("retry_budget")
    if held is None:
        return []
    return [_reason(ReasonCode.RETRY_BUDGET,
                    f"Type {job.type}'s retry budget holds this retry back: its backoff ended "
                    f"at {held['backoff_until']}; it runs at {to_rfc3339(job.run_at)}, when "
                    "the budget has room.", type=job.type,
                    backoff_until=held["backoff_until"], run_at=to_rfc3339(job.run_at))]


def key_reasons(conn: Connection, job: Job, now_us: int, cap: int, *,
                sees_every_producer: bool) -> list[Reason]:
    """The reasons of fair and ordered keys (docs/FLOW-CONTROL.md): a job held back by its
    ordered key (`key_blocked`, the failed job that blocks the key; `key_turn`, the job whose
    turn it is), a failure that blocks its key, and a due job of a fair type that waits for
    other keys' turns (`fair_share`, with the keys ahead of it, at most `cap` of their jobs
    read). Without `sees_every_producer`
    (any caller but an admin) nothing names another producer's job or key: a type whose keys
    are shared says that another producer's job goes first, not which."""
    keys = KeyRepository(conn)
    key = job.concurrency_key
    if job.status in (JobStatus.WAITING, JobStatus.FAILED) and key is not None:
        # A type's keys are its producers' own or shared: one of the two is its key's turn.
        turn = (keys.turn_of_key(job.type, job.producer, key)
                or keys.turn_of_key(job.type, None, key))
        if turn is None:
            return []
        if turn.job_id == job.id:
            if not turn.blocked:
                return []
            return [_reason(ReasonCode.KEY_BLOCKED, f"Its failure blocks concurrency key {key} of "
                            f"ordered type {job.type}: no later job of the key runs until an "
                            "admin retries or cancels it.", job_id=job.id,
                            concurrency_key=key, since=to_rfc3339(turn.since))]
        if not sees_every_producer and _of_another_producer(conn, turn.job_id, job.producer):
            return [_shared_turn_reason(job, key, turn.blocked, turn.since)]
        if turn.blocked:
            return [_reason(ReasonCode.KEY_BLOCKED, f"Job {turn.job_id} of its ordered key {key} "
                            "failed and blocks the key (on_failure block): nothing more of "
                            "the key runs until an admin retries or cancels that job.",
                            job_id=turn.job_id, concurrency_key=key,
                            since=to_rfc3339(turn.since))]
        return [_reason(ReasonCode.KEY_TURN,
                        f"Type {job.type} runs the jobs of each concurrency key one at a time, "
                        f"in order: job {turn.job_id} of key {key} goes first.",
                        job_id=turn.job_id, concurrency_key=key)]
    if (job.status != JobStatus.PENDING or job.run_at > now_us or job.fair_round is None):
        return []
    ahead, more = keys.keys_ahead(job.type, job.priority, job.fair_round, job.created_at,
                                  job.id, now_us, cap)
    if not ahead:
        return []
    shown = [(key, producer) for key, producer in ahead
             if sees_every_producer or producer == job.producer]
    names = sorted({key for key, _producer in shown if key is not None})
    keyless = any(key is None for key, _producer in shown)
    others = len(ahead) - len(shown)
    count = f"at least {len(ahead)}" if more else str(len(ahead))
    of_whom = (f"{len(names) + keyless} of its producer's key(s) and other producers'"
               if others else f"{len(names) + keyless} key(s)")
    return [_reason(ReasonCode.FAIR_SHARE, f"Type {job.type} takes turns across producers and "
                    f"their concurrency keys: {count} job(s) of {of_whom} come first, in their "
                    f"turns (its round is {job.fair_round}).", fair_round=job.fair_round,
                    keys_ahead=names, keyless_ahead=keyless, count=len(ahead),
                    count_capped=more, of_other_producers=others)]


def _of_another_producer(conn: Connection, job_id: int, producer: str) -> bool:
    other = JobRepository(conn).get_job(job_id)
    return other is not None and other.producer != producer


def _shared_turn_reason(job: Job, key: str, blocked: bool, since: int) -> Reason:
    """A shared key's turn held by another producer's job, told without naming it."""
    if blocked:
        return _reason(ReasonCode.KEY_BLOCKED, f"Another producer's job of the shared ordered "
                       f"key {key} failed and blocks the key (on_failure block): nothing more "
                       "of the key runs until an admin retries or cancels it.", job_id=None,
                       concurrency_key=key, since=to_rfc3339(since))
    return _reason(ReasonCode.KEY_TURN, f"Type {job.type} shares its concurrency keys across "
                   f"producers and runs each key's jobs one at a time, in order: another "
                   f"producer's job of key {key} goes first.", job_id=None,
                   concurrency_key=key)


def _reason(code: ReasonCode, message: str, **evidence: Any) -> Reason:
    return {"code": code, "message": message, **evidence}


def explain(job: Job, now_us: int, *, ahead: BoundedCount | None,
            ahead_of_type: BoundedCount | None, workers: Sequence[WorkerFacts],
            flow: Sequence[Reason] = (), names_workers: bool = False,
            waiting_on: Sequence[int] = (), keyed: Sequence[Reason] = (),
            waiting_for: Mapping[str, Any] | None = None,
            budget: Sequence[Reason] = ()) -> Explanation:
    """`ahead` and `ahead_of_type` count the due pending jobs before `job` in claim order
    (all types, and its own type), up to a cap; None when the job is not claimable.
    `names_workers` (admins) lists the worker keys' names in `no_worker_for_type`; without
    it the reason says what it says without naming other principals. `waiting_on`: the ids
    of a waiting job's unfinished dependencies; `keyed`, the reasons of its key (fair or
    ordered, `key_reasons`); `waiting_for`, a suspended job's wait (docs/WAITS.md);
    `budget`, a retry its type's retry budget holds back (`retry_budget_reasons`)."""
    if job.status in TERMINAL_STATUSES:
        return Explanation(job.id, job.status, False, [_reason(
            ReasonCode.FINISHED, f"The job is {job.status}; it will not run again unless an admin "
            "retries it." if job.status != JobStatus.COMPLETED else
            "The job is completed.", status=job.status, at=to_rfc3339(job.updated_at)),
            *keyed])
    if job.status == JobStatus.RUNNING:
        expires = job.lease_expires_at or 0
        message = (f"Worker {job.worker_id} holds it until {to_rfc3339(expires)}."
                   if expires > now_us else
                   f"Worker {job.worker_id}'s lease ran out at {to_rfc3339(expires)}; "
                   "maintenance takes it back as a failed attempt within a second.")
        return Explanation(job.id, job.status, False, [_reason(
            ReasonCode.RUNNING, message, worker_id=job.worker_id,
            claimed_at=to_rfc3339(job.claimed_at), lease_expires_at=to_rfc3339(expires),
            lease_expired=expires <= now_us)])

    if job.status == JobStatus.SUSPENDED:
        return Explanation(job.id, job.status, False, [_suspended(waiting_for or {})])
    if job.status == JobStatus.RESERVED:
        return Explanation(job.id, job.status, False, [_reason(
            ReasonCode.RESERVED,
            "It is reserved: it waits for its producer's confirm (after its own commit) or "
            "release, or for its deadline's check; never claimed until "
            "confirmed.")])
    if job.status == JobStatus.WAITING:
        ids = list(waiting_on)
        on_dependencies = [_reason(
            ReasonCode.WAITING_ON, f"It waits for {len(ids)} unfinished dependenc"
            f"{'y' if len(ids) == 1 else 'ies'} ({', '.join(map(str, ids))}): it becomes "
            "pending when the last one completes.", ids=ids)] if ids or not keyed else []
        return Explanation(job.id, job.status, False, [*keyed, *on_dependencies])

    reasons: list[Reason] = []
    due = job.run_at <= now_us
    if not due:
        reasons.append(_reason(ReasonCode.SCHEDULED,
                               f"It is not claimable before {to_rfc3339(job.run_at)}.",
                               until=to_rfc3339(job.run_at)))
        reasons += budget
    reasons += flow
    # push_type says who takes the job, not what holds it back.
    pushed = any(reason["code"] == ReasonCode.PUSH_TYPE for reason in flow)
    held = [reason for reason in flow if reason["code"] != ReasonCode.PUSH_TYPE]
    reasons += keyed
    # A fair type's claims read round order, not claim order: fair_share (in `keyed`) says
    # what comes first there.
    if due and ahead is not None and ahead.value and job.fair_round is None:
        of_type = ahead_of_type or BoundedCount(0, False)
        reasons.append(_reason(
            ReasonCode.JOBS_AHEAD,
            f"{_at_least(ahead)} claimable job(s) come before it in claim order "
            f"({_at_least(of_type)} of type {job.type}).", count=ahead.value,
            count_capped=ahead.capped, of_its_type=of_type.value,
            of_its_type_capped=of_type.capped))
    if not pushed:
        reasons += _worker_reasons(job, now_us, workers, names_workers)
    return Explanation(job.id, job.status, due and not held, reasons)


def _suspended(waiting_for: Mapping[str, Any]) -> Reason:
    # The moment is the evidence's `until`: the message names what it waits for.
    kind = waiting_for.get("kind")
    if kind == "time":
        what = "It is suspended until its moment (`until`); then it resumes, pending."
    elif kind == "event":
        what = (f"It is suspended until its producer posts the event {waiting_for['event']!r} "
                f"with key {waiting_for['key']!r}, or until its timeout passes (`until`).")
    else:
        what = ("It is suspended until its waitpoint token is answered, or until its timeout "
                "passes (`until`).")
    return _reason(ReasonCode.SUSPENDED, what, **dict(waiting_for))


def _at_least(count: BoundedCount) -> str:
    # A capped count stopped reading at the cap: the true one is at least as large.
    return f"at least {count.value}" if count.capped else str(count.value)


def _worker_reasons(job: Job, now_us: int, workers: Sequence[WorkerFacts],
                    names_workers: bool) -> list[Reason]:
    able = [worker for worker in workers if worker.may_claim(job.type)]
    if not able:
        return [_reason(ReasonCode.NO_WORKER_FOR_TYPE,
                        f"No live worker key may claim type {job.type}.",
                        type=job.type, **({"workers": []} if names_workers else {}),
                        last_claim_at=None)]
    claims = [worker.last_claim_at for worker in able if worker.last_claim_at is not None]
    last_claim_at = max(claims) if claims else None
    if last_claim_at is not None and now_us - last_claim_at < IDLE_WORKER_US:
        return []
    last = ("none has ever claimed" if last_claim_at is None
            else f"the last claim was at {to_rfc3339(last_claim_at)}")
    return [_reason(ReasonCode.NO_WORKER_FOR_TYPE,
                    f"No worker that may claim type {job.type} has claimed in the last 5 "
                    f"minutes ({last}): is one running?",
                    type=job.type,
                    **({"workers": sorted(worker.name for worker in able)}
                       if names_workers else {}),
                    last_claim_at=to_rfc3339(last_claim_at))]
