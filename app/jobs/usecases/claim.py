"""The claim: a worker (or the dispatcher) takes the most urgent jobs it may run, under a lease.

One claim reads top to bottom, in one write transaction (`_claim_in`):

1. ask the flow-control policy (app/jobs/domain/flow.py) what may run now: ClaimLimits, or None
   when no limit concerns the claim; a fair type's jobs that came due are numbered;
2. claim with the conditions the repository makes of those limits (while a snapshot holds
   PostgreSQL's horizon, a claim of any type reads each priority level from where this
   process's last claims left off: app/jobs/domain/claim_positions.py);
3. settle: pay the rate tokens and, where writers run concurrently, check the claim under
   its types' row locks (LimitReached), restamping its jobs if it waited for a lock;
4. record: the history of the transition, the claimed event, the worker seen.

A claim that met LimitReached is made once more on limits read under the locks, which
cannot miss. What only metrics need (the skips, last_claim_at) is the policy's, after the
commit. A claim with nothing due may wait for work: no connection is held while it waits,
and it peeks (`_may_claim_now`) every POLL_SECONDS for the other processes' work, or, where
the database tells every process of it (PostgreSQL: app/jobs/wake/waiting.py), only when
told, unless a type it waits for is under flow control.

A claim sweeps nothing: the maintenance loop's leader rescues expired leases and cancels
expired jobs (app/jobs/usecases/maintenance_loop.py). Meanwhile a job whose lease ran out is still
running, and one past its expiry is never a candidate (the claim's statement says so).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass

from app.core.callers import Caller
from app.core.clock import MICROS, Clock
from app.core.tracecontext import Trace
from app.jobs.domain.claim_positions import ClaimPositions
from app.jobs.domain.flow import ClaimLimits, FlowPolicy, LimitReached
from app.jobs.domain.intake import require_configured_types
from app.jobs.domain.models import Job
from app.jobs.domain.settings import QueueSettings
from app.jobs.domain.transitions import Transition
from app.jobs.tx.uow import JobsTx, JobsUnitOfWork
from app.jobs.wake.waiting import POLL_SECONDS, JobSignal, WaitAnswer, WaitingBudget


@dataclass(frozen=True)
class Claimed:
    """A job this claim took, the lease token the worker's reports on it carry, the
    checkpoint its previous attempt saved (compact JSON; None: none), and the trace context
    it was enqueued with (None: none), which its worker or push delivery continues."""

    job: Job
    lease_token: str
    checkpoint: str | None = None
    trace: Trace | None = None


@dataclass(frozen=True)
class _Ask:
    """One claim's request, the same for each of its attempts."""

    caller: Caller
    wanted: frozenset[str] | None  # None: any type
    limit: int
    lease_us: int
    push: bool
    # The worker's instance label (host and pid, or its operator's; None: none sent): bound
    # into the claim's UPDATE and noted, shown as reported, never read for ownership.
    instance: str | None = None


@dataclass(frozen=True)
class _Attempt:
    """What one committed attempt took, and what the policy told it."""

    jobs: list[Job]
    limits: ClaimLimits | None
    now_us: int
    checkpoints: dict[int, str]
    traces: dict[int, Trace]
    free_types_only: bool = False  # its statement passed over types under flow control


