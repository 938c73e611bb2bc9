"""Fair share and ordered keys (docs/FLOW-CONTROL.md): what a job's entry and its transitions
do to its key, in the same transaction.

Ordered keys. Each key of an ordered type has at most one job whose turn it is (key_turns):
the oldest job of the key not yet finished. Every later job of the key is stored `waiting`
(held back), so the claim never sees it and its cost never grows with the key's backlog.
When the turn's job completes, is cancelled, or fails under on_failure skip, the turn passes
to the key's oldest waiting job, released at once unless a dependency still holds it. A
failure under on_failure block keeps the turn, marked blocked, until an admin retries the
job (the turn is its again) or cancels it (the turn passes on). A retry or an attempt's
backoff keeps the turn: delays and retries hold the key's later jobs back. Every change of
a key's turn takes the key's row lock first, so enqueues, reports and cancels of one key on
several hosts take turns on it; keys never wait for each other.

Fair share. A fair type's pending jobs carry a round, and its claims take them in priority,
round, then claim order (start-time fair queueing, with one key per concurrency_key and one
for the jobs without a key). A job entering pending gets the round after its key's last
pending one, and never one earlier than the round being served now: a key with a million
jobs holds rounds far ahead, so a new key's job is at most one job per other key from its
turn, whatever the backlog. Numbering costs the entering job two index probes; the claim
reads one index in that order, as it reads claim order for other types.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.core.statuses import TERMINAL_STATUSES, JobStatus
from app.jobs.domain.models import Job
from app.jobs.domain.transitions import Transition
from app.jobs.sql.key_repository import DEFERRED_ROUND, KeyRepository
from app.jobs.sql.repository import JobRepository


@dataclass(frozen=True, slots=True)
class KeyMode:
    """A type's key modes: fairness, ordering and on_failure (docs/FLOW-CONTROL.md)."""

    fair: bool = False
    ordered: bool = False
    block_on_failure: bool = False
    shared: bool = False  # one key for every producer (key_scope "shared")


def key_owner(job: Job, mode: KeyMode) -> str | None:
    """Whose is the job's key: the producer key that enqueued it, as for idempotency and
    unique keys; None where the type's keys are shared by every producer."""
    return None if mode.shared else job.producer


# The modes of these types, read in the transaction (types with neither left out).
ModeSource = Callable[[Any, Collection[str]], Mapping[str, KeyMode]]
# True when this process's copy of the type settings shows the type neither fair nor ordered
# (app/types/settings_copy.py): its jobs without a concurrency key then read no mode.
PlainType = Callable[[str], bool]
# Records a transition made here: (transition, the jobs as it left them, when, each job's
# extra event detail by id).
Record = Callable[[Transition, list[Job], int, Mapping[int, Mapping[str, Any]]], None]


def no_modes(_conn: Any, _types: Collection[str]) -> Mapping[str, KeyMode]:
    """No type is fair or ordered (a unit of work built without the types' settings)."""
    return {}


def never_plain(_type: str) -> bool:
    """No copy of the settings to trust: every type's modes are read in the transaction."""
    return False


# Jobs that came due numbered by one claim of a fair type, at most: its transaction stays
# short however many come due at once.
NUMBERED_PER_CLAIM = 100

# Beyond every round and id: a place after all of a producer's jobs.
_END = 2**62

# Transitions that end a job which was waiting (held behind its key's turn, or for its
# dependencies): cancels.
_ENDS_A_WAITING_JOB = frozenset({Transition.CANCEL, Transition.DEPENDENCY_CANCEL,
                                 Transition.EXPIRE})


