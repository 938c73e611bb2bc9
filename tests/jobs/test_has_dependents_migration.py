"""0024 on a database 0022 filled, on both engines: the jobs an edge not yet applied waits on
are flagged as having dependents (and no other job is), so the upgraded service still releases
their dependents when they end; the way down drops the flag and keeps the jobs."""

from __future__ import annotations

from typing import Any

from alembic import command
from sqlalchemy import column, table, text

from app import create_app
from app.core.callers import Role
from app.core.clock import ManualClock
from app.storage.engine import make_engine
from app.storage.migrations import alembic_config, upgrade


def _job(status: str) -> dict[str, Any]:
    return {"type": "email", "payload": "{}", "priority": 10, "retry_count": 0,
            "max_retries": 3, "producer": "producer-1", "run_at": 0, "created_at": 1,
            "updated_at": 2, "status": status}


def _edge(job_id: int, depends_on_id: int, resolved: int) -> dict[str, Any]:
    return {"job_id": job_id, "position": 0, "depends_on_id": depends_on_id,
            "cancel_on_failure": 1, "resolved": resolved}


def test_the_jobs_with_dependents_are_flagged_and_still_release_them(empty_db_url):
    upgrade(empty_db_url, "0022")
    engine = make_engine(empty_db_url, pooled=False)
    with engine.begin() as conn:  # the tables as 0022 left them
        jobs = [_job("pending"), _job("waiting"), _job("completed"), _job("pending"),
                _job("pending")]
        conn.execute(table("jobs", *map(column, jobs[0])).insert(), jobs)
        # 2 waits on 1 (not applied yet); 4 waited on 3, which completed (applied).
        edges = [_edge(2, 1, 0), _edge(4, 3, 1)]
        conn.execute(table("job_dependencies", *map(column, edges[0])).insert(), edges)

    def stored(query: str) -> list[tuple[Any, ...]]:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(query))]

    upgrade(empty_db_url)

    assert stored("SELECT id, has_dependents FROM jobs ORDER BY id") == [
        (1, 1), (2, None), (3, None), (4, None), (5, None)]
    application = create_app({"TESTING": True, "DATABASE_URL": empty_db_url,
                              "JOB_TYPES": frozenset({"email"}), "DB_POOL_SIZE": 2,
                              "CLOCK": ManualClock(start_us=1_800_000_000_000_000)})
    services = application.extensions["queuelog"]
    worker = {"Authorization": f"Bearer {services.keys.create_key('worker-1', Role.WORKER)}"}
    client = application.test_client()
    assert client.post("/jobs/claim", json={}, headers=worker).json["id"] == 1
    assert client.post("/jobs/1/complete", json={"result": {}}, headers=worker).status_code == 200
    assert stored("SELECT status FROM jobs WHERE id = 2") == [("pending",)]
    services.db.engine.dispose()

    command.downgrade(alembic_config(empty_db_url), "0022")

    assert stored("SELECT id, status FROM jobs ORDER BY id") == [
        (1, "completed"), (2, "pending"), (3, "completed"), (4, "pending"), (5, "pending")]
    with engine.connect() as conn:
        columns = [row[0] for row in conn.execute(text(
            "SELECT name FROM pragma_table_info('jobs')" if engine.dialect.name == "sqlite"
            else "SELECT column_name FROM information_schema.columns "
                 "WHERE table_name = 'jobs'"))]
    assert "has_dependents" not in columns and "fair_key_round" in columns
    engine.dispose()
