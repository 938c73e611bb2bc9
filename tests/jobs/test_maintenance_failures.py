"""A piece of maintenance the database refuses (here: a trigger that refuses one job's end)
never fails a request: claims of every type go on, the other jobs are swept, and the
failure shows in /readyz's `maintenance` detail and in /metrics (docs/OPERATIONS.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from app.jobs.usecases.maintenance import FIRST_RETRY_SECONDS
from tests.ops.scrape import Scrape


def run_sql(app: Any, *statements: str) -> None:
    with app.extensions["queuelog"].db.engine.begin() as conn:
        for statement in statements:
            conn.execute(text(statement))


@pytest.fixture
def refuse_end_of(app: Any, engine_name: str) -> Iterator[Any]:
    """refuse_end_of(job_id): the database refuses any change of that job out of running."""

    def refuse(job_id: int) -> None:
        if engine_name == "sqlite":
            run_sql(app, "CREATE TRIGGER refuse_end BEFORE UPDATE ON jobs "
                         f"WHEN OLD.id = {job_id} AND NEW.status <> 'running' "
                         "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
        else:
            run_sql(app,
                    "CREATE FUNCTION refuse_end() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$",
                    "CREATE TRIGGER refuse_end BEFORE UPDATE ON jobs FOR EACH ROW "
                    f"WHEN (OLD.id = {job_id} AND NEW.status <> 'running') "
                    "EXECUTE FUNCTION refuse_end()")

    yield refuse
    if engine_name == "sqlite":
        run_sql(app, "DROP TRIGGER IF EXISTS refuse_end")
    else:
        run_sql(app, "DROP TRIGGER IF EXISTS refuse_end ON jobs",
                "DROP FUNCTION IF EXISTS refuse_end()")


def test_a_lease_rescue_the_database_refuses_fails_no_claim_and_shows_in_readyz_and_metrics(
        app, api, producer, worker, admin, clock, refuse_end_of):
    poisoned = api.enqueue(producer, type="email", max_retries=0).json["id"]
    healthy = api.enqueue(producer, type="email", max_retries=0).json["id"]
    api.claim(worker, types=["email"], lease_seconds=30)
    api.claim(worker, types=["email"], lease_seconds=30)
    other = api.enqueue(producer, type="sync").json["id"]
    refuse_end_of(poisoned)
    clock.advance(60)

    claimed = api.claim(worker, types=["sync"])
    assert claimed.status_code == 200 and claimed.json["id"] == other
    # The round's batch was undone whole, then taken a job at a time.
    assert api.get(producer, healthy).json["status"] == "failed"
    assert api.get(producer, poisoned).json["status"] == "running"
    another = api.enqueue(producer, type="sync").json["id"]
    assert api.claim(worker, types=["sync"]).json["id"] == another

    ready = api.client.get("/readyz")
    assert ready.status_code == 200
    failing = ready.json["maintenance"]["failing"]
    assert set(failing) == {"lease_rescue"}
    assert failing["lease_rescue"]["held_back_jobs"] == 1
    assert failing["lease_rescue"]["failures"] >= 1
    assert "refused by the test" not in ready.get_data(as_text=True)
    assert any("lease_rescue" in warning for warning in ready.json["warnings"])
    metrics = Scrape(api.client.get("/metrics", headers=admin.headers).get_data(as_text=True))
    assert metrics.value("queuelog_maintenance_failures_total", chore="lease_rescue") >= 1

    # Once the database takes it, the job is rescued after its backoff, and all is well.
    run_sql(app, "DROP TRIGGER refuse_end" + ("" if "sqlite" in app.config["DATABASE_URL"]
                                              else " ON jobs"))
    time.sleep(FIRST_RETRY_SECONDS * 2 + 0.1)
    clock.advance(1)  # the next round
    assert api.get(producer, poisoned).json["status"] == "failed"
    assert api.client.get("/readyz").json["maintenance"]["failing"] == {}


def test_an_expiry_the_database_refuses_fails_no_claim(app, api, producer, worker, clock,
                                                       refuse_end_of):
    doomed = api.enqueue(producer, type="email", expires_in_seconds=30).json["id"]
    other = api.enqueue(producer, type="sync").json["id"]
    run_sql(app, "SELECT 1")
    refuse_end_of(doomed)
    clock.advance(60)

    assert api.claim(worker, types=["sync"]).json["id"] == other
    # Past its expiry, it is never handed out, swept or not.
    assert api.claim(worker, types=["email"]).status_code == 204
    assert api.get(producer, doomed).json["status"] == "pending"
    assert "expiry" in api.client.get("/readyz").json["maintenance"]["failing"]
