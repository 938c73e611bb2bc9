"""Reading a job's history: its attempts and its events, for the callers who may see them."""

from __future__ import annotations

from app.db import Database
from app.history.models import Attempt, JobEvent
from app.history.repository import HistoryRepository
from app.jobs.service import JobService
from app.keys.models import Caller

# A timeline holds one event per change of the job and at most MAX_REFUSALS_KEPT refusals;
# a listing stops here all the same, so that no answer grows without bound.
MAX_EVENTS_SHOWN = 1000


class HistoryService:
    def __init__(self, db: Database, jobs: JobService) -> None:
        self.db = db
        self.jobs = jobs

    def attempts(self, caller: Caller, job_id: int) -> list[Attempt]:
        """The job's attempts, oldest first; NotFound when the caller may not see the job."""
        self.jobs.get_job(caller, job_id)
        with self.db.read() as conn:
            return HistoryRepository(conn).attempts_of(job_id)

    def events(self, caller: Caller, job_id: int) -> list[JobEvent]:
        """The job's events, oldest first; NotFound when the caller may not see the job."""
        self.jobs.get_job(caller, job_id)
        with self.db.read() as conn:
            return HistoryRepository(conn).events_of(job_id, MAX_EVENTS_SHOWN)
