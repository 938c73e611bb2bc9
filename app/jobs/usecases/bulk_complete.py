"""complete-many's first step (app/jobs/usecases/reports.py): in one statement, every item
a lone complete would complete in its own one statement (app/jobs/sql/complete_many.py).
The other items (a refusal, a replay, a cancel requested, dependents or a key to settle, a
delivery to record) then go one by one, as before, in the same transaction: a batch of N
plain completes is one statement, one round trip on PostgreSQL, as a lone complete is
(docs/SCALING.md, What a job costs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.core.callers import Caller
from app.jobs.domain.models import Job
from app.jobs.tx.uow import JobsTx


def bulk_positions(items: Sequence[dict[str, Any]]) -> list[int]:
    """The positions of the items the one statement may take: those with a lease token and
    no delivery to record, each the first item of its job (a repeat comes after it, one by
    one, as it did when every item went one by one in id order: a replay, or a refusal)."""
    positions: list[int] = []
    named: set[int] = set()
    for position, item in enumerate(items):
        if (item["id"] not in named and item.get("lease_token") is not None
                and item.get("delivered") is None):
            positions.append(position)
        named.add(item["id"])
    return positions


def complete_alone(tx: JobsTx, caller: Caller, items: Sequence[dict[str, Any]],
                   results: Sequence[str | None], positions: Sequence[int],
                   now: int) -> dict[int, Job]:
    """Complete, in one statement, the items at `positions` whose jobs a lone complete
    would complete in its one statement: the jobs completed, by position. In one-statement
    work, all of them or none (the work then runs again in a transaction)."""
    done = tx.completes.complete_held(
        [(items[at]["id"], items[at]["lease_token"], results[at]) for at in positions],
        worker=caller.name, now_us=now, all_or_nothing=tx.one_statement)
    if not done:
        return {}
    with tx.statement_of_its_own():  # a note of activity
        tx.timeline.seen(caller.name, now, claimed=False)
    by_id = {job.id: job for job in done}
    return {at: by_id[items[at]["id"]] for at in positions if items[at]["id"] in by_id}


def note_types_without_modes(tx: JobsTx, alone: Sequence[Job], others: Sequence[Job]) -> None:
    """Note what the one statement found of its jobs' types, as a lone complete does: no key
    to settle (NO_KEY_TO_SETTLE), so their end reads no key modes. Not for a type of a job
    ended one by one here, whose end reads its type's modes in this transaction (a keyless
    job's type may have modes: the statement only found that its job needs none)."""
    ended_otherwise = {job.type for job in others}
    for job_type in {job.type for job in alone} - ended_otherwise:
        tx.keys.seen_without_modes(job_type)