class KeyRules:
    """The rules of fair and ordered keys in one job transaction. `modes` reads the types'
    modes on its connection, once per transaction and type; `plain` says which types this
    process's copy of the settings shows without key modes: their jobs without a
    concurrency key read nothing (a job with a key, or of a type with modes, reads its
    type's modes in the transaction, so a change of modes applies to it at once)."""

    def __init__(self, jobs: JobRepository, keys: KeyRepository, modes: ModeSource,
                 record: Record, plain: PlainType = never_plain) -> None:
        self.jobs = jobs
        self.keys = keys
        self._modes = modes
        self._plain = plain
        self._record = record
        self._known: dict[str, KeyMode] = {}

    def modes_of(self, types: Collection[str], keyed: Collection[str] | None = None
                 ) -> dict[str, KeyMode]:
        """The modes of these types; `keyed`: those of them with a job that carries a
        concurrency key (None: all of them), whose modes are always read."""
        unknown = [t for t in types if t not in self._known
                   and (keyed is None or t in keyed or not self._plain(t))]
        if unknown:
            found = self._modes(self.keys.conn, unknown)
            for job_type in unknown:
                self._known[job_type] = found.get(job_type, KeyMode())
        return {t: self._known.get(t, KeyMode()) for t in types}

    def seen_without_modes(self, job_type: str) -> None:
        """The step's own statement found the type without key modes at its moment
        (NO_KEY_TO_SETTLE, app/jobs/sql/job_rows.py): nothing to read for it here."""
        self._known[job_type] = KeyMode()

    def modes_of_jobs(self, jobs: Collection[Job]) -> dict[str, KeyMode]:
        """The modes of these jobs' types (see modes_of)."""
        return self.modes_of({job.type for job in jobs},
                             {job.type for job in jobs if job.concurrency_key is not None})

    def mode_of(self, job: Job) -> KeyMode:
        return self.modes_of_jobs([job])[job.type]

    # -- a job's entry --------------------------------------------------------------------

    def join_keys(self, new: Sequence[Job], now_us: int) -> list[Job]:
        """Jobs just inserted (in their request's order): each joins its ordered key (its
        turn, or held back behind it) and, pending in a fair type, gets its round. Returns
        them as they are now."""
        if not new:
            return []
        modes = self.modes_of_jobs(new)
        if not any(m.fair or m.ordered for m in modes.values()):
            return list(new)
        held = [job.id for job in sorted(new, key=lambda job: job.id)
                if self._joins_behind(job, modes[job.type], now_us, in_id_order=True)]
        current = self._apply(Transition.HOLD, held, now_us, list(new))
        return self._numbered(current, modes, now_us)

    def _joins_behind(self, job: Job, mode: KeyMode, now_us: int, *,
                      in_id_order: bool = False) -> bool:
        """The job joins its ordered key: True when it must wait for another job's turn.
        `in_id_order` (a job entering, not a retry): a job older than the one whose turn it
        is (a reserved job confirmed after later jobs of its key came) takes the turn back
        while that one has not started, so the key's turns go in id order."""
        if not mode.ordered or job.concurrency_key is None:
            return False
        owner = key_owner(job, mode)
        holder = self.keys.take_turn(job.type, owner, job.concurrency_key, job.id, now_us)
        if holder == job.id:
            return False
        if in_id_order and holder > job.id and self._takes_turn_back(job, owner, holder,
                                                                     now_us):
            return False
        return job.status == JobStatus.PENDING

    def _takes_turn_back(self, job: Job, owner: str | None, holder_id: int,
                         now_us: int) -> bool:
        """The turn passes from the later job `holder_id` to `job` if that one has not
        started (pending, held back again; or waiting for its dependencies, which may be
        this very job: a dependent must never hold the turn its dependency waits for)."""
        self.keys.hold_job_row(holder_id)
        holder = self.jobs.get_job(holder_id)
        if holder is None or holder.status not in (JobStatus.PENDING, JobStatus.WAITING):
            return False
        if holder.status == JobStatus.PENDING:
            self._apply(Transition.HOLD, [holder_id], now_us, [holder])
        self.keys.pass_turn(job.type, owner, job.concurrency_key or "", job.id, now_us)
        return True

    # -- a transition's consequences ------------------------------------------------------

    def after(self, moves: Sequence[tuple[Transition, Sequence[Job]]],
              now_us: int) -> list[Job]:
        """What the transitions made (each with the jobs as it left them, in order) do to
        their keys: turns passed on, blocked or taken back, rounds given to jobs that became
        pending. Returns the jobs a turn released to pending."""
        relevant = [(t, job) for t, moved in moves for job in moved
                    if t not in (Transition.CLAIM, Transition.HEARTBEAT)]
        if not relevant:
            return []
        modes = self.modes_of_jobs([job for _t, job in relevant])
        if not any(m.fair or m.ordered for m in modes.values()):
            return []
        released: list[Job] = []
        entered_pending: list[Job] = []
        for transition, job in relevant:
            mode = modes[job.type]
            if mode.ordered and job.concurrency_key is not None:
                if job.status in TERMINAL_STATUSES:
                    released += self._turn_ends(transition, job, mode, now_us)
                    continue
                if transition is Transition.RETRY:
                    job = self._rejoin(job, mode, now_us)
            if job.status == JobStatus.PENDING and job.fair_round is None:
                entered_pending.append(job)
        self._numbered(entered_pending + released, modes, now_us)
        return released

    def _turn_ends(self, transition: Transition, job: Job, mode: KeyMode,
                   now_us: int) -> list[Job]:
        """The job finished: if the key's turn was its, the turn passes on (or, a failure
        under block, stays with it, blocked)."""
        key = job.concurrency_key or ""
        owner = key_owner(job, mode)
        if transition in _ENDS_A_WAITING_JOB:
            # Mostly a job held behind the turn, which moves nothing: looked at without the
            # key's lock, which a turn being passed to this very job holds while it waits for
            # the job's row (that turn then passes over it: see _pass_turn). Only the job
            # whose turn it is can have it, and only its own end takes it away.
            peek = self.keys.turn_of_key(job.type, owner, key)
            if peek is None or peek.job_id != job.id:
                return []
        turn = self.keys.lock_turn(job.type, owner, key)
        if turn is None or turn.job_id != job.id:
            return []
        if job.status == JobStatus.FAILED and mode.block_on_failure:
            self.keys.set_blocked(job.type, owner, key, job.id, True, now_us)
            return []
        return self._pass_turn(job, owner, key, now_us)

    def _pass_turn(self, job: Job, owner: str | None, key: str, now_us: int) -> list[Job]:
        while (next_id := self.keys.next_waiting(job.type, owner, key)) is not None:
            self.keys.pass_turn(job.type, owner, key, next_id, now_us)
            # Its row held first: a dependency's end releasing it concurrently (which holds
            # the row from before its own release) has committed by then, and the release
            # below, a statement of its own, sees both that end and this turn.
            self.keys.hold_job_row(next_id)
            released = self.jobs.release_ready([next_id], now_us)
            if released:
                self._record(Transition.RELEASE, released, now_us,
                             {next_id: {"key_turn_after": job.id}})
                return released
            following = self.jobs.get_job(next_id)
            if following is not None and following.status == JobStatus.WAITING:
                return []  # its turn, but a dependency still holds it
            # It left waiting meanwhile (cancelled by another transaction): the next one.
        self.keys.end_turns(job.type, owner, key)
        return []

    def _rejoin(self, job: Job, mode: KeyMode, now_us: int) -> Job:
        """An admin's retry brought the job back: its turn again if it blocked the key,
        else it joins the key as a new job would (its turn, or held back)."""
        key = job.concurrency_key or ""
        owner = key_owner(job, mode)
        turn = self.keys.lock_turn(job.type, owner, key)
        if turn is not None and turn.job_id == job.id:
            self.keys.set_blocked(job.type, owner, key, job.id, False, now_us)
            return job
        if self._joins_behind(job, mode, now_us):
            return self._apply(Transition.HOLD, [job.id], now_us, [job])[0]
        return job

    def number_due(self, fair_types: Collection[str], now_us: int) -> None:
        """In a claim of these fair types, before it reads their round order: the jobs that
        came due since they entered pending get their rounds now, as jobs entering pending
        now would (at most NUMBERED_PER_CLAIM per type; the next claims number the rest)."""
        for job_type in sorted(fair_types):
            due = self.keys.due_deferred(job_type, now_us, NUMBERED_PER_CLAIM)
            if due:
                jobs = [replace(job, fair_round=None) for job in self.jobs.jobs_by_ids(due)]
                self._numbered(jobs, self.modes_of([job_type]), now_us)

    # -- explain and the admin's cancel ---------------------------------------------------

    def holding_turns(self, job_ids: Collection[int]) -> set[int]:
        """Of these jobs, those whose key's turn it is (purge keeps them: a failure that
        blocks its key waits there for its retry or cancel)."""
        return set(self.keys.turns_of_jobs(job_ids))

    def blocks_its_key(self, job: Job) -> bool:
        """The job failed and its failure blocks its ordered key."""
        if job.status != JobStatus.FAILED or job.concurrency_key is None:
            return False
        turn = self.keys.turn_of_key(job.type, key_owner(job, self.mode_of(job)),
                                     job.concurrency_key)
        return turn is not None and turn.job_id == job.id and turn.blocked

    # -- helpers --------------------------------------------------------------------------

    def _apply(self, transition: Transition, ids: list[int], now_us: int,
               jobs: list[Job]) -> list[Job]:
        """`transition` applied to the jobs `ids` names among `jobs`; all of `jobs` returned,
        in their order, as they are now."""
        if not ids:
            return jobs
        moved = {job.id: job for job in self.jobs.apply_transition_to_many(
            transition, ids, transition.values(now_us=now_us))}
        return [moved.get(job.id, job) for job in jobs]

    def _numbered(self, jobs: list[Job], modes: Mapping[str, KeyMode],
                  now_us: int) -> list[Job]:
        """Each pending job of a fair type without a round gets one, no earlier than the
        round being served; all returned as they are now. Where keys are shared, a job's
        round is the next of its key's. Per producer, a job first gets the next round of
        its key among its producer's keys (no earlier than the producer's own first), and
        then, as its round among the producers, the one after its producer's job just
        before it in that order: each producer's jobs take one round each, its keys taking
        turns within them."""
        serving: dict[str, int] = {}
        deferred: list[tuple[int, int, int | None]] = []
        shared: list[Job] = []
        per_producer: dict[tuple[str, str], list[Job]] = {}
        numbered: dict[int, Job] = {}
        for job in sorted(jobs, key=lambda job: job.id):
            mode = modes.get(job.type, KeyMode())
            if (not mode.fair or job.status != JobStatus.PENDING
                    or job.fair_round is not None or job.id in numbered):
                continue
            numbered[job.id] = job
            if job.run_at > now_us:
                # Numbered when it comes due (number_due), at the round served then.
                deferred.append((job.id, DEFERRED_ROUND, None))
                numbered[job.id] = replace(job, fair_round=DEFERRED_ROUND)
            elif mode.shared:
                shared.append(job)
            else:
                per_producer.setdefault((job.type, job.producer), []).append(job)

        def served(job_type: str) -> int:
            if job_type not in serving:
                serving[job_type] = self.keys.head_round(job_type, now_us) or 0
            return serving[job_type]

        rounds = deferred + self._rounds_of_shared_keys(shared, served)
        for (job_type, producer), of_producer in per_producer.items():
            rounds += self._rounds_of_producer(job_type, producer, of_producer,
                                               served(job_type))
        for job_id, fair_round, _key_round in rounds:
            numbered[job_id] = replace(numbered[job_id], fair_round=fair_round)
        self.keys.set_rounds(rounds)
        return [numbered.get(job.id, job) for job in jobs]

    def _rounds_of_shared_keys(self, jobs: list[Job], served: Callable[[str], int]
                               ) -> list[tuple[int, int, int | None]]:
        last: dict[tuple[str, str | None], int] = {}
        rounds: list[tuple[int, int, int | None]] = []
        for job in jobs:
            lane = (job.type, job.concurrency_key)
            if lane not in last:
                stored = self.keys.last_round(job.type, job.concurrency_key)
                last[lane] = -1 if stored is None else stored
            fair_round = max(served(job.type), last[lane] + 1)
            last[lane] = fair_round
            rounds.append((job.id, fair_round, None))
        return rounds

    def _rounds_of_producer(self, job_type: str, producer: str, jobs: list[Job],
                            serving: int) -> list[tuple[int, int, int | None]]:
        """The rounds of one producer's jobs (in id order) of a fair type whose keys are
        per producer: (id, round, round among the producer's keys)."""
        head = self.keys.producer_head_key_round(job_type, producer)
        first = 0 if head is None else head
        last: dict[str | None, int] = {}
        placed: list[tuple[int, int, int]] = []  # (key round, id, round)
        for job in jobs:
            key = job.concurrency_key
            if key not in last:
                stored = self.keys.last_key_round(job_type, producer, key)
                last[key] = -1 if stored is None else stored
            last[key] = max(first, last[key] + 1)
            placed.append((last[key], job.id, 0))
        placed.sort()
        rounds: list[tuple[int, int, int | None]] = []
        before: tuple[int, int, int] | None = None
        # The producer's last stored job: a job placed after it (the usual case, jobs
        # entering at their producer's end) needs no look-up of its own.
        tail = self.keys.producer_job_before(job_type, producer, _END, _END)
        for key_round, job_id, _ in placed:
            if tail is not None and tail[:2] < (key_round, job_id):
                stored_before: tuple[int, int, int] | None = tail
            else:
                stored_before = self.keys.producer_job_before(job_type, producer, key_round,
                                                              job_id)
            if stored_before is not None and (before is None or stored_before > before):
                before = stored_before
            fair_round = serving if before is None else max(serving, before[2] + 1)
            before = (key_round, job_id, fair_round)
            rounds.append((job_id, fair_round, key_round))
        return rounds