class ClaimService:
    """The claim use cases: claim, await_claim (JobService composes them)."""

    def __init__(self, uow: JobsUnitOfWork, clock: Clock, settings: QueueSettings,
                 signal: JobSignal, flow: FlowPolicy | None = None,
                 positions: ClaimPositions | None = None) -> None:
        self.uow = uow
        self.clock = clock
        self.settings = settings
        # Told when this process enqueued (JobService): waiting claims look again.
        self.signal = signal
        # None: no flow control at all (services built without the type settings).
        self.flow = flow
        self.waits = WaitingBudget(settings.max_waiting_claims)
        # Where claims of any type start while the horizon is held (told by the database).
        self.positions = positions or ClaimPositions(clock)

    def claim(self, caller: Caller, *, types: Iterable[str] | None = None,
              lease_seconds: int | None = None, limit: int = 1,
              push: bool = False, instance: str | None = None) -> list[Claimed]:
        """Claim up to `limit` jobs for the caller, most urgent first; [] when none is due.
        A worker's claim takes pulled types alone; the dispatcher's (`push`) push types
        alone (flow control's limits decide), under the same limits. `instance`: the label
        the worker sent, which its jobs' attempts carry."""
        return self.await_claim(caller, types=types, lease_seconds=lease_seconds,
                                limit=limit, push=push, instance=instance).value

    def await_claim(self, caller: Caller, *, types: Iterable[str] | None = None,
                    lease_seconds: int | None = None, limit: int = 1,
                    wait_seconds: float = 0, push: bool = False,
                    instance: str | None = None) -> WaitAnswer[list[Claimed]]:
        """As claim, waiting up to `wait_seconds` for a job when none is due now (no
        connection is held while waiting). Past the process's budget of waiting claims it
        answers at once, marked `not_waited`."""
        if types is not None:
            # Checked before anything else: a misspelt type would otherwise find nothing
            # forever, and a waiting claim only ever probes configured types.
            types = list(types)
            require_configured_types(self.settings.job_types, types, "types")
        wanted = claimable_types(caller, types)
        if wanted is not None and not wanted:
            # Nothing this key may ever take here: waiting would not change that.
            return WaitAnswer([])
        ask = _Ask(caller, wanted, limit,
                   (lease_seconds or self.settings.lease_seconds) * MICROS, push, instance)
        if wait_seconds <= 0:
            return WaitAnswer(self._claim_now(ask, answer_now=True))
        with self.signal.watching():
            self.signal.before_wait(ask.wanted)
            seen = self.signal.generation
            claimed = self._claim_now(ask, answer_now=False)
            if claimed:
                return WaitAnswer(claimed)
            with self.waits.slot() as granted:
                deadline = time.monotonic() + wait_seconds
                while granted and not claimed and self._wait_for_work(ask, seen, deadline):
                    seen = self.signal.generation
                    claimed = self._claim_now(ask, answer_now=False)
        return WaitAnswer(claimed, not_waited=not granted)

    def _claim_now(self, ask: _Ask, *, answer_now: bool) -> list[Claimed]:
        """One attempt at the claim. `answer_now`: its answer is final (a claim that does
        not wait), so an empty one made on a copy of the type settings that may be behind
        is made again if the copy, read again, shows a type under flow control since. A
        waiting claim's empty attempts read nothing more: its wait peeks on the copy its
        thread reads each second, and so claims such a type's jobs within a second."""
        # Each attempt is a moment of its own: a key revoked since the request began (while
        # this claim waited for work, say) must take nothing, so every attempt's transaction
        # confirms the key again rather than trusting an earlier check.
        ask.caller.live_checked = False
        nonce = secrets.token_hex(16)
        # A claim of any type is one statement when no flow control concerns it (one round
        # trip on PostgreSQL); _claim_in asks for a transaction otherwise, before it writes.
        first_try = self.uow.run_statement if ask.wanted is None else self.uow.run
        try:
            done = first_try(lambda tx: self._claim_in(tx, ask, nonce, optimistic=True))
        except LimitReached:
            done = self.uow.run(lambda tx: self._claim_in(tx, ask, nonce, optimistic=False))
        if (answer_now and not done.jobs and done.free_types_only and self.flow is not None
                and self.flow.put_under_control_since(ask.wanted)):
            # This process's copy of the settings was behind a change made elsewhere (a
            # limit set a moment ago): the claim is made again, under the limits.
            done = self.uow.run(lambda tx: self._claim_in(tx, ask, nonce, optimistic=False))
        if self.flow is not None:
            # Outside the write lock: what only metrics and last_claim_at need.
            self.flow.claimed(done.limits, done.jobs, done.now_us)
        return [Claimed(job, job.lease_token or "", done.checkpoints.get(job.id),
                        done.traces.get(job.id))
                for job in done.jobs]

    def _claim_in(self, tx: JobsTx, ask: _Ask, nonce: str, *, optimistic: bool) -> _Attempt:
        """One attempt, in its write transaction; `nonce` begins its lease tokens.
        `optimistic`: the limits are read without locks, and checked under them in `settle`
        (where writers run concurrently)."""
        # The key is confirmed by the claim's own statement; what comes before it changes no
        # job for the caller, and is undone with the claim should the key be revoked.
        repo = tx.jobs_confirming(ask.caller)
        now = self.clock.now_us()
        limits = None if self.flow is None else self.flow.limits(
            tx.conn, ask.wanted, now, lock=not optimistic, push=ask.push)
        if not optimistic:
            # The policy took its types' rows, waiting for them if another claim held them:
            # the claim holds what it needs from now.
            now = self.clock.now_us()
        if ask.push and limits is None:
            return _Attempt([], None, now, {}, {})  # no flow control to tell push types apart
        if tx.one_statement and limits is not None:
            tx.need_transaction()  # the limits' rows to read, pay and check with the claim

        if limits is not None and limits.fair:
            # A fair type's jobs that came due since they were enqueued take their turns
            # from the round served now (app/jobs/tx/key_rules.py).
            tx.keys.number_due(limits.fair & limits.allowed(self._types_of(ask.wanted)), now)
        restricted = limits is not None and limits.restricts(ask.limit)
        types = self._types_of(ask.wanted) if restricted else ask.wanted
        positions = self.positions.where_to_start() if types is None else None
        started_us = self.clock.now_us()
        jobs, checkpoints, traces = repo.claim_next_jobs(
            now_us=now, worker=ask.caller.name, lease_expires_at=now + ask.lease_us,
            nonce=nonce, limit=ask.limit, types=types, instance=ask.instance,
            limits=limits if restricted else None,
            # No type's row read: the statement itself passes over the types under flow
            # control now (a pause made on another host a moment ago included).
            free_types_only=self.flow is not None and limits is None,
            positions=positions,
            aging_us=self.flow.aging() if self.flow is not None else None)
        if types is None:
            self.positions.claimed(jobs, from_the_front_us=(
                self.clock.now_us() - started_us if positions is None else None))

        if (self.flow is not None and limits is not None
                and self.flow.settle(tx.conn, limits, jobs, now, check=optimistic)):
            # Checked under its types' rows, which it may have waited for: its jobs are
            # claimed, and leased, from the moment it holds them.
            held_at = self.clock.now_us()
            if held_at != now:
                if any(job.expires_at is not None and job.expires_at <= held_at
                       for job in jobs):
                    # A job expired while this claim waited for its locks: it was not
                    # claimed in time, so the claim is made again, under the locks.
                    raise LimitReached()
                now = held_at
                jobs = repo.restamp_claimed(jobs, now_us=now,
                                            lease_expires_at=now + ask.lease_us)

        # Recorded once the stamps are final, so the timeline reads as they do.
        tx.after_transition(Transition.CLAIM, jobs, actor=ask.caller.name, now_us=now)
        with tx.statement_of_its_own():  # a note of activity, lost at worst for a minute
            tx.timeline.seen(ask.caller.name, now, claimed=True, instance=ask.instance,
                             jobs=len(jobs))
        return _Attempt(jobs, limits, now, checkpoints, traces,
                        free_types_only=self.flow is not None and limits is None)

    def _types_of(self, wanted: frozenset[str] | None) -> frozenset[str]:
        """The types a claim of `wanted` ones (None: any) reads under flow control."""
        return self.settings.job_types if wanted is None else wanted

    def _wait_for_work(self, ask: _Ask, seen_generation: int, deadline: float) -> bool:
        """Sleep until a job may be claimable (True), or the deadline passes or the process
        stops (False)."""
        while (remaining := deadline - time.monotonic()) > 0 and not self.signal.waits_ended:
            peek = (self.signal.peek_seconds if not self._under_flow_control(ask)
                    else POLL_SECONDS)
            if self.signal.wait(seen_generation, timeout=min(peek, remaining)):
                return True
            if self.uow.read(lambda tx: self._may_claim_now(tx, ask)):
                return True
        return False

    def _under_flow_control(self, ask: _Ask) -> bool:
        """Whether the claim's types may become claimable with no change to tell (a rate's
        tokens come back with time, another job's end frees a cap's place or an ordered key's
        turn): its wait peeks every POLL_SECONDS, however it is told."""
        return self.flow is not None and self.flow.may_limit(ask.wanted)

    def _may_claim_now(self, tx: JobsTx, ask: _Ask) -> bool:
        """The waiting claim's peek: is there work this claim could take now, flow control
        included (a paused or full type's backlog must not wake it again and again)?"""
        now = self.clock.now_us()
        limits = None if self.flow is None else self.flow.limits(
            tx.conn, ask.wanted, now, lock=False, push=ask.push)
        if limits is None:
            return tx.jobs.has_claimable_work(now, ask.wanted,
                                              free_types_only=self.flow is not None)
        return tx.jobs.has_claimable_work(now, self._types_of(ask.wanted), limits)


def claimable_types(caller: Caller, requested: Iterable[str] | None) -> frozenset[str] | None:
    """The types a claim may take: requested ∩ the key's; None means any type."""
    requested_set = None if requested is None else frozenset(requested)
    if requested_set is None:
        return caller.allowed_types
    if caller.allowed_types is None:
        return requested_set
    return requested_set & caller.allowed_types

