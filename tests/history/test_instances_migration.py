"""0030 (worker instances) on a database 0029 filled with jobs in every status, on both
engines: every stored job and attempt names no instance, a job running under 0029 is
reported on as before, new claims name theirs, and the way down drops the label alone."""

from __future__ import annotations

from typing import Any

from alembic import command
from sqlalchemy import column, inspect, table, text

from app import create_app
from app.core.callers import Role
from app.core.clock import MICROS, ManualClock
from app.storage.engine import make_engine
from app.storage.migrations import alembic_config, upgrade

START = 1_800_000_000_000_000
STATUSES = ("reserved", "waiting", "pending", "running", "suspended", "completed", "failed",
            "cancelled")
TOKEN = "0123456789abcdef0123456789abcdef.4"


def _job(status: str) -> dict[str, Any]:
    held = status in ("running", "completed", "failed")
    return {"type": "email", "payload": "{}", "priority": 10, "status": status,
            "retry_count": 0, "max_retries": 0 if status == "failed" else 3,
            "producer": "producer-1", "run_at": START - 60 * MICROS,
            "created_at": START - 60 * MICROS, "updated_at": START - 30 * MICROS,
            "claimed_at": START - 30 * MICROS if held else None,
            "worker_id": "worker-1" if held else None,
            "lease_expires_at": START + 600 * MICROS if status == "running" else None,
            "claimed_until": START + 600 * MICROS if status == "running" else None,
            "lease_token": TOKEN if status == "running" else None,
            "error": "it broke" if status == "failed" else None}


def _statuses(conn: Any) -> list[tuple[int, str]]:
    return [tuple(row) for row in conn.execute(text("SELECT id, status FROM jobs ORDER BY id"))]


def test_jobs_of_every_status_stored_before_0030_name_no_instance_and_run_on(empty_db_url):
    upgrade(empty_db_url, "0029")
    engine = make_engine(empty_db_url, pooled=False)
    rows = [_job(status) for status in STATUSES]
    with engine.begin() as conn:
        conn.execute(table("jobs", *map(column, rows[0])).insert(), rows)
        # The failed job's attempt, stored as 0029 stored it.
        conn.execute(table("job_attempts", column("job_id"), column("number"),
                           column("worker_id"), column("claimed_at"), column("ended_at"),
                           column("outcome"), column("error")).insert(),
                     [{"job_id": 7, "number": 1, "worker_id": "worker-1",
                       "claimed_at": START - 30 * MICROS, "ended_at": START - 20 * MICROS,
                       "outcome": "failed", "error": "it broke"}])
        conn.execute(table("key_activity", column("name"), column("last_seen_at")).insert(),
                     [{"name": "worker-1", "last_seen_at": START - 30 * MICROS}])
        before = _statuses(conn)
    assert [status for _id, status in before] == list(STATUSES)

    upgrade(empty_db_url)

    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM jobs WHERE worker_instance IS NOT NULL")
                            ).scalar() == 0
        assert conn.execute(text("SELECT worker_instance FROM job_attempts")).all() == [(None,)]
        assert conn.execute(text("SELECT count(*) FROM worker_instances")).scalar() == 0
        assert _statuses(conn) == before
    application = create_app({"TESTING": True, "DATABASE_URL": empty_db_url,
                              "JOB_TYPES": frozenset({"email"}), "DB_POOL_SIZE": 2,
                              "CLOCK": ManualClock(start_us=START)})
    services = application.extensions["queuelog"]
    worker = {"Authorization": f"Bearer {services.keys.create_key('worker-1', Role.WORKER)}"}
    admin = {"Authorization": f"Bearer {services.keys.create_key('admin-1', Role.ADMIN)}"}
    client = application.test_client()

    def attempts(job_id: int) -> list[tuple[str, str | None, str]]:
        shown = client.get(f"/jobs/{job_id}/attempts", headers=admin).json["attempts"]
        return [(a["worker_id"], a["worker_instance"], a["outcome"]) for a in shown]

    assert attempts(4) == [("worker-1", None, "running")]
    assert attempts(6) == [("worker-1", None, "completed")]
    assert attempts(7) == [("worker-1", None, "failed")]
    # The job running under 0029 is reported on as before: its key and token say who.
    done = client.post("/jobs/4/complete", json={"lease_token": TOKEN}, headers=worker)
    assert done.status_code == 200, done.json
    assert attempts(4) == [("worker-1", None, "completed")]
    claimed = client.post("/jobs/claim", json={"instance": "host-a:1"}, headers=worker).json
    assert claimed["id"] == 3
    assert attempts(3) == [("worker-1", "host-a:1", "running")]
    [listed] = client.get("/workers", headers=admin).json["workers"]
    assert [(i["instance"], i["running"]) for i in listed["instances"]] == [("host-a:1", 1)]
    services.close()

    command.downgrade(alembic_config(empty_db_url), "0029")
    names = inspect(engine)
    assert "worker_instance" not in {c["name"] for c in names.get_columns("jobs")}
    assert "worker_instance" not in {c["name"] for c in names.get_columns("job_attempts")}
    assert "worker_instances" not in names.get_table_names()
    with engine.connect() as conn:
        assert _statuses(conn) == [(id_, {3: "running", 4: "completed"}.get(id_, status))
                                   for id_, status in before]
        assert conn.execute(text("SELECT count(*) FROM job_attempts")).scalar() == 1
        assert conn.execute(text("SELECT count(*) FROM key_activity")).scalar() == 1
    engine.dispose()