def number_unrounded(jobs: JobRepository, keys: KeyRepository, job_type: str, mode: KeyMode,
                     now_us: int) -> None:
    """The fair type's pending jobs that entered without a round (on a host whose copy of the
    settings did not show the type fair yet) get one now, as on entering: no earlier than
    the round being served (app/types/settings_copy.py)."""
    if not mode.fair:
        return
    unrounded = jobs.jobs_by_ids(keys.unrounded_pending(job_type))
    if unrounded:
        KeyRules(jobs, keys, lambda _conn, _types: {job_type: mode},
                 lambda *_recorded: None)._numbered(unrounded, {job_type: mode}, now_us)


def change_modes(jobs: JobRepository, keys: KeyRepository, job_type: str, before: KeyMode,
                 after: KeyMode, now_us: int) -> None:
    """A type's key modes changed (PATCH /types): its stored jobs are brought under the
    new ones in the change's transaction, once; its cost is that of the type's unfinished
    jobs. These moves record no event: the type's change is what made them."""
    rules = KeyRules(jobs, keys, lambda _conn, _types: {job_type: after},
                     lambda *_recorded: None)
    rescoped = before.shared != after.shared
    if after.ordered and not before.ordered:
        keys.start_ordering(job_type, after.shared, now_us)
    elif before.ordered and not after.ordered:
        keys.stop_ordering(job_type, now_us)
    elif after.ordered and rescoped:
        keys.rescope_turns(job_type, after.shared, now_us)
    if after.ordered and before.block_on_failure and not after.block_on_failure:
        # Keys blocked under "block" go on under "skip": each failure's turn passes on.
        for turn in keys.blocked_turns_of(job_type):
            failed = jobs.get_job(turn.job_id)
            if failed is not None:
                keys.lock_turn(job_type, turn.producer, turn.concurrency_key)
                rules._pass_turn(failed, turn.producer, turn.concurrency_key, now_us)
    if after.fair and not before.fair:
        keys.number_rounds(job_type, after.shared, now_us)
    elif before.fair and not after.fair:
        keys.forget_rounds(job_type)
    elif after.fair:
        if rescoped:
            keys.forget_rounds(job_type)
        # Jobs the change released (or all, numbered again for their new keys): each
        # numbered as it entered pending.
        keys.number_rounds(job_type, after.shared, now_us)
