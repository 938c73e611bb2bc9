"""0029 (priority aging) on a database 0028 filled, on both engines: the stored types keep
their settings with no aging, the jobs already pending age once the type is given
aging_seconds (nothing is stored per job), and the way down drops the setting alone."""

from __future__ import annotations

from typing import Any

from alembic import command
from sqlalchemy import column, inspect, table, text

from app import create_app
from app.core.callers import Role
from app.core.clock import MICROS, ManualClock
from app.core.priorities import Priority
from app.storage.engine import make_engine
from app.storage.migrations import alembic_config, upgrade

START = 1_800_000_000_000_000


def test_jobs_stored_before_the_migration_age_once_their_type_does(empty_db_url):
    upgrade(empty_db_url, "0028")
    engine = make_engine(empty_db_url, pooled=False)
    with engine.begin() as conn:  # a type and its jobs as 0028 left them
        conn.execute(table("job_types", column("type"), column("paused"), column("max_running"),
                           column("retry_budget"), column("updated_at")).insert(),
                     [{"type": "email", "paused": False, "max_running": 7,
                       "retry_budget": '{"minimum":10,"ratio":0.2,"window_seconds":60}',
                       "updated_at": 1}])

        def job(priority: int, created_at: int) -> dict[str, Any]:
            return {"type": "email", "payload": "{}", "priority": priority, "retry_count": 0,
                    "max_retries": 3, "producer": "producer-1", "run_at": created_at,
                    "created_at": created_at, "updated_at": created_at, "status": "pending"}

        # A low job an hour old, then a high one a minute old.
        conn.execute(table("jobs", *map(column, job(0, 0))).insert(),
                     [job(Priority.LOW, START - 3600 * MICROS),
                      job(Priority.HIGH, START - 60 * MICROS)])

    upgrade(empty_db_url)

    with engine.connect() as conn:
        assert conn.execute(text("SELECT max_running, aging_seconds FROM job_types")
                            ).all() == [(7, None)]
    application = create_app({"TESTING": True, "DATABASE_URL": empty_db_url,
                              "JOB_TYPES": frozenset({"email"}), "DB_POOL_SIZE": 2,
                              "CLOCK": ManualClock(start_us=START)})
    services = application.extensions["queuelog"]
    worker = {"Authorization": f"Bearer {services.keys.create_key('worker-1', Role.WORKER)}"}
    admin = {"Authorization": f"Bearer {services.keys.create_key('admin-1', Role.ADMIN)}"}
    client = application.test_client()
    changed = client.patch("/types/email", headers=admin, json={"aging_seconds": 1200})
    assert changed.json["aging_seconds"] == 1200 and changed.json["max_running"] == 7
    assert changed.json["retry_budget"]["minimum"] == 10
    # The low job waited three intervals: high since 40 minutes ago, before the high one.
    claimed = client.post("/jobs/claim", json={}, headers=worker).json
    assert claimed["priority"] == "low"
    services.close()

    command.downgrade(alembic_config(empty_db_url), "0028")
    names = inspect(engine)
    assert "aging_seconds" not in {c["name"] for c in names.get_columns("job_types")}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT max_running FROM job_types")).scalar() == 7
        assert conn.execute(text("SELECT count(*) FROM jobs")).scalar() == 2
    engine.dispose()
