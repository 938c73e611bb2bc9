"""Job ids are never reused, on either engine, even after every job has been purged: a stored
`Location: /jobs/N` never comes to name another job. Databases made before the rule (schema
0003) keep their jobs when upgraded and never reuse their ids either."""

from __future__ import annotations

from alembic import command
from sqlalchemy import insert, inspect, select

from app import create_app, stop_maintenance
from app.core.callers import Role
from app.storage.engine import Database, make_engine
from app.storage.migrations import alembic_config
from app.storage.schema import jobs
from tests.conftest import JOB_TYPES, Api, Key


def _purge_everything(app, clock) -> int:
    # By hand alone: maintenance, whose retention moving the clock would run, is stopped.
    stop_maintenance(app)
    clock.advance(2 * 86_400)
    return app.extensions["queuelog"].jobs.purge(older_than_seconds=86_400)


def test_ids_are_never_reused_after_every_job_is_purged(app, api, producer, admin, clock):
    ids = [api.enqueue(producer).json["id"] for _ in range(3)]
    for job_id in ids:
        api.cancel(admin, job_id)
    assert _purge_everything(app, clock) == 3
    assert api.list(admin).json["jobs"] == []

    created = api.enqueue(producer)

    assert created.json["id"] > max(ids)
    assert created.headers["Location"] == f"/jobs/{created.json['id']}"


def _old_job_row(job_id: int, status: str) -> dict:
    return {"id": job_id, "type": "email", "payload": f'{{"n":{job_id}}}', "priority": 10,
            "status": status, "retry_count": 0, "max_retries": 3, "producer": "shop",
            "idempotency_key": f"k{job_id}", "request_fingerprint": None, "run_at": 0,
            "claimed_at": None, "worker_id": None, "lease_expires_at": None,
            "lease_token": None, "result": None, "error": None, "created_at": 0,
            "updated_at": 0}


def test_a_database_migrated_from_0003_keeps_its_jobs_and_never_reuses_their_ids(
        empty_db_url, clock):
    config = alembic_config(empty_db_url)
    command.upgrade(config, "0003")
    old_rows = [_old_job_row(1, "pending"), _old_job_row(5, "cancelled"),
                _old_job_row(9, "cancelled")]
    database = Database(make_engine(empty_db_url, pooled=False))
    with database.write() as conn:
        conn.execute(insert(jobs), old_rows)

    command.upgrade(config, "head")

    with database.read() as conn:
        kept = [dict(row._mapping) for row in conn.execute(select(jobs).order_by(jobs.c.id))]
        indexes = {index["name"] for index in inspect(conn).get_indexes("jobs")}
    database.engine.dispose()
    # Every column the 0003 schema had keeps its value; columns added since are empty.
    assert [{name: row[name] for name in old_rows[0]} for row in kept] == old_rows
    assert all(value is None for row in kept for name, value in row.items()
               if name not in old_rows[0])
    assert indexes == {index.name for index in jobs.indexes}
    app = create_app({"DATABASE_URL": empty_db_url, "JOB_TYPES": JOB_TYPES, "CLOCK": clock,
                      "TESTING": True})
    api = Api(app.test_client())
    admin = Key("ops", app.extensions["queuelog"].keys.create_key("ops", Role.ADMIN))
    producer = Key("shop", app.extensions["queuelog"].keys.create_key("shop", Role.PRODUCER))
    api.cancel(admin, 1)
    assert _purge_everything(app, clock) == 3

    assert api.enqueue(producer).json["id"] > 9
    app.extensions["queuelog"].db.engine.dispose()
