"""Every job's history as GET /jobs/{id}/attempts and /events tell it, read in bulk from a
database (for the end-to-end checks that read thousands of jobs at once): the rows stored in
job_attempts and job_events, with what each job's row tells (app/jobs/timeline/row_story.py)."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import select

from app.jobs.domain.history import Attempt, JobEvent
from app.jobs.domain.models import Job
from app.jobs.sql.job_rows import JOB_COLUMNS
from app.jobs.timeline.row_story import attempts_told, current_attempt, events_told
from app.storage.engine import Database, make_engine
from app.storage.schema import job_attempts, job_events

EVERY_EVENT = 1_000_000


def told_histories(database_url: str) -> dict[int, tuple[list[Attempt], list[JobEvent]]]:
    """By job id: its attempts and its events, oldest first."""
    database = Database(make_engine(database_url, pooled=False))
    try:
        with database.read() as conn:
            attempts: dict[int, list[Attempt]] = defaultdict(list)
            for row in conn.execute(select(job_attempts).order_by(job_attempts.c.job_id,
                                                                  job_attempts.c.number)):
                attempts[row.job_id].append(Attempt(*row))
            events: dict[int, list[JobEvent]] = defaultdict(list)
            for row in conn.execute(select(job_events).order_by(job_events.c.id)):
                events[row.job_id].append(JobEvent(*row))
            jobs = [Job(*row) for row in conn.execute(select(*JOB_COLUMNS))]
    finally:
        database.engine.dispose()
    return {job.id: (attempts_told(job, attempts[job.id]),
                     events_told(job, events[job.id], current_attempt(attempts[job.id]),
                                 EVERY_EVENT))
            for job in jobs}
