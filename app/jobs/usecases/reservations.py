"""Reserved jobs (docs/JOBS.md): a producer reserves a job inside its own transaction's span,
then confirms it (pending) once its own commit is done, or releases it (cancelled).

Every reservation is resolved, by whichever comes first of: its producer's confirm or release;
its check's answer (the dispatcher asks the check url after the deadline: app/dispatch);
its deadline, when it has no check url (maintenance releases it); 24 hours of unanswered
checks (released). Each is the same conditional UPDATE from `reserved`, so the first wins and
the others find the job resolved: a repeat of the same outcome is answered as the first was,
the other outcome is 409.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from app.core.callers import Caller
from app.core.clock import MICROS, Clock
from app.core.errors import Conflict, NotFound
from app.core.redaction import display_url
from app.core.statuses import JobStatus
from app.jobs.domain.history import SERVICE_ACTOR
from app.jobs.domain.models import Job
from app.jobs.domain.transitions import Transition
from app.jobs.sql.reservation_repository import DueCheck
from app.jobs.tx.uow import CLAIMABLE, JobsTx, JobsUnitOfWork
from app.jobs.usecases.reads import visible_to

# Reservations maintenance releases in one transaction at most.
RELEASE_BATCH = 100
# How long a check url may leave a reservation unanswered, from its deadline: then it is
# released (docs/JOBS.md, Reserved jobs).
GIVE_UP_AFTER_US = 24 * 3600 * MICROS

CONFIRMED = "confirmed"
RELEASED = "released"
_OUTCOME = {Transition.CONFIRM: CONFIRMED, Transition.RELEASE_RESERVATION: RELEASED}
# Of the due checks given (and now): those to ask now, and those to put off, by job id, with
# when each is due again.
ChooseChecks = Callable[[list[DueCheck], int], tuple[list[DueCheck], dict[int, int]]]


class Reservations:
    def __init__(self, uow: JobsUnitOfWork, clock: Clock) -> None:
        self.uow = uow
        self.clock = clock

    # -- the producer's answers -------------------------------------------------------------

    def confirm(self, caller: Caller, job_id: int) -> Job:
        """reserved → pending (its key's turn and fair round taken as a new job's)."""
        return self._answer(caller, job_id, Transition.CONFIRM)

    def release(self, caller: Caller, job_id: int) -> Job:
        """reserved → cancelled."""
        return self._answer(caller, job_id, Transition.RELEASE_RESERVATION)

    def _answer(self, caller: Caller, job_id: int, transition: Transition) -> Job:
        def answer_in(tx: JobsTx) -> Job:
            repo = tx.jobs_for(caller)
            # Decided first, its owner checked on the job it returns: one statement less on
            # the common path; another's job raises, which rolls the decision back.
            decided = decide(tx, job_id, transition, actor=caller.name, now_us=self.now(),
                             detail={"by": "producer" if not caller.is_admin else "admin"})
            job = decided or repo.get_job(job_id)
            if job is None or not _answers_for(caller, job):
                raise NotFound("No such job.")
            if decided is not None:
                return decided
            reservation = tx.reservations.get(job_id)
            if reservation is not None and reservation.outcome == _OUTCOME[transition]:
                return job  # a repeat: answered as the first was
            if reservation is None:
                raise Conflict(f"The job is {job.status}; it was never reserved.")
            raise Conflict(f"The job's reservation was {reservation.outcome} already "
                           f"({job.status} now).")

        return self.uow.run(answer_in)

    # -- the service's resolutions ------------------------------------------------------------

    def release_overdue(self) -> int:
        """Maintenance's round: reservations past their deadline without a check url, and
        those whose check went unanswered for 24 hours, released (a batch of each). Returns
        how many."""
        now = self.now()

        def release_in(tx: JobsTx) -> int:
            late = tx.reservations.overdue_without_check(now, RELEASE_BATCH)
            unanswered = tx.reservations.given_up(now - GIVE_UP_AFTER_US, RELEASE_BATCH)
            done = 0
            for job_id, reason in ([(j, "deadline") for j in late]
                                   + [(j, "check unanswered for 24 hours")
                                      for j in unanswered]):
                if decide(tx, job_id, Transition.RELEASE_RESERVATION, actor=SERVICE_ACTOR,
                          now_us=now, detail={"by": reason}) is not None:
                    done += 1
            return done

        return self.uow.run(release_in)

    def due_checks(self, limit: int) -> list[DueCheck]:
        """The reservations whose check is due now (what the dispatcher would ask)."""
        now = self.now()
        return self.uow.read(lambda tx: tx.reservations.due_checks(now, limit))

    def take_due_checks(self, limit: int, choose: ChooseChecks, *,
                        asking_us: int) -> list[DueCheck]:
        """Up to `limit` reservations whose check is due now, soonest first, given to
        `choose` (with now), which says which to ask now and which to put off until when:
        those asked are held for `asking_us` (the time a check may take) so that no other
        dispatcher asks them meanwhile, those put off are due again then (their count of
        checks unchanged), the rest stay due. Returns those to ask. `choose` runs inside
        the transaction and must do nothing but choose."""
        now = self.now()

        def take(tx: JobsTx) -> list[DueCheck]:
            ask, put_off = choose(tx.reservations.lock_due_checks(now, limit), now)
            tx.reservations.hold_checks([c.reservation.job_id for c in ask], now + asking_us)
            tx.reservations.put_off_checks(put_off)
            return ask

        return self.uow.run(take)

    def answer_check(self, job_id: int, *, commit: bool, check_url: str) -> bool:
        """The check's answer: commit confirms, else releases; False when the job was
        resolved meanwhile (by its producer, or another dispatcher's check)."""
        made = Transition.CONFIRM if commit else Transition.RELEASE_RESERVATION
        now = self.now()
        return self.uow.run(lambda tx: decide(
            tx, job_id, made, actor=SERVICE_ACTOR, now_us=now,
            detail={"by": "check", "check_url": display_url(check_url)}) is not None)

    def check_again(self, check: DueCheck, *, next_check_at: int) -> None:
        reservation = check.reservation
        self.uow.run(lambda tx: tx.reservations.check_again(
            reservation.job_id, checks=reservation.checks + 1, next_check_at=next_check_at))

    def now(self) -> int:
        return self.clock.now_us()


def _answers_for(caller: Caller, job: Job) -> bool:
    """Its producer answers a reservation, or an admin."""
    return visible_to(caller, job) and (caller.is_admin or job.producer == caller.name)


def decide(tx: JobsTx, job_id: int, transition: Transition, *, actor: str, now_us: int,
           detail: Mapping[str, Any]) -> Job | None:
    """Resolve the job's reservation with `transition` (CONFIRM or RELEASE_RESERVATION), if
    it is still reserved: the job as it left it, else None. One conditional UPDATE from
    `reserved`: of two deciders, the second finds nothing to change."""
    job = tx.jobs.apply_transition(transition, job_id, transition.values(now_us=now_us))
    if job is None:
        return None
    tx.reservations.resolve([job_id], _OUTCOME[transition], now_us)
    if transition is Transition.CONFIRM:
        # It enters the queue now: its ordered key's turn (or held behind it) and its fair
        # round, as a job enqueued now would.
        [job] = tx.join_keys([job], now_us)
        if job.status == JobStatus.PENDING:
            tx.events[CLAIMABLE] += 1
    tx.after_transition(transition, [job], actor=actor, now_us=now_us,
                        details={job_id: dict(detail)})
    return job
