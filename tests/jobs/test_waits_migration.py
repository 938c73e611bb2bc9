"""0026 (waits) on a database 0025 filled, on both engines: the stored jobs keep their rows and
their unique keys, the upgraded service suspends and resumes one of them, and the way down
makes a suspended job pending (an older release would never run it) and drops the tables."""

from __future__ import annotations

from typing import Any

import pytest
from alembic import command
from sqlalchemy import column, table, text
from sqlalchemy.exc import IntegrityError

from app import create_app
from app.core.callers import Role
from app.core.clock import ManualClock
from app.storage.engine import make_engine
from app.storage.migrations import alembic_config, upgrade


def _job(status: str, **extra: Any) -> dict[str, Any]:
    return {"type": "email", "payload": "{}", "priority": 10, "retry_count": 0,
            "max_retries": 3, "producer": "producer-1", "run_at": 0, "created_at": 1,
            "updated_at": 2, "status": status, "unique_scope": None, "unique_while": None,
            **extra}


def test_stored_jobs_survive_the_waits_migration_and_can_wait_after_it(empty_db_url):
    upgrade(empty_db_url, "0025")
    engine = make_engine(empty_db_url, pooled=False)
    with engine.begin() as conn:  # the tables as 0025 left them
        jobs = [_job("completed"), _job("failed"),
                # A unique job held while pending or running (bits 1 | 2).
                _job("pending", unique_scope="scope-1", unique_while=3)]
        conn.execute(table("jobs", *map(column, jobs[0])).insert(), jobs)

    def stored(query: str) -> list[tuple[Any, ...]]:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(query))]

    upgrade(empty_db_url)

    assert stored("SELECT id, status, resumed FROM jobs ORDER BY id") == [
        (1, "completed", None), (2, "failed", None), (3, "pending", None)]
    # The unique index still holds the key it held.
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(table("jobs", *map(column, jobs[0])).insert(),
                     [_job("pending", unique_scope="scope-1", unique_while=3)])

    clock = ManualClock(start_us=1_800_000_000_000_000)
    application = create_app({"TESTING": True, "DATABASE_URL": empty_db_url,
                              "JOB_TYPES": frozenset({"email"}), "DB_POOL_SIZE": 2,
                              "CLOCK": clock})
    services = application.extensions["queuelog"]
    worker = {"Authorization": f"Bearer {services.keys.create_key('worker-1', Role.WORKER)}"}
    client = application.test_client()
    claimed = client.post("/jobs/claim", json={}, headers=worker).json
    assert claimed["id"] == 3
    suspended = client.post(f"/jobs/{claimed['id']}/suspend", headers=worker, json={
        "lease_token": claimed["lease_token"], "seconds": 60})
    assert suspended.json["status"] == "suspended"
    # Suspended, it still holds its unique key, as running did.
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(table("jobs", *map(column, jobs[0])).insert(),
                     [_job("pending", unique_scope="scope-1", unique_while=3)])
    services.db.engine.dispose()

    command.downgrade(alembic_config(empty_db_url), "0025")

    assert stored("SELECT id, status FROM jobs ORDER BY id") == [
        (1, "completed"), (2, "failed"), (3, "pending")]
    with engine.connect() as conn:
        tables = set(engine.dialect.get_table_names(conn))
    assert not {"job_waits", "posted_events"} & tables
    engine.dispose()
