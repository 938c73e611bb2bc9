"""0021 (keys per producer) on a database 0020 filled, on both engines: the turns of ordered
keys are made again per producer (another producer's delayed job and blocking failure stop
holding a key string's other jobs, each producer's key keeping its own order and block), a
fair type's pending jobs are numbered again per producer, and the way down shares the keys
again."""

from __future__ import annotations

from typing import Any

from alembic import command
from sqlalchemy import column, select, table, text

from app import create_app
from app.core.callers import Role
from app.core.clock import ManualClock
from app.storage.engine import make_engine
from app.storage.migrations import alembic_config, upgrade

NOW = 1_800_000_000_000_000
YEAR_US = 365 * 24 * 3600 * 1_000_000


def _job(job_id: int, job_type: str, producer: str, status: str, key: str, *,
         run_at: int = 0, fair_round: int | None = None) -> dict[str, Any]:
    return {"id": job_id, "type": job_type, "payload": "{}", "priority": 10, "status": status,
            "retry_count": 0, "max_retries": 0, "producer": producer, "run_at": run_at,
            "claimed_at": None, "worker_id": None, "lease_expires_at": None,
            "lease_token": None, "error": None, "created_at": job_id, "updated_at": job_id,
            "concurrency_key": key, "fair_round": fair_round}


def _fill_0020(url: str) -> None:
    jobs = [
        # email, ordered, block: cust-1's turn is shop-b's job delayed a year ...
        _job(1, "email", "shop-b", "pending", "cust-1", run_at=NOW + YEAR_US),
        _job(2, "email", "shop-b", "waiting", "cust-1"),
        _job(3, "email", "shop-a", "waiting", "cust-1"),
        # ... and cust-2's is shop-b's failure, which blocks it.
        _job(4, "email", "shop-b", "failed", "cust-2"),
        _job(5, "email", "shop-a", "waiting", "cust-2"),
        _job(6, "email", "shop-b", "waiting", "cust-2"),
        # report, fair: shop-b's six keys all in round 0, before shop-a's one key.
        *(_job(7 + n, "report", "shop-b", "pending", f"r-{n}", fair_round=0) for n in range(6)),
        _job(13, "report", "shop-a", "pending", "mine", fair_round=0),
        _job(14, "report", "shop-a", "pending", "mine", fair_round=1),
    ]
    types = [{"type": "email", "paused": False, "updated_at": 1, "ordering": "key",
              "on_failure": "block"},
             {"type": "report", "paused": False, "updated_at": 1, "fairness": "key"}]
    turns = [{"type": "email", "concurrency_key": "cust-1", "job_id": 1, "blocked": 0,
              "since": 1},
             {"type": "email", "concurrency_key": "cust-2", "job_id": 4, "blocked": 1,
              "since": 4}]
    engine = make_engine(url, pooled=False)
    with engine.begin() as conn:
        conn.execute(table("jobs", *map(column, jobs[0])).insert(), jobs)
        for row in types:
            conn.execute(table("job_types", *map(column, row)).insert(), [row])
        conn.execute(table("key_turns", *map(column, turns[0])).insert(), turns)
    engine.dispose()


def _statuses(url: str) -> dict[int, str]:
    engine = make_engine(url, pooled=False)
    with engine.connect() as conn:
        found = {job_id: status for job_id, status in conn.execute(
            text("SELECT id, status FROM jobs WHERE type = 'email'"))}
    engine.dispose()
    return found


def test_keys_per_producer_migration_frees_each_producers_keys_and_numbers_fairly(
        empty_db_url):
    upgrade(empty_db_url, "0020")
    _fill_0020(empty_db_url)

    upgrade(empty_db_url)

    statuses = _statuses(empty_db_url)
    # shop-a's jobs of both key strings are their own keys' turns now; shop-b's stay held.
    assert statuses == {1: "pending", 2: "waiting", 3: "pending", 4: "failed",
                        5: "pending", 6: "waiting"}

    command.downgrade(alembic_config(empty_db_url), "0020")
    assert _statuses(empty_db_url) == {1: "pending", 2: "waiting", 3: "waiting",
                                       4: "failed", 5: "waiting", 6: "waiting"}
    engine = make_engine(empty_db_url, pooled=False)
    with engine.connect() as conn:
        kept = sorted(tuple(row) for row in conn.execute(
            select(table("key_turns", column("concurrency_key"), column("job_id"),
                         column("blocked")))))
    engine.dispose()
    assert kept == [("cust-1", 1, 0), ("cust-2", 4, 1)]

    upgrade(empty_db_url)
    clock = ManualClock(start_us=NOW)
    application = create_app({"TESTING": True, "DATABASE_URL": empty_db_url,
                              "JOB_TYPES": frozenset({"email", "report"}), "CLOCK": clock,
                              "DB_POOL_SIZE": 2, "TYPE_COUNTS_MAX_AGE_SECONDS": 0})
    services = application.extensions["queuelog"]
    admin = {"Authorization": f"Bearer {services.keys.create_key('admin-1', Role.ADMIN)}"}
    worker = {"Authorization": f"Bearer {services.keys.create_key('worker-1', Role.WORKER)}"}
    client = application.test_client()

    def claim(job_type: str) -> int | None:
        answer = client.post("/jobs/claim", json={"types": [job_type]}, headers=worker)
        return None if answer.status_code == 204 else int(answer.json["id"])

    # Fair: one producer's turn, then the other's: shop-a's two jobs in the first four.
    assert {13, 14} <= {claim("report") for _ in range(4)}
    # Ordered: shop-a's two keys run; shop-b's cust-2 is still blocked by its failure.
    assert {claim("email"), claim("email")} == {3, 5}
    assert claim("email") is None
    email = next(t for t in client.get("/types", headers=admin).json["types"]
                 if t["type"] == "email")
    assert email["blocked_keys"] == 1 and email["key_scope"] == "producer"
    assert client.post("/jobs/4/retry", headers=admin).status_code == 200
    assert claim("email") == 4
    services.db.engine.dispose()
