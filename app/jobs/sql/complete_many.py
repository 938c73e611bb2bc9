"""The complete of several held jobs in one statement: complete-many's plain items
(app/jobs/usecases/bulk_complete.py), under the very conditions a lone complete's one
statement takes (transition_conditions with `alone`, app/jobs/sql/repository.py), each job
under its own item's lease token and with its own result.

The items go as one JSON document, read as rows by the engine (json_to_recordset on
PostgreSQL, json_each on SQLite): one statement of one shape whatever their number (see
app/storage/statements.py on why a document rather than arrays or VALUES).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import BigInteger, Text, any_, bindparam, column, func, select, text, update
from sqlalchemy.dialects.postgresql import ARRAY

from app.jobs.domain.models import Job
from app.jobs.domain.transitions import Transition
from app.jobs.sql.job_rows import JOB_COLUMNS, job_of
from app.jobs.sql.repository import JobRepository, transition_conditions
from app.keys.repository import LIVE_KEY
from app.storage.dialects import writers_serialised
from app.storage.engine import need_transaction
from app.storage.schema import jobs

_ITEMS_SQL = {
    "postgresql": "SELECT id, lease_token, result FROM json_to_recordset(CAST(:items AS json))"
                  " AS items(id bigint, lease_token text, result text)",
    "sqlite": "SELECT json_extract(value, '$.id') AS id,"
              " json_extract(value, '$.lease_token') AS lease_token,"
              " json_extract(value, '$.result') AS result FROM json_each(:items)",
}


@functools.cache
def _complete_held(dialect: str, lock_rows: bool, key_to_confirm: bool,
                   all_or_nothing: bool) -> Any:
    """The UPDATE, built once per shape: `items` (id, lease_token, result) read from the
    document; `held`, the items' jobs a lone complete would complete in its one statement;
    and those jobs completed, RETURNING them. `all_or_nothing`: only when every item's job
    is held so (parameter `count`, the number of items), else none.

    `lock_rows` (PostgreSQL): `held` takes its rows' locks in id order (ORDER BY … FOR
    UPDATE, whose lock is taken on each row as the sort hands it on), and the UPDATE changes
    only rows `held` has handed on, so already locked: the statement locks its jobs in id
    order, as every transaction that locks several jobs takes them (complete-many's items
    one by one, an enqueue locking the dependencies it names), and two batches sharing jobs
    never wait for each other in a circle. An UPDATE … FROM alone would lock its rows in
    whatever order its plan visits them. A row another transaction changed meanwhile is
    judged again, as it is once locked (READ COMMITTED), by `held`'s conditions; the UPDATE
    finds it locked by this statement, unchanged since."""
    items = text(_ITEMS_SQL[dialect]).columns(
        column("id", BigInteger), column("lease_token", Text), column("result", Text)
    ).cte("items")
    conditions = transition_conditions(Transition.COMPLETE, fenced=True,
                                       key_to_confirm=key_to_confirm, alone=True,
                                       lease_token=items.c.lease_token)
    # The items' jobs looked up by id, whatever the statistics say: after a purge they may
    # count `jobs` nearly empty, and a join to the items was planned as a read of every job
    # the worker ever held (ix_jobs_worker_id_id) to hash against them. An id among the
    # bound ids (PostgreSQL) or in the items (SQLite: by rowid) is an index lookup per item.
    by_id = (jobs.c.id == any_(bindparam("ids", type_=ARRAY(BigInteger)))
             if dialect == "postgresql" else jobs.c.id.in_(select(items.c.id)))
    held_rows = (select(jobs.c.id).select_from(jobs.join(items, jobs.c.id == items.c.id))
                 .where(by_id, *conditions).order_by(jobs.c.id))
    if lock_rows:
        held_rows = held_rows.with_for_update(of=jobs)
    held = held_rows.cte("held")
    where = [jobs.c.id == items.c.id, jobs.c.id.in_(select(held.c.id))]
    if all_or_nothing:
        where.append(select(func.count()).select_from(held).scalar_subquery()
                     == bindparam("count"))
    values: dict[str, Any] = {
        name: bindparam(f"new_{name}")
        for name in sorted(Transition.COMPLETE.values(now_us=0, result=None))}
    values["result"] = items.c.result
    return update(jobs).where(*where).values(values).returning(*JOB_COLUMNS)


class CompleteManyRepository:
    """complete-many's one statement on the connection of a job repository, whose caller's
    key it confirms (KeyToConfirm) when it is the step's first."""

    def __init__(self, jobs_repo: JobRepository) -> None:
        self.jobs = jobs_repo
        self.conn = jobs_repo.conn

    def complete_held(self, items: Sequence[tuple[int, str, str | None]], *, worker: str,
                      now_us: int, all_or_nothing: bool) -> list[Job]:
        """Complete, in one statement, each of `items` (distinct job ids, each with its
        lease token and its stored result) that a lone complete would complete in its one
        statement (held by `worker` under that token, its lease live at `now_us`, running,
        its cancel not requested, no dependents, no key to settle); the jobs completed, by
        id. The caller's key, if one is to confirm, is folded in. `all_or_nothing`: all of
        them or none; in one-statement work, none runs the work again in a transaction
        (need_transaction)."""
        if not items:
            return []
        key = self.jobs.take_key_to_confirm()
        conn = self.conn
        stmt = _complete_held(conn.dialect.name, not writers_serialised(conn),
                              key is not None, all_or_nothing)
        values: Mapping[str, Any] = Transition.COMPLETE.values(now_us=now_us, result=None)
        params: dict[str, Any] = {
            "items": json.dumps([{"id": job_id, "lease_token": token, "result": result}
                                 for job_id, token, result in items]),
            "worker": worker, "now": now_us,
            **{f"new_{name}": value for name, value in values.items() if name != "result"}}
        if conn.dialect.name == "postgresql":  # the ids the jobs are looked up by
            params["ids"] = [job_id for job_id, _token, _result in items]
        if all_or_nothing:
            params["count"] = len(items)
        if key is not None:
            params[LIVE_KEY] = key.digest
        rows = conn.execute(stmt, params).all()
        if not rows and all_or_nothing:
            # Nothing changed: the work goes on in a transaction, which asks why, item by
            # item.
            need_transaction(conn)
        if key is not None:
            key.answered(bool(rows))
        return sorted(map(job_of, rows), key=lambda job: job.id)
