"""The SQL of a job's context (docs/API.md, Tags): its tags (job_tags) and the W3C trace context it
was enqueued with (job_traces), both beside the job row. A job without tags or trace has no
row here, so an enqueue without them writes nothing more than it did. Every method runs on
the transaction it is given."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import Connection, bindparam, delete, insert, select

from app.core.tracecontext import Trace
from app.storage.schema import job_tags, job_traces, jobs
from app.storage.statements import DriverStatement

# The trace a claim hands out with its job, read inside the claim's own UPDATE … RETURNING
# (as CHECKPOINT is, app/jobs/sql/control_repository.py): two look-ups by key, no statement of
# their own.
TRACE = (select(job_traces.c.traceparent).where(job_traces.c.job_id == jobs.c.id)
         .scalar_subquery(),
         select(job_traces.c.tracestate).where(job_traces.c.job_id == jobs.c.id)
         .scalar_subquery())

# Many rows in one call: on SQLite the driver's executemany, on PostgreSQL one statement
# (app/storage/statements.py). A multi-row VALUES built per call cost SQLite's serial write
# path a compile each time: three tags made an enqueue 1.8 times a plain one's time.
_insert_tags = DriverStatement(insert(job_tags))
_insert_traces = DriverStatement(insert(job_traces))


def trace_of(traceparent: str | None, tracestate: str | None) -> Trace | None:
    """The Trace of TRACE's two values (None: the job has none)."""
    return None if traceparent is None else Trace(traceparent, tracestate)


class JobContextRepository:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def add_tags(self, tags: Collection[tuple[int, str]]) -> None:
        """Store these (job_id, tag) rows, in one call."""
        _insert_tags.execute_many(self.conn, [{"job_id": job_id, "tag": tag}
                                              for job_id, tag in tags])

    def add_traces(self, traces: Collection[tuple[int, Trace]]) -> None:
        """Store each job's trace context, in one call."""
        _insert_traces.execute_many(self.conn, [
            {"job_id": job_id, "traceparent": trace.traceparent, "tracestate": trace.tracestate}
            for job_id, trace in traces])

    def tags_of(self, job_ids: Collection[int]) -> dict[int, tuple[str, ...]]:
        """The tags of these jobs, each job's sorted, by id; a job without any is left out."""
        if not job_ids:
            return {}
        stmt = (select(job_tags.c.job_id, job_tags.c.tag)
                .where(job_tags.c.job_id.in_(bindparam("ids", expanding=True)))
                .order_by(job_tags.c.job_id, job_tags.c.tag))
        found: dict[int, list[str]] = {}
        for job_id, tag in self.conn.execute(stmt, {"ids": sorted(job_ids)}):
            found.setdefault(job_id, []).append(tag)
        return {job_id: tuple(tags) for job_id, tags in found.items()}

    def traces_of(self, job_ids: Collection[int]) -> dict[int, Trace]:
        """The trace context of these jobs, by id; a job enqueued without one is left out."""
        if not job_ids:
            return {}
        stmt = (select(job_traces.c.job_id, job_traces.c.traceparent, job_traces.c.tracestate)
                .where(job_traces.c.job_id.in_(bindparam("ids", expanding=True))))
        return {job_id: Trace(traceparent, tracestate) for job_id, traceparent, tracestate
                in self.conn.execute(stmt, {"ids": sorted(job_ids)})}

    def delete_of(self, job_ids: Collection[int]) -> None:
        """These jobs' tags and trace (the jobs are being deleted)."""
        if not job_ids:
            return
        ids = {"ids": sorted(job_ids)}
        for table in (job_tags, job_traces):
            self.conn.execute(delete(table).where(
                table.c.job_id.in_(bindparam("ids", expanding=True))), ids)
