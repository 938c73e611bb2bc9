"""What every statement on jobs shares: the columns of the Job record and how a row becomes
one, and the conditions the claim and the reads repeat (claimable, not expired, a type under
no flow control, the claim order, a lease capped at the attempt's deadline)."""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import BigInteger, and_, bindparam, case, cast, literal_column, or_, select, text

from app.core.clock import MICROS
from app.core.statuses import JobStatus
from app.jobs.domain.models import Job
from app.jobs.domain.transitions import Transition
from app.jobs.sql.statuses import status_is, status_is_by_id
from app.storage.schema import UNIQUE_HOLDER_PREDICATE, claim_order_columns, job_types, jobs

# The columns of the Job record, the first of the table's: what every statement here reads of
# a job. The later ones (a cancel request, progress) only the reads that show them ask for,
# so that the claim never reads them (app/jobs/sql/control_repository.py).
JOB_COLUMNS = tuple(jobs.c)[:len(dataclasses.fields(Job))]
assert [column.name for column in JOB_COLUMNS] == [f.name for f in dataclasses.fields(Job)]


def status_is_job(*statuses: JobStatus) -> Any:
    """The job's status is one of `statuses`, written as literals (app/jobs/sql/statuses.py)."""
    return status_is(jobs, statuses)


def status_is_job_by_id(*statuses: JobStatus) -> Any:
    """As status_is_job, for a statement that finds the job by its id (see status_is_by_id)."""
    return status_is_by_id(jobs, statuses)


CLAIMABLE_ROW = status_is_job(*Transition.CLAIM.from_statuses)
# The same, checked again on a row a claim found by id.
CLAIMABLE_BY_ID = status_is_job_by_id(*Transition.CLAIM.from_statuses)
# A job_types row that puts its type under flow control (TypeSettings.is_limited): a claim of
# the type must look at it. The one spelling of it in SQL (app/types/repository.py reads these
# rows with it): a cap, a rate or a tripped circuit, whose claims count what runs; or paused,
# pushed (only the dispatcher's claims take it) or fair (its claims read round order).
COUNTS_RUNNING_TYPE = or_(job_types.c.max_running.is_not(None),
                          job_types.c.max_running_per_key.is_not(None),
                          job_types.c.rate_per_second.is_not(None),
                          job_types.c.circuit_state.is_not(None))
PAUSED_PUSHED_OR_FAIR_TYPE = or_(job_types.c.paused.is_(True),
                                 job_types.c.push_url.is_not(None),
                                 job_types.c.fairness.is_not(None))
# The condition of a claim made without reading the types' rows (this process's copy of them
# showed none under flow control, app/types/settings_copy.py): the job's type is under none
# at the statement's own moment, so a pause, a cap, a rate or a push url set on another host
# stops such claims of the type at once. Written NOT IN, not NOT EXISTS: PostgreSQL turns a
# NOT EXISTS into an anti-join over every pending row, sorted afterwards (a claim at 100,000
# pending took 160 ms), where NOT IN is a filter on the claim-order index's scan, hashed
# once per statement, and the scan stops at the first job it takes (0.7 ms). job_types.type
# is its primary key: never NULL, so NOT IN means what NOT EXISTS did.
TYPE_FREE = jobs.c.type.not_in(select(job_types.c.type)
                               .where(or_(PAUSED_PUSHED_OR_FAIR_TYPE, COUNTS_RUNNING_TYPE)))
# A job_types row that gives its type key modes (fair or ordered keys): the end of a job with
# a concurrency key may pass the key's turn on or number its next round (app/jobs/tx/
# key_rules.py). The one spelling of it in SQL (app/types/repository.py reads the modes with it).
KEY_MODE_TYPE = or_(job_types.c.fairness.is_not(None), job_types.c.ordering.is_not(None))
# The condition of a step that settles no key at the statement's own moment: the job has no
# concurrency key, or its type has no key modes now (a mode set on another host a moment ago
# included). One probe of job_types' key, for a job with a key alone.
NO_KEY_TO_SETTLE = or_(jobs.c.concurrency_key.is_(None),
                       ~select(job_types.c.type)
                       .where(job_types.c.type == jobs.c.type, KEY_MODE_TYPE).exists())
# A job past its expires_at is never handed out (docs/JOBS.md): every claim's candidates and
# its UPDATE say so, at the claim's own moment; the maintenance loop cancels such jobs.
NOT_EXPIRED = or_(jobs.c.expires_at.is_(None), jobs.c.expires_at > bindparam("now"))
CLAIM_ORDER = claim_order_columns(jobs)


def claim_limit(one: bool) -> Any:
    """The LIMIT of a claim's candidates: the literal 1 for a claim of one job, else :limit.
    On PostgreSQL a prepared statement is planned afresh at each run while its generic plan
    looks costlier than the plans made for its values, and with LIMIT a parameter the
    generic plan is costed as if it returned a tenth of the pending jobs: so the claim of
    one job, bound, was planned at every run, and the claim that reads one index range per
    priority level (under a held snapshot, docs/SCALING.md) took more of the server's time
    planning than running. With the literal, the server keeps one plan per connection after
    the statement's fifth run."""
    return literal_column("1") if one else bindparam("limit")


def capped_lease(claimed_at: Any, wanted: Any) -> Any:
    """The lease `wanted`, but never past the attempt's deadline, claimed_at +
    timeout_seconds (docs/JOBS.md, Running jobs): the claim's and every heartbeat's."""
    deadline = claimed_at + cast(jobs.c.timeout_seconds, BigInteger) * MICROS
    return case((and_(jobs.c.timeout_seconds.is_not(None), deadline < wanted), deadline),
                else_=wanted)


JOB_COLUMN_COUNT = len(JOB_COLUMNS)


def job_of(row: Any) -> Job:
    return Job(*row[:JOB_COLUMN_COUNT])


# A job that holds its unique scope, in the unique index's own text, so that a look-up by it
# reads that index.
UNIQUE_HOLDER = text(UNIQUE_HOLDER_PREDICATE)
NOT_UNIQUE_HOLDER = text(f"NOT ({UNIQUE_HOLDER_PREDICATE})")
