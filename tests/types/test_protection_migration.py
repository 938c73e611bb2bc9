"""0028 (a type that protects itself) on a database 0027 filled, on both engines: the stored
types keep their settings, with no breaker nor budget, the upgraded service opens a circuit
of one and budgets its retries, and the way down drops what it added."""

from __future__ import annotations

from typing import Any

from alembic import command
from sqlalchemy import column, inspect, table, text

from app import create_app
from app.core.callers import Role
from app.core.clock import ManualClock
from app.storage.engine import make_engine
from app.storage.migrations import alembic_config, upgrade


def test_stored_types_survive_the_migration_and_can_protect_themselves_after_it(empty_db_url):
    upgrade(empty_db_url, "0027")
    engine = make_engine(empty_db_url, pooled=False)
    with engine.begin() as conn:  # a type as 0027 left it, and its jobs
        conn.execute(table("job_types", column("type"), column("paused"),
                           column("max_running"), column("updated_at")).insert(),
                     [{"type": "email", "paused": False, "max_running": 7, "updated_at": 1}])
        job: dict[str, Any] = {"type": "email", "payload": "{}", "priority": 10,
                               "retry_count": 0, "max_retries": 3, "producer": "producer-1",
                               "run_at": 0, "created_at": 1, "updated_at": 2,
                               "status": "pending"}
        conn.execute(table("jobs", *map(column, job)).insert(), [job, job])

    upgrade(empty_db_url)

    with engine.connect() as conn:
        assert conn.execute(text(
            "SELECT max_running, circuit, circuit_state, retry_budget FROM job_types")
        ).all() == [(7, None, None, None)]
    clock = ManualClock(start_us=1_800_000_000_000_000)
    application = create_app({"TESTING": True, "DATABASE_URL": empty_db_url,
                              "JOB_TYPES": frozenset({"email"}), "DB_POOL_SIZE": 2,
                              "CLOCK": clock})
    services = application.extensions["queuelog"]
    worker = {"Authorization": f"Bearer {services.keys.create_key('worker-1', Role.WORKER)}"}
    admin = {"Authorization": f"Bearer {services.keys.create_key('admin-1', Role.ADMIN)}"}
    client = application.test_client()
    changed = client.patch("/types/email", headers=admin, json={
        "circuit": {"min_attempts": 1}, "retry_budget": {"minimum": 1, "ratio": 0}})
    assert changed.json["max_running"] == 7 and changed.json["circuit"]["min_attempts"] == 1
    claimed = client.post("/jobs/claim-many", json={"max_jobs": 2}, headers=worker).json["jobs"]
    runs = [client.post(f"/jobs/{job['id']}/fail", headers=worker,
                        json={"lease_token": job["lease_token"], "error": "down",
                              "retry_in_seconds": 0}).json["run_at"] for job in claimed]
    assert runs[0] < runs[1]  # one retry a minute
    services.protection.tick()
    assert client.get("/types/email", headers=admin).json["circuit_state"]["state"] == "open"
    services.close()

    command.downgrade(alembic_config(empty_db_url), "0027")
    names = inspect(engine)
    assert {"type_tallies", "push_origins"}.isdisjoint(names.get_table_names())
    assert "circuit" not in {c["name"] for c in names.get_columns("job_types")}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT max_running FROM job_types")).scalar() == 7
        assert conn.execute(text("SELECT count(*) FROM jobs")).scalar() == 2
    engine.dispose()
