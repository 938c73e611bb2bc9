"""A job's end applied to many dependents in bounded steps (docs/WORKFLOWS.md): no statement
grows with what a producer stored, no transaction holds the write lock for the whole
cascade, and between steps no dependent is claimable while a dependency it needs is
unfinished. The large graphs are stored with SQL (a bulk load), the ends go through HTTP.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from app import create_app
from app.jobs.tx.dependencies import STEP_EDGES, STEP_LEVELS
from app.jobs.tx.uow import CASCADE_LEFT


@pytest.fixture
def many(engine_name: str) -> int:
    """Dependents of one end: on PostgreSQL past its 65,535 bind parameters, so that one
    list of them in one statement cannot be sent at all; on SQLite (whose limit is 250,000)
    enough for many steps, which the bounded-step tests below show one by one."""
    return 66_000 if engine_name == "postgresql" else 6_000

_JOB_COLUMNS = ("type, payload, priority, status, retry_count, max_retries, producer, run_at, "
                "created_at, updated_at")


def sql(app: Any, statement: str, **params: Any) -> list[Any]:
    with app.extensions["queuelog"].db.engine.begin() as conn:
        result = conn.execute(text(statement), params)
        return list(result.all()) if result.returns_rows else []


def bulk_jobs(app: Any, count: int, *, status: str, job_type: str = "pdf",
              expires_at: int | None = None) -> list[int]:
    """Store `count` jobs of producer-1 in one statement; their ids, in order."""
    before = sql(app, "SELECT COALESCE(MAX(id), 0) FROM jobs")[0][0]
    sql(app, f"INSERT INTO jobs ({_JOB_COLUMNS}, expires_at) "  # noqa: S608
             "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :count) "
             "SELECT :type, '{}', 10, :status, 0, 0, 'producer-1', 0, 1, 1, :expires_at FROM n",
        count=count, type=job_type, status=status, expires_at=expires_at)
    return [row[0] for row in sql(app, "SELECT id FROM jobs WHERE id > :before ORDER BY id",
                                  before=before)]


def bulk_edges(app: Any, dependents: list[int], dependency_of: Any, *,
               cancel_on_failure: bool = True) -> None:
    """Each dependent waits on `dependency_of(index)`: stored in one statement per chunk."""
    for first in range(0, len(dependents), 20_000):
        chunk = dependents[first:first + 20_000]
        values = ", ".join(f"({job_id}, 0, {dependency_of(first + i)}, "
                           f"{int(cancel_on_failure)}, 0)" for i, job_id in enumerate(chunk))
        sql(app, "INSERT INTO job_dependencies (job_id, position, depends_on_id, "  # noqa: S608
                 f"cancel_on_failure, resolved) VALUES {values}")
    # As the app stores an edge: its dependency flagged as having dependents.
    sql(app, "UPDATE jobs SET has_dependents = 1 WHERE has_dependents IS NULL AND id IN "
             "(SELECT depends_on_id FROM job_dependencies WHERE resolved = 0)")
    if "postgresql" in app.config["DATABASE_URL"]:
        # What autovacuum would soon do after such a load: the planners see the rows.
        sql(app, "ANALYZE jobs")
        sql(app, "ANALYZE job_dependencies")


def counts(app: Any, ids: list[int]) -> dict[str, int]:
    rows = sql(app, "SELECT status, COUNT(*) FROM jobs WHERE id BETWEEN :low AND :high "
                    "GROUP BY status", low=min(ids), high=max(ids))
    return {status: int(count) for status, count in rows}


def claimable_with_unfinished_dependency(app: Any) -> int:
    """Pending or running jobs one of whose dependencies is not completed while they do not
    run on failure: what must never be, at any commit."""
    return int(sql(app, """
        SELECT COUNT(*) FROM jobs j JOIN job_dependencies d ON d.job_id = j.id
        JOIN jobs dep ON dep.id = d.depends_on_id
        WHERE j.status IN ('pending', 'running')
          AND (dep.status NOT IN ('completed', 'failed', 'cancelled') OR d.resolved = 0)
    """)[0][0])


def settle(app: Any, dependents: list[int], status: str, engine_name: str) -> None:
    """Go on with the cascades under way, and check what they did: on SQLite to the end; on
    PostgreSQL (66,000 dependents: hundreds of steps) for a few ticks, each making progress
    without a failure (the first test of this module goes to the end there)."""
    jobs = app.extensions["queuelog"].jobs
    if engine_name == "sqlite":
        jobs.cascades.go_on(None)
        assert counts(app, dependents) == {status: len(dependents)}
        assert cascades_under_way(app) == 0
    else:
        for _tick in range(3):
            before = counts(app, dependents).get(status, 0)
            jobs.cascades.chore()
            assert counts(app, dependents).get(status, 0) > before
    assert jobs.maintenance.failing() == {}
    assert claimable_with_unfinished_dependency(app) == 0


def cascades_under_way(app: Any) -> int:
    return int(sql(app, "SELECT COUNT(*) FROM dependency_cascades")[0][0])


@pytest.fixture
def one_step_a_transaction(app: Any) -> Any:
    """The cascade's next steps are left to the test (the service takes them right after
    the commit that left them): each step is then one call of Cascades.step."""
    jobs = app.extensions["queuelog"].jobs
    jobs.uow.signals[CASCADE_LEFT] = lambda: None
    return jobs.cascades


def test_a_root_with_more_dependents_than_a_statement_can_bind_completes_and_claims_go_on(
        app, api, producer, worker, many):
    root = api.enqueue(producer, type="email").json["id"]
    other = api.enqueue(producer, type="sync").json["id"]
    assert api.claim(worker, types=["email"]).json["id"] == root
    dependents = bulk_jobs(app, many, status="waiting")
    bulk_edges(app, dependents, lambda _i: root)

    assert api.complete(worker, root, result={}).status_code == 200
    assert api.claim(worker, types=["sync"]).json["id"] == other
    assert claimable_with_unfinished_dependency(app) == 0
    app.extensions["queuelog"].jobs.cascades.go_on(None)

    assert counts(app, dependents) == {"pending": many}
    assert cascades_under_way(app) == 0
    assert api.get(producer, dependents[-1]).json["waiting_on"] == 0


def claim_all(api: Any, worker: Any, job_type: str) -> list[int]:
    """Claim every job of the type a claim may take now; their ids."""
    taken: list[int] = []
    while batch := api.client.post("/jobs/claim-many", json={"types": [job_type],
                                                               "max_jobs": 100},
                                   headers=worker.headers).json["jobs"]:
        taken += [job["id"] for job in batch]
    return taken


def test_a_completed_root_releases_its_fan_out_a_bounded_step_per_transaction(
        app, api, producer, worker, one_step_a_transaction):
    root = api.enqueue(producer, type="email").json["id"]
    api.claim(worker, types=["email"])
    dependents = bulk_jobs(app, 5 * STEP_EDGES + 7, status="waiting")
    bulk_edges(app, dependents, lambda _i: root)

    assert api.complete(worker, root, result={}).status_code == 200
    assert counts(app, dependents) == {"pending": STEP_EDGES,
                                       "waiting": 4 * STEP_EDGES + 7}
    # Between steps: what is released may run, the rest waits and is never handed out.
    assert sorted(claim_all(api, worker, "pdf")) == dependents[:STEP_EDGES]
    steps = 0
    while one_step_a_transaction.step():
        steps += 1
        assert claimable_with_unfinished_dependency(app) == 0
        assert len(claim_all(api, worker, "pdf")) <= STEP_EDGES
    assert steps == 5
    assert counts(app, dependents) == {"running": 5 * STEP_EDGES + 7}
    assert cascades_under_way(app) == 0


def test_cancelling_the_root_of_a_deep_chain_goes_down_it_a_bounded_step_at_a_time(
        app, api, producer, admin, one_step_a_transaction):
    depth = 10 * STEP_LEVELS
    chain = bulk_jobs(app, depth, status="waiting")
    root = api.enqueue(producer, type="email").json["id"]
    bulk_edges(app, chain, lambda i: root if i == 0 else chain[i - 1])

    assert api.cancel(admin, root).status_code == 200
    assert counts(app, chain) == {"cancelled": STEP_LEVELS, "waiting": depth - STEP_LEVELS}
    steps = 0
    while one_step_a_transaction.step():
        steps += 1
        assert counts(app, chain).get("cancelled", 0) <= (steps + 1) * STEP_LEVELS
    assert counts(app, chain) == {"cancelled": depth}
    last = api.client.get(f"/jobs/{chain[-1]}/events", headers=admin.headers).json["events"]
    assert last[-1]["detail"] == {"dependency": chain[-2], "dependency_status": "cancelled"}


def test_a_retried_root_does_not_revive_what_its_cascade_has_still_to_cancel(
        app, api, producer, worker, admin, one_step_a_transaction):
    """The edges left apply the end the root had, whatever the root does since."""
    root = api.enqueue(producer, type="email", max_retries=0).json["id"]
    api.claim(worker, types=["email"])
    dependents = bulk_jobs(app, 2 * STEP_EDGES, status="waiting")
    bulk_edges(app, dependents, lambda _i: root)
    api.fail(worker, root)
    assert api.retry(admin, root).status_code == 200
    app.extensions["queuelog"].jobs.cascades.go_on(None)
    assert counts(app, dependents) == {"cancelled": 2 * STEP_EDGES}


def test_roots_expiring_together_with_many_dependents_cancel_them_and_claims_go_on(
        app, api, producer, worker, clock, many, engine_name):
    expires_at = clock.now_us() + 60_000_000
    roots = bulk_jobs(app, 66, status="pending", job_type="email", expires_at=expires_at)
    dependents = bulk_jobs(app, many, status="waiting")
    bulk_edges(app, dependents, lambda i: roots[i % 66])
    other = api.enqueue(producer, type="sync").json["id"]
    clock.advance(120)

    assert api.claim(worker, types=["sync"]).json["id"] == other
    assert counts(app, roots) == {"cancelled": 66}
    settle(app, dependents, "cancelled", engine_name)


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    # A batch naming 100,000 dependencies is about 800 KB of JSON.
    return {**app_config, "MAX_CONTENT_LENGTH": 4 * 1024 * 1024}


@pytest.mark.parametrize("route", ["/jobs/batch", "/workflows"])
def test_a_batch_of_1000_jobs_each_naming_100_distinct_dependencies_is_stored(
        app, api, producer, worker, route):
    dependencies = bulk_jobs(app, 100_000, status="pending", job_type="email")
    items = [{"type": "pdf", "depends_on": dependencies[i * 100:(i + 1) * 100]}
             for i in range(1000)]
    if route == "/workflows":
        for i, item in enumerate(items):
            item["ref"] = f"r{i}"
    made = api.client.post(route, json={"jobs": items}, headers=producer.headers)

    assert made.status_code == 201, made.json
    stored = sql(app, "SELECT COUNT(*), COUNT(DISTINCT depends_on_id) FROM job_dependencies")
    assert tuple(stored[0]) == (100_000, 100_000)
    new = sql(app, "SELECT id FROM jobs WHERE type = 'pdf' ORDER BY id")
    assert counts(app, [row[0] for row in new]) == {"waiting": 1000}


def test_a_workflow_cancel_with_many_outside_dependents_cancels_them_all(
        app, api, producer, admin, many, engine_name):
    made = api.client.post("/workflows", json={"jobs": [
        {"type": "email", "ref": f"r{i}"} for i in range(100)]}, headers=producer.headers)
    workflow = made.json
    members = [workflow["jobs"][f"r{i}"] for i in range(100)]
    outside = bulk_jobs(app, many, status="waiting")
    bulk_edges(app, outside, lambda i: members[i % 100])

    cancelled = api.client.post(f"/workflows/{workflow['id']}/cancel", headers=admin.headers)
    assert cancelled.status_code == 200, cancelled.json
    assert counts(app, members) == {"cancelled": 100}
    settle(app, outside, "cancelled", engine_name)


def test_a_cascade_a_process_left_is_taken_over_by_another_process_ticker(
        app, app_config, api, producer, worker, one_step_a_transaction):
    root = api.enqueue(producer, type="email").json["id"]
    api.claim(worker, types=["email"])
    dependents = bulk_jobs(app, 3 * STEP_EDGES, status="waiting")
    bulk_edges(app, dependents, lambda _i: root)
    api.complete(worker, root, result={})
    assert cascades_under_way(app) == 1

    other = create_app(app_config)  # another process on the same database, its ticker
    try:
        cascades = other.extensions["queuelog"].jobs.cascades
        ticks = 0
        while cascades.under_way()[0]:
            cascades.chore()
            ticks += 1
            assert ticks < 100
        assert counts(app, dependents) == {"pending": 3 * STEP_EDGES}
        assert other.extensions["queuelog"].jobs.maintenance.failing() == {}
    finally:
        other.extensions["queuelog"].db.engine.dispose()


def test_a_reserved_root_with_many_dependents_is_released_at_its_deadline(
        app, api, producer, clock, many, engine_name):
    root = api.enqueue(producer, type="email",
                       reserve={"confirm_within_seconds": 30}).json["id"]
    dependents = bulk_jobs(app, many, status="waiting")
    bulk_edges(app, dependents, lambda _i: root)
    clock.advance(31)

    jobs = app.extensions["queuelog"].jobs
    jobs.release_overdue_reservations()
    assert jobs.maintenance.failing() == {}
    assert api.get(producer, root).json["status"] == "cancelled"
    settle(app, dependents, "cancelled", engine_name)
