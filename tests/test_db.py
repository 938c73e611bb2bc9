"""The database layer: SQLite pragmas on every pooled connection, the claim's index, the
schema Alembic builds equal to the code's tables on both engines."""

from __future__ import annotations

import re
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from alembic import command
from sqlalchemy import column, event, select, table, text
from sqlalchemy.exc import IntegrityError

from app import create_app
from app.core.callers import Role
from app.core.clock import ManualClock
from app.core.statuses import JobStatus
from app.jobs.domain.claim_positions import LEVELS
from app.jobs.sql.claim_repository import (
    _candidates_one_type,
    _candidates_one_type_by_key,
    _claim_any_type,
    _driver_candidates_one_type,
    _due_probe_any_free_type,
    _due_probe_one_free_type,
    _due_probe_one_type,
    _due_probe_one_type_by_key,
)
from app.jobs.sql.read_repository import (
    _count_finished,
    _count_for_bulk,
    _count_running,
    _count_running_by_worker,
    _pending_by_type,
    _select_by_idempotency_key,
)
from app.jobs.sql.repository import JobRepository
from app.jobs.timeline.failure_repository import _count_failing_now
from app.storage.engine import Database, make_engine
from app.storage.migrations import alembic_config, current_revision, head_revision, upgrade


@pytest.fixture
def sqlite_db(tmp_path):
    database = Database(make_engine(f"sqlite:///{tmp_path / 'q.sqlite3'}", pool_size=3))
    yield database
    database.engine.dispose()


def test_every_pooled_sqlite_connection_gets_wal_busy_timeout_and_full_sync(sqlite_db):
    # Hold several connections at once so the pool must open more than one.
    conns = [sqlite_db.engine.connect() for _ in range(3)]
    try:
        for conn in conns:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
    finally:
        for conn in conns:
            conn.close()


def test_sqlite_synchronous_can_be_configured(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'q.sqlite3'}", sqlite_synchronous="NORMAL")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1
    engine.dispose()


def test_writes_open_with_begin_immediate_so_other_writers_wait_and_readers_do_not(tmp_path):
    # BEGIN IMMEDIATE takes the write lock at BEGIN: another writer that will not wait is
    # refused at once (instead of failing later mid-transaction); readers carry on (WAL).
    path = tmp_path / "q.sqlite3"
    database = Database(make_engine(f"sqlite:///{path}"))
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        with database.write() as conn:
            conn.exec_driver_sql("CREATE TABLE t (v INTEGER)")
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
            assert other.execute("SELECT 2").fetchone() == (2,)
    finally:
        other.close()
        database.engine.dispose()


@pytest.fixture
def counter_db(tmp_path):
    database = Database(make_engine(f"sqlite:///{tmp_path / 'q.sqlite3'}", pool_size=2))
    with database.write() as conn:
        conn.exec_driver_sql("CREATE TABLE t (v INTEGER NOT NULL UNIQUE)")
    yield database, tmp_path / "q.sqlite3"
    database.engine.dispose()


def test_group_commit_returns_each_callers_own_result_after_it_is_committed(counter_db):
    database, path = counter_db
    seen_by_another_connection: list[bool] = []

    def insert(value: int) -> int:
        result = database.run_write(
            lambda conn: conn.exec_driver_sql("INSERT INTO t VALUES (?) RETURNING v", (value,))
            .scalar_one())
        # Once run_write returns, the row is committed: a fresh connection sees it.
        with sqlite3.connect(path) as reader:
            seen_by_another_connection.append(
                reader.execute("SELECT 1 FROM t WHERE v = ?", (value,)).fetchone() is not None)
        return result

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(insert, range(400)))

    assert results == list(range(400))
    assert all(seen_by_another_connection)


def test_a_failing_caller_in_a_group_undoes_only_its_own_writes(counter_db):
    database, path = counter_db

    def work(value: int):
        def write(conn):
            conn.exec_driver_sql("INSERT INTO t VALUES (?)", (value,))
            if value % 3 == 0:
                conn.exec_driver_sql("INSERT INTO t VALUES (?)", (value + 1000,))
                raise ValueError(value)  # after writing: its rows must not stay
            return value
        try:
            return database.run_write(write)
        except ValueError:
            return None

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(work, range(300)))

    assert [r for r in results if r is not None] == [v for v in range(300) if v % 3]
    with sqlite3.connect(path) as reader:
        stored = sorted(v for (v,) in reader.execute("SELECT v FROM t"))
    assert stored == [v for v in range(300) if v % 3]


def test_in_memory_sqlite_is_refused():
    with pytest.raises(ValueError, match="file"):
        make_engine("sqlite://")


def _sqlite_plan(template: str, stmt: Any, params: dict[str, Any]) -> list[str]:
    database = Database(make_engine(f"sqlite:///{template}"))
    compiled = stmt.compile(dialect=database.engine.dialect)
    # Expanded with the values, so that an expanding IN renders as its list of parameters.
    expanded = compiled.construct_expanded_state(
        {name: value for name, value in params.items() if name in compiled.binds})
    with database.read() as conn:
        plan = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + expanded.statement,
                                    tuple(expanded.positional_parameters)).all()
    database.engine.dispose()
    return [row[-1] for row in plan]


CLAIM_PARAMS = {"now": 0, "worker": "w", "lease_expires_at": 0, "nonce": "n", "limit": 1,
                "instance": None,
                "type": "email", "full_keys": ["customer-1"],
                # The positions a claim from positions reads each level from.
                **{f"{part}_{level}": 0 for level in LEVELS for part in ("created", "id")}}
# The claims of any type: from the front, with or without the types under flow control, and
# (while a snapshot holds PostgreSQL's horizon) from positions.
# Each in its two forms: the claim of one job (LIMIT 1) and the claim of :limit.
_claim_of_any_type = _claim_any_type(False, False, False, 0, False)
_claim_any_free_type = _claim_any_type(False, True, False, 0, False)
_claim_from_positions = _claim_any_type(False, True, True, 0, False)
_claim_aged = _claim_any_type(False, True, False, 1, False)
_ONE_JOB_CLAIMS = [_claim_any_type(False, free, positioned, 0, True).statement
                   for free, positioned in [(False, False), (True, False), (True, True)]]


# A claim that read no type's row passes over the types under flow control in its own
# statement (app/jobs/sql/job_rows.py, TYPE_FREE): it reads the same index, in the same order.
@pytest.mark.parametrize("stmt", [_claim_of_any_type.statement, _claim_any_free_type.statement,
                                  _claim_from_positions.statement, _due_probe_any_free_type,
                                  *_ONE_JOB_CLAIMS])
def test_sqlite_claim_reads_the_partial_claim_order_index(sqlite_template, stmt):
    plan = _sqlite_plan(sqlite_template, stmt, CLAIM_PARAMS)
    assert any(step.endswith("USING INDEX ix_jobs_claim_order")
               or step.endswith("USING COVERING INDEX ix_jobs_claim_order")
               for step in plan), plan
    assert not any("TEMP B-TREE" in step for step in plan)  # no sort: already in claim order


@pytest.mark.parametrize("stmt", [_candidates_one_type(False), _candidates_one_type(True),
                                  _due_probe_one_type,
                                  _candidates_one_type_by_key, _due_probe_one_type_by_key,
                                  _driver_candidates_one_type(True, False).statement,
                                  _driver_candidates_one_type(True, True).statement,
                                  _due_probe_one_free_type])
def test_sqlite_claims_of_one_type_read_that_types_part_of_the_index(sqlite_template, stmt):
    plan = _sqlite_plan(sqlite_template, stmt, CLAIM_PARAMS)
    assert any("USING INDEX ix_jobs_claim_order_by_type (type=?)" in step
               or "USING COVERING INDEX ix_jobs_claim_order_by_type (type=?)" in step
               for step in plan), plan
    assert not any("TEMP B-TREE" in step for step in plan)


def _pending_jobs(conn: Any, job_type: str, priority: str) -> None:
    """20,000 pending jobs on PostgreSQL, of the type and priority the SQL expressions in n
    give (the test's own literals)."""
    columns = ("type, payload, priority, status, retry_count, max_retries, producer, run_at, "
               "created_at, updated_at")
    values = f"{job_type}, '{{}}', {priority}, 'pending', 0, 3, 'p', n, n, n"
    conn.exec_driver_sql(f"INSERT INTO jobs ({columns}) SELECT {values} "  # noqa: S608
                         "FROM generate_series(1, 20000) AS n")


def _postgres_plan(conn: Any, stmt: Any, params: dict[str, Any], *,
                   generic: bool = False) -> dict[str, Any]:
    """The plan PostgreSQL makes for `stmt` with these values or (`generic`) the one it
    makes without them, which a prepared statement keeps once it finds it no costlier."""
    compiled = stmt.compile(dialect=conn.dialect)
    values = {**compiled.params,
              **{name: value for name, value in params.items() if name in compiled.binds}}
    if not generic:
        [(plan,)] = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + compiled.string,
                                         values).all()
        return dict(plan[0]["Plan"])
    names: list[str] = []

    def numbered(match: Any) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    sql = re.sub(r"%\((\w+)\)s", numbered, compiled.string)
    conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_generic_plan")
    conn.exec_driver_sql(f"PREPARE planned AS {sql}")
    # EXECUTE's arguments as literals: as parameters of their own, the server could not tell
    # the text ones' types.
    arguments = ", ".join(str(value) if isinstance(value, int)
                          else "'" + str(value).replace("'", "''") + "'"
                          for value in (values[name] for name in names))
    [(plan,)] = conn.exec_driver_sql(
        f"EXPLAIN (FORMAT JSON) EXECUTE planned({arguments})").all()
    conn.exec_driver_sql("DEALLOCATE planned")
    return dict(plan[0]["Plan"])


def _plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(child for sub in node.get("Plans", []) for child in _plan_nodes(sub))]


@pytest.mark.parametrize(("stmt", "generic"), [
    *((stmt, False) for stmt in [
        _claim_of_any_type.statement, _claim_any_free_type.statement,
        _claim_from_positions.statement, _due_probe_any_free_type,
        _driver_candidates_one_type(True, False).statement, _due_probe_one_free_type,
        *_ONE_JOB_CLAIMS, _driver_candidates_one_type(True, True).statement]),
    # The plan a prepared claim of one job keeps (app/jobs/sql/job_rows.py, claim_limit).
    *((stmt, True) for stmt in [*_ONE_JOB_CLAIMS,
                                _driver_candidates_one_type(True, True).statement])])
def test_postgresql_claims_walk_the_claim_order_and_stop_at_their_limit(postgres_server, stmt,
                                                                        generic):
    """With 20,000 pending jobs and their statistics, each claim (and each peek of a waiting
    claim) reads the pending jobs through a claim-order index, already in order: no sort,
    no join over every pending row (the condition on the types' rows a filter of the scan),
    so its cost does not grow with the backlog; so does the plan a claim of one job keeps
    once prepared, made without the values."""
    engine = make_engine(postgres_server.create_database())
    try:
        with engine.begin() as conn:
            _pending_jobs(conn, "CASE WHEN mod(n, 2) = 0 THEN 'email' ELSE 'pdf' END", "10")
            conn.exec_driver_sql(
                "INSERT INTO job_types (type, paused, updated_at)"
                " VALUES ('sync', true, 0)")
            conn.exec_driver_sql("ANALYZE jobs")
            conn.exec_driver_sql("ANALYZE job_types")
            plan = _postgres_plan(conn, stmt, {**CLAIM_PARAMS, "now": 10**15},
                                  generic=generic)
    finally:
        engine.dispose()
    nodes = _plan_nodes(plan)
    kinds = [node["Node Type"] for node in nodes]
    assert "Sort" not in kinds and not any("Join" in kind for kind in kinds), kinds
    assert any(node.get("Index Name", "").startswith("ix_jobs_claim_order")
               and node.get("Relation Name") == "jobs" for node in nodes), kinds
    assert not any(node["Node Type"] == "Seq Scan" and node.get("Relation Name") == "jobs"
                   for node in nodes), kinds


@pytest.mark.parametrize("generic", [False, True])
@pytest.mark.parametrize("stmt", _ONE_JOB_CLAIMS)
def test_postgresql_claim_of_one_job_finds_its_row_by_id_whatever_the_statistics(
        postgres_server, stmt, generic):
    """200,000 jobs purged and vacuumed, then 3,000 pending: until the next ANALYZE the
    statistics count the table nearly empty, and a claim joined (IN) to its candidates was
    planned as a read of the whole table at every run (bench/bloat.py found it). The claim
    of one job looks its row up by id."""
    engine = make_engine(postgres_server.create_database())
    try:
        with engine.begin() as conn:
            for _ in range(10):
                _pending_jobs(conn, "'email'", "10")
            conn.exec_driver_sql("DELETE FROM jobs")
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                "VACUUM ANALYZE jobs")
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO jobs (type, payload, priority, status, retry_count,"
                                 " max_retries, producer, run_at, created_at, updated_at)"
                                 " SELECT 'email', '{}', 10, 'pending', 0, 3, 'p', n, n, n"
                                 " FROM generate_series(1, 3000) AS n")
            plan = _postgres_plan(conn, stmt, {**CLAIM_PARAMS, "now": 10**15},
                                  generic=generic)
    finally:
        engine.dispose()
    scans = [node for node in _plan_nodes(plan) if node.get("Relation Name") == "jobs"
             and "Scan" in node["Node Type"]]
    assert not any(node["Node Type"] == "Seq Scan" for node in scans), scans
    assert any(node.get("Index Name") == "pk_jobs" for node in scans), scans


def _stale_statistics(conn: Any, history: str) -> None:
    """A jobs table whose statistics say it holds no pending job, then 3,000 pending jobs:
    never analyzed (a new queue's first burst), analyzed once every job had finished (a
    drained queue's next burst), or analyzed after a purge emptied it."""
    engine = conn.engine
    if history != "never analyzed":
        _pending_jobs(conn, "'email'", "10")
        conn.exec_driver_sql("DELETE FROM jobs" if history == "purged"
                             else "UPDATE jobs SET status = 'completed'")
        conn.commit()
        with engine.connect() as own:
            own.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                "VACUUM ANALYZE jobs")
    conn.exec_driver_sql(
        "INSERT INTO jobs (type, payload, priority, status, retry_count, max_retries, producer,"
        " run_at, created_at, updated_at) SELECT CASE WHEN mod(n, 2) = 0 THEN 'email' ELSE"
        " 'pdf' END, '{}', 10, 'pending', 0, 3, 'p', n, n, 10000000 + n"
        " FROM generate_series(1, 3000) AS n")


@pytest.mark.parametrize("history", ["never analyzed", "analyzed when all had finished",
                                     "purged"])
@pytest.mark.parametrize(("stmt", "generic"), [
    *((stmt, generic) for stmt in _ONE_JOB_CLAIMS for generic in (False, True)),
    (_claim_of_any_type.statement, False), (_claim_from_positions.statement, False),
    (_due_probe_any_free_type, False),
    *((_driver_candidates_one_type(True, True).statement, generic) for generic in (False, True)),
    (_driver_candidates_one_type(True, False).statement, False)])
def test_postgresql_claims_walk_the_claim_order_whatever_the_statistics_say_of_pending_jobs(
        postgres_server, stmt, generic, history):
    """Until the next ANALYZE the statistics may count no pending job at all: a table
    analyzed when every job had finished, or after a purge emptied it, or never analyzed.
    A claim must still read its candidates from a claim-order index in order: a plan that
    gathered every due job and sorted them would cost each claim the whole backlog. One state
    is left to autovacuum: a table never analyzed yet after thousands of changes, whose
    partial indexes the planner takes for empty (docs/SCALING.md, "Statistics and the
    claim's plan")."""
    engine = make_engine(postgres_server.create_database())
    try:
        with engine.connect() as conn:
            _stale_statistics(conn, history)
            plan = _postgres_plan(conn, stmt, {**CLAIM_PARAMS, "now": 10**15},
                                  generic=generic)
            conn.rollback()
    finally:
        engine.dispose()
    nodes = _plan_nodes(plan)
    kinds = [node["Node Type"] for node in nodes]
    assert "Sort" not in kinds and "Bitmap Heap Scan" not in kinds, kinds
    assert not any(node["Node Type"] == "Seq Scan" and node.get("Relation Name") == "jobs"
                   for node in nodes), kinds
    assert any(node.get("Index Name", "").startswith("ix_jobs_claim_order")
               for node in nodes), kinds


@pytest.mark.parametrize("positioned", [False, True])
def test_postgresql_keeps_one_plan_for_the_claim_of_one_job(postgres_server, positioned):
    """Over 20,000 pending jobs with their statistics, a server process's claims of one job
    (from the front, or from positions while a snapshot holds the horizon) are planned for
    their first runs on a connection, then run the plan the server keeps: a claim's cost is
    its reads, not a new plan each time (app/jobs/sql/job_rows.py, claim_limit)."""
    url = postgres_server.create_database()
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            _pending_jobs(conn, "'email'", "10")
            conn.exec_driver_sql("ANALYZE jobs")
    finally:
        engine.dispose()
    application = create_app({"TESTING": True, "DATABASE_URL": url, "DB_POOL_SIZE": 1,
                              "JOB_TYPES": frozenset({"email"}),
                              "CLOCK": ManualClock(start_us=10**15)})
    services = application.extensions["queuelog"]
    try:
        if positioned:
            services.jobs.claim_positions.horizon_held()
        token = services.keys.create_key("w", Role.WORKER)
        client = application.test_client()
        for _ in range(20):
            answer = client.post("/jobs/claim", json={},
                                 headers={"Authorization": f"Bearer {token}"})
            assert answer.status_code == 200, answer.json
        with services.db.engine.connect() as conn:
            plans = conn.execute(text(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement LIKE 'WITH candidates%'")).all()
    finally:
        services.close()
    assert len(plans) == 1, plans  # one claim statement, on the pool's one connection
    # psycopg prepares a statement at its sixth run; the server plans its first five runs
    # for their values, then keeps the plan made without them.
    [(generic, custom)] = plans
    assert custom <= 5 and generic >= 5, plans


AGED_PARAMS = {**CLAIM_PARAMS, "aging_type_0": "email", "aging_us_0": 60_000_000}


def test_sqlite_aged_claim_reads_each_level_of_the_aging_type_from_its_index(sqlite_template):
    """A claim while a type ages reads the claim order as before, and each of the aging
    type's levels as a range of that type's claim-order index: never the table whole."""
    plan = _sqlite_plan(sqlite_template, _claim_aged.statement, AGED_PARAMS)
    assert any(step.endswith("USING INDEX ix_jobs_claim_order")
               or step.endswith("USING COVERING INDEX ix_jobs_claim_order")
               for step in plan), plan
    ranges = [step for step in plan if "ix_jobs_claim_order_by_type (type=? AND priority=?)"
              in step]
    assert len(ranges) == 3, plan  # low, medium, high
    assert "SCAN jobs" not in plan, plan  # a scan of the table itself


def test_postgresql_aged_claim_reads_indexes_only_and_sorts_only_its_candidates(
        postgres_server):
    """With 20,000 pending jobs of an aging type, the claim reads the claim order and each of
    the type's levels through the claim-order indexes, each range under its LIMIT: the only
    sort is of the candidates those ranges returned, never of the pending jobs."""
    engine = make_engine(postgres_server.create_database())
    try:
        with engine.begin() as conn:
            _pending_jobs(conn, "'email'", "10 * mod(n, 3)")  # low, medium and high
            conn.exec_driver_sql("ANALYZE jobs")
            plan = _postgres_plan(conn, _claim_aged.statement, {**AGED_PARAMS, "now": 10**15})
    finally:
        engine.dispose()
    nodes = _plan_nodes(plan)
    scans = [node for node in nodes if node.get("Relation Name") == "jobs"
             and "Scan" in node["Node Type"]]
    assert not any(node["Node Type"] == "Seq Scan" for node in scans), scans
    ranges = [node for node in scans
              if node.get("Index Name") == "ix_jobs_claim_order_by_type"]
    assert len(ranges) == 3, [node.get("Index Name") for node in scans]
    # Each range (and the usual candidates) stops at its LIMIT: no row estimate beyond it.
    limits = [node for node in nodes if node["Node Type"] == "Limit"]
    assert limits and all(node["Plan Rows"] <= CLAIM_PARAMS["limit"] for node in limits), limits


@pytest.mark.parametrize("after", [None, (5, 7)])
def test_sqlite_retention_reads_a_type_s_expired_jobs_in_order_from_their_index(
        sqlite_template, after):
    """Each retention batch starts where the last one ended, in the finished jobs' index,
    already in (updated_at, id) order: no sort, no walk over the rows deleted before."""
    engine = make_engine(f"sqlite:///{sqlite_template}")
    seen: list[tuple[str, Any]] = []

    def catch(conn: Any, cursor: Any, statement: str, params: Any, context: Any,
              many: bool) -> None:
        if statement.startswith("SELECT jobs.updated_at"):
            seen.append((statement, params))

    event.listen(engine, "before_cursor_execute", catch)
    with engine.connect() as conn:
        JobRepository(conn).expired_finished(
            job_type="email", status=JobStatus.COMPLETED, updated_before_us=10,
            keyed_created_before_us=5, after=after, limit=200)
        event.remove(engine, "before_cursor_execute", catch)
        [(statement, params)] = seen
        plan = [row[-1] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement,
                                                        params)]
    engine.dispose()
    bounds = "updated_at>? AND updated_at<?" if after else "updated_at<?"
    assert plan == [f"SEARCH jobs USING INDEX ix_jobs_finished_type_status_updated "
                    f"(type=? AND status=? AND {bounds})"], plan


@pytest.mark.parametrize("stmt,index", [
    (_pending_by_type, "ix_jobs_claim_order_by_type"),
    (_count_running, "ix_jobs_running_type_key"),
    (_count_finished, "COVERING INDEX ix_jobs_finished_type_status_updated"),
])
def test_sqlite_type_counts_read_partial_indexes_never_the_table(sqlite_template, stmt, index):
    # GET /types and the per-type gauges, beside a million finished jobs.
    plan = _sqlite_plan(sqlite_template, stmt, CLAIM_PARAMS)
    assert any(index in step for step in plan), plan
    assert not any(step.startswith("SCAN jobs") and "INDEX" not in step for step in plan)


def test_sqlite_counts_by_worker_read_the_running_rows_alone(sqlite_template):
    # GET /workers, the dashboard and explain; a GROUP BY worker_id straight on the table
    # walked the whole (worker_id, id) index.
    plan = _sqlite_plan(sqlite_template, _count_running_by_worker, {})
    assert any("ix_jobs_lease_expires_at" in step or "ix_jobs_running_type_key" in step
               for step in plan), plan
    assert not any("ix_jobs_worker_id_id" in step for step in plan), plan


@pytest.mark.parametrize("status", ["failed", "cancelled"])
def test_sqlite_listing_failed_or_cancelled_jobs_reads_their_partial_index(sqlite_template,
                                                                            status):
    database = Database(make_engine(f"sqlite:///{sqlite_template}"))
    statements: list[str] = []
    with database.read() as conn:
        event.listen(conn, "before_cursor_execute",
                     lambda *args: statements.append((args[2], args[3])))
        JobRepository(conn).list_jobs(after_id=0, limit=51, status=status, job_type="email")
        statement, parameters = statements[-1]
        plan = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters).all()
    database.engine.dispose()
    assert any(f"USING INDEX ix_jobs_{status}_id (id>?)" in row[-1] for row in plan), plan


def test_sqlite_listing_running_jobs_reads_the_running_rows_alone(sqlite_template):
    database = Database(make_engine(f"sqlite:///{sqlite_template}"))
    statements: list[Any] = []
    with database.read() as conn:
        event.listen(conn, "before_cursor_execute",
                     lambda *args: statements.append((args[2], args[3])))
        JobRepository(conn).list_jobs(after_id=0, limit=51, status="running",
                                      producer="shop")
        statement, parameters = statements[-1]
        plan = [row[-1] for row in
                conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters).all()]
    database.engine.dispose()
    assert any("ix_jobs_lease_expires_at" in step or "ix_jobs_running_type_key" in step
               for step in plan), plan
    assert not any(step.startswith("SCAN jobs") and "INDEX" not in step for step in plan), plan


# The bulk actions' counts (the dashboard's confirmations): each status of each action, of
# one type or of any, with the partial index each branch reads.
_RETRIED = (JobStatus.CANCELLED, JobStatus.FAILED)
_CANCELLED = (JobStatus.PENDING, JobStatus.SUSPENDED, JobStatus.WAITING)
_BULK_COUNT_INDEXES = {
    (_RETRIED, False): ["ix_jobs_cancelled_id", "ix_jobs_failed_id"],
    (_RETRIED, True): ["ix_jobs_finished_type_status_updated"] * 2,
    (_CANCELLED, False): ["ix_jobs_claim_order", "ix_jobs_suspended_type",
                          "ix_jobs_waiting_type"],
    (_CANCELLED, True): ["ix_jobs_claim_order_by_type", "ix_jobs_suspended_type",
                         "ix_jobs_waiting_type"],
}
BULK_COUNT_PARAMS = {"type": "email", "cap_plus_one": 10_001}


@pytest.mark.parametrize("statuses,of_one_type", list(_BULK_COUNT_INDEXES))
def test_sqlite_bulk_counts_read_each_status_from_its_partial_index(sqlite_template, statuses,
                                                                   of_one_type):
    plan = _sqlite_plan(sqlite_template, _count_for_bulk(statuses, of_one_type),
                        BULK_COUNT_PARAMS)
    read = sorted(re.search(r"INDEX (\w+)", step).group(1)
                  for step in plan if step.startswith(("SCAN jobs", "SEARCH jobs")))
    assert read == sorted(_BULK_COUNT_INDEXES[(statuses, of_one_type)]), plan


def _jobs_of_every_status(conn: Any) -> None:
    """20,000 completed jobs and 300 of each status a bulk action takes, of two types; and
    10,000 failed and 10,000 cancelled jobs of a third type, which a count of another type
    must not walk."""
    columns = ("type, payload, priority, status, retry_count, max_retries, producer, run_at, "
               "created_at, updated_at")
    statuses = "(ARRAY['failed','cancelled','pending','waiting','suspended'])[mod(n, 5) + 1]"
    for count, job_type, status in (
            (20_000, "CASE WHEN mod(n, 2) = 0 THEN 'email' ELSE 'pdf' END", "'completed'"),
            (1500, "CASE WHEN mod(n, 2) = 0 THEN 'email' ELSE 'pdf' END", statuses),
            (20_000, "'sync'", "CASE WHEN mod(n, 2) = 0 THEN 'failed' ELSE 'cancelled' END")):
        conn.exec_driver_sql(
            f"INSERT INTO jobs ({columns}) SELECT {job_type}, '{{}}', 10, {status}, 0, 3, "  # noqa: S608
            f"'p', n, n, n FROM generate_series(1, {count}) AS n")
    conn.exec_driver_sql("ANALYZE jobs")


def test_postgresql_bulk_counts_read_partial_indexes_never_the_table(postgres_server):
    """Beside 20,000 completed jobs, and 20,000 failed or cancelled jobs of another type,
    each count reads its statuses' partial indexes (never a scan of the jobs), each branch
    under the cap's LIMIT."""
    engine = make_engine(postgres_server.create_database())
    try:
        with engine.begin() as conn:
            _jobs_of_every_status(conn)
            plans = {key: _plan_nodes(_postgres_plan(conn, _count_for_bulk(*key),
                                                     BULK_COUNT_PARAMS))
                     for key in _BULK_COUNT_INDEXES}
    finally:
        engine.dispose()
    for key, nodes in plans.items():
        kinds = [node["Node Type"] for node in nodes if node.get("Relation Name") == "jobs"]
        assert kinds and "Seq Scan" not in kinds, (key, kinds)
        # An index scan or a bitmap of the index (its heap scan names no index).
        read = sorted(node["Index Name"] for node in nodes if "Index Name" in node)
        assert read == sorted(_BULK_COUNT_INDEXES[key]), (key, read)
        assert any(node["Node Type"] == "Limit" for node in nodes), key


FAILING_NOW_PARAMS = {"fingerprint": "0000000000000003", "type": "email",
                      "examined_cap": 10_001}


def test_sqlite_failing_now_reads_the_groups_attempts_and_looks_each_job_up(sqlite_template):
    plan = _sqlite_plan(sqlite_template, _count_failing_now, FAILING_NOW_PARAMS)
    assert ("SEARCH job_attempts USING INDEX ix_job_attempts_fingerprint_ended_at "
            "(fingerprint=?)") in plan, plan
    assert "SEARCH jobs USING INTEGER PRIMARY KEY (rowid=?)" in plan, plan
    assert ("SEARCH later USING COVERING INDEX uq_job_attempts_job_id_number "
            "(job_id=? AND number>?)") in plan, plan
    assert not any(step.startswith("SCAN") and "INDEX" not in step
                   and not step.startswith(("SCAN newest", "SCAN anon")) for step in plan), plan


def test_postgresql_failing_now_looks_each_attempts_job_up_by_id_never_scans_jobs(
        postgres_server):
    """A group of 30,000 attempts among 100,000 jobs: its newest attempts come from the
    fingerprint index under the cap's LIMIT, each one's job by its primary key (a join
    there, PostgreSQL would hash a scan of every job) and its later attempts by theirs."""
    engine = make_engine(postgres_server.create_database())
    try:
        with engine.begin() as conn:
            _pending_jobs(conn, "CASE WHEN mod(n, 2) = 0 THEN 'email' ELSE 'pdf' END", "10")
            conn.exec_driver_sql(
                "INSERT INTO jobs (type, payload, priority, status, retry_count, max_retries, "
                "producer, run_at, created_at, updated_at) SELECT 'email', '{}', 10, "
                "CASE WHEN mod(n, 10) < 4 THEN 'failed' ELSE 'completed' END, 0, 3, 'p', n, n, "
                "n FROM generate_series(1, 80000) AS n")
            conn.exec_driver_sql(
                "INSERT INTO job_attempts (job_id, number, worker_id, claimed_at, ended_at, "
                "outcome, fingerprint) SELECT id, 1, 'w', id, id, status, CASE WHEN "
                "status = 'failed' THEN '0000000000000003' END FROM jobs")
            conn.exec_driver_sql("ANALYZE jobs")
            conn.exec_driver_sql("ANALYZE job_attempts")
            nodes = _plan_nodes(_postgres_plan(conn, _count_failing_now, FAILING_NOW_PARAMS))
    finally:
        engine.dispose()
    read = {(node.get("Relation Name"), node.get("Index Name")) for node in nodes
            if "Scan" in node["Node Type"]}
    assert read == {("job_attempts", "ix_job_attempts_fingerprint_ended_at"),
                    ("jobs", "pk_jobs"),
                    ("job_attempts", "uq_job_attempts_job_id_number")}, read
    assert not any(node["Node Type"] in ("Seq Scan", "Hash Join", "Bitmap Heap Scan")
                   for node in nodes), [node["Node Type"] for node in nodes]


def test_migrated_schema_equals_the_code_tables(empty_db_url):
    upgrade(empty_db_url)
    # `alembic check` fails when autogenerate finds any difference.
    command.check(alembic_config(empty_db_url))


def test_migrations_record_the_head_revision(empty_db_url):
    upgrade(empty_db_url)
    database = Database(make_engine(empty_db_url))
    with database.read() as conn:
        assert current_revision(conn) == head_revision() == "0030"
        tables = {row[0] for row in conn.execute(text(
            "SELECT name FROM sqlite_master WHERE type='table'"
            if database.dialect == "sqlite" else
            "SELECT tablename FROM pg_tables WHERE schemaname='public'"))}
    database.engine.dispose()
    assert {"jobs", "api_keys", "job_types", "alembic_version"} <= tables


def test_postgres_tables_carry_the_storage_parameters_of_0011(empty_db_url, engine_name):
    """On PostgreSQL the churned tables leave room for same-page updates and are vacuumed
    after 2 % of them changed, not the default 20 %; on SQLite nothing of this exists."""
    upgrade(empty_db_url)
    database = Database(make_engine(empty_db_url))
    if engine_name == "sqlite":
        with database.read() as conn:
            assert current_revision(conn) == "0030"
        database.engine.dispose()
        return
    with database.read() as conn:
        options = {name: set(values or []) for name, values in conn.execute(text(
            "SELECT relname, reloptions FROM pg_class WHERE relname IN "
            "('jobs', 'job_attempts', 'job_events') AND relkind = 'r'"))}
    database.engine.dispose()
    assert {"fillfactor=90", "autovacuum_vacuum_scale_factor=0.02",
            "autovacuum_vacuum_threshold=1000",
            "autovacuum_analyze_scale_factor=0.02"} <= options["jobs"]
    assert {"fillfactor=80", "autovacuum_vacuum_scale_factor=0.02"} <= options["job_attempts"]
    assert "autovacuum_vacuum_scale_factor=0.05" in options["job_events"]


def test_storage_parameters_go_with_a_downgrade_of_0011(empty_db_url, engine_name):
    upgrade(empty_db_url)
    command.downgrade(alembic_config(empty_db_url), "0010")
    if engine_name == "postgresql":
        engine = make_engine(empty_db_url, pooled=False)
        with engine.connect() as conn:
            left = conn.execute(text(
                "SELECT relname FROM pg_class WHERE relname IN "
                "('jobs', 'job_attempts', 'job_events') AND reloptions IS NOT NULL")).all()
        engine.dispose()
        assert left == []
    upgrade(empty_db_url)


def test_migrations_run_down_and_up_again(empty_db_url):
    upgrade(empty_db_url)
    config = alembic_config(empty_db_url)
    command.downgrade(config, "base")
    command.upgrade(config, "head")
    command.check(config)


def test_unique_jobs_migration_keeps_stored_jobs_and_enforces_one_holder(empty_db_url):
    """0006 on a database that already holds jobs: they stay, with no unique key, and the
    new index refuses a second holder of one scope while letting a finished one be."""
    upgrade(empty_db_url, "0003")
    row = {"type": "email", "payload": "{}", "priority": 10, "status": "pending",
           "retry_count": 0, "max_retries": 3, "producer": "p", "run_at": 0,
           "created_at": 0, "updated_at": 0}
    engine = make_engine(empty_db_url, pooled=False)
    with engine.begin() as conn:
        # The table as 0003 left it, not as the code declares it now.
        conn.execute(table("jobs", *map(column, row)).insert(), row)
    upgrade(empty_db_url)
    held = {**row, "unique_key": "k", "unique_scope": "s", "unique_while": 3}
    insert_held = table("jobs", *map(column, held)).insert()
    with engine.begin() as conn:
        assert conn.execute(text("SELECT unique_key FROM jobs")).scalars().all() == [None]
        conn.execute(insert_held, held)
        conn.execute(insert_held, {**held, "status": "completed"})  # out of its while set
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(insert_held, {**held, "status": "running"})
    engine.dispose()


def test_sqlite_idempotency_look_up_reads_the_partial_unique_index(sqlite_template):
    # Partial since 0012 (jobs without a key are not in it): the look-up by one key by
    # equality still reads it.
    plan = _sqlite_plan(sqlite_template, _select_by_idempotency_key,
                        {"producer": "p", "idempotency_key": "k"})
    assert any("USING INDEX uq_jobs_producer_idempotency_key (producer=? AND idempotency_key=?)"
               in step for step in plan), plan


def test_sqlite_listing_a_workers_jobs_reads_the_partial_worker_index(sqlite_template):
    database = Database(make_engine(f"sqlite:///{sqlite_template}"))
    statements: list[tuple[str, Any]] = []
    with database.read() as conn:
        event.listen(conn, "before_cursor_execute",
                     lambda *args: statements.append((args[2], args[3])))
        JobRepository(conn).list_jobs(after_id=0, limit=51, worker="worker-1")
        statement, parameters = statements[-1]
        plan = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters).all()
    database.engine.dispose()
    assert any("USING INDEX ix_jobs_worker_id_id (worker_id=? AND id>?)" in row[-1]
               for row in plan), plan


def test_schedules_due_index_migration_keeps_the_stored_schedules(empty_db_url):
    """0014 on a database 0013 filled: the schedules stay as they were, the due query's index
    is the active-first one, and the way down gives back the earlier index."""
    upgrade(empty_db_url, "0013")
    rows = [{"name": f"s-{n}", "cron": "* * * * *", "timezone": "UTC",
             "job": '{"type":"email","payload":{}}', "catch_up": "latest", "paused": n == 1,
             "next_run_at": 1_000_000 * n, "last_run_at": None, "last_job_id": None,
             "created_at": 0, "updated_at": 0} for n in range(3)]
    engine = make_engine(empty_db_url, pooled=False)
    schedules_before = table("schedules", *map(column, rows[0]))
    with engine.begin() as conn:
        conn.execute(schedules_before.insert(), rows)

    def indexes() -> set[str]:
        with engine.connect() as conn:
            return set(conn.execute(text(
                "SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='schedules'"
                if engine.dialect.name == "sqlite" else
                "SELECT indexname FROM pg_indexes WHERE tablename='schedules'")).scalars())

    upgrade(empty_db_url)
    with engine.connect() as conn:
        kept = conn.execute(text("SELECT name, paused, next_run_at FROM schedules "
                                 "ORDER BY name")).all()
    assert [(name, bool(paused), at) for name, paused, at in kept] == [
        ("s-0", False, 0), ("s-1", True, 1_000_000), ("s-2", False, 2_000_000)]
    assert "ix_schedules_due" in indexes() and "ix_schedules_next_run_at" not in indexes()
    command.downgrade(alembic_config(empty_db_url), "0013")
    assert "ix_schedules_next_run_at" in indexes() and "ix_schedules_due" not in indexes()
    engine.dispose()


def test_workflows_migration_keeps_the_stored_jobs_and_their_unique_keys(empty_db_url):
    """0015 on a database 0014 filled: the jobs stay as they were, the unique index it remakes
    still lets one job hold a scope (a finished one out of its while set aside), a waiting
    job can be stored and holds its key as a pending one does, and the way down makes every
    waiting job pending, since an older release would never run it."""
    upgrade(empty_db_url, "0014")
    plain = {"type": "email", "payload": "{}", "priority": 10, "status": "pending",
             "retry_count": 0, "max_retries": 3, "producer": "p", "run_at": 0,
             "created_at": 0, "updated_at": 0, "unique_key": None, "unique_scope": None,
             "unique_while": None}
    held = {**plain, "unique_key": "k", "unique_scope": "s", "unique_while": 3}
    rows = [plain, {**plain, "status": "completed"}, held,
            {**held, "status": "completed"},  # a finished twin, out of its while set
            {**held, "status": "running", "unique_key": "k2", "unique_scope": "s2"},
            {**held, "producer": "q"}]  # another producer's scope
    insert = table("jobs", *map(column, plain)).insert()
    engine = make_engine(empty_db_url, pooled=False)

    def stored() -> list[tuple[Any, ...]]:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(
                "SELECT id, type, status, producer, unique_key, unique_scope, unique_while "
                "FROM jobs ORDER BY id"))]

    with engine.begin() as conn:  # the jobs table as 0014 left it
        conn.execute(insert, rows)
    before = stored()
    assert len(before) == 6

    upgrade(empty_db_url)

    assert stored() == before
    for twin in ({**held}, {**held, "status": "waiting"},
                 {**held, "status": "running", "unique_key": "k2", "unique_scope": "s2"}):
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(insert, twin)
    waiting = {**held, "status": "waiting", "unique_key": "k3", "unique_scope": "s3"}
    with engine.begin() as conn:
        conn.execute(insert, waiting)
        waiting_id = conn.execute(text("SELECT max(id) FROM jobs")).scalar_one()
        conn.execute(text(
            "INSERT INTO job_dependencies (job_id, position, depends_on_id, cancel_on_failure, "
            "resolved) VALUES (:job_id, 0, 1, 1, 0)"), {"job_id": waiting_id})
        conn.execute(insert, {**waiting, "status": "completed"})  # finished: holds nothing
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(insert, {**waiting, "status": "pending"})

    command.downgrade(alembic_config(empty_db_url), "0014")

    after = stored()
    assert after[:6] == before
    assert [row[2] for row in after[6:]] == ["pending", "completed"]
    assert after[6][0] == waiting_id
    with pytest.raises(IntegrityError), engine.begin() as conn:  # still the scope's holder
        conn.execute(insert, {**waiting, "status": "pending"})
    engine.dispose()


def test_fair_share_and_ordered_keys_migration_keeps_the_stored_jobs_and_types(empty_db_url):
    """0016 on a database 0015 filled: every job, dependency and type setting stays as it
    was, no job has a round, no type is fair or ordered and no key has a turn; the upgraded
    database then takes the new settings (turning ordering on holds each key's backlog behind
    its turn, fairness numbers the pending jobs), and the way down makes the jobs held only
    by their key's turn pending again, leaving a job a dependency holds waiting."""
    upgrade(empty_db_url, "0015")
    now = 1_800_000_000_000_000
    job = {"type": "email", "payload": "{}", "priority": 10, "status": "pending",
           "retry_count": 0, "max_retries": 3, "producer": "producer-1", "run_at": 0,
           "claimed_at": None, "worker_id": None, "lease_expires_at": None,
           "lease_token": None, "error": None, "created_at": 0, "updated_at": 0,
           "concurrency_key": None}
    rows = [  # ids 1 … 10, enqueued in this order
        {**job, "status": "completed", "concurrency_key": "a"},
        {**job, "status": "running", "concurrency_key": "a", "worker_id": "worker-1",
         "claimed_at": now - 10_000_000, "lease_expires_at": now + 3_600_000_000,
         "lease_token": "t"},
        {**job, "concurrency_key": "a"},
        {**job, "status": "waiting", "concurrency_key": "a"},  # waits for job 8
        {**job, "concurrency_key": "b"},
        {**job, "concurrency_key": "b", "priority": 20},
        {**job, "status": "failed", "concurrency_key": "b", "retry_count": 3,
         "error": "boom"},
        {**job, "type": "pdf"},
        {**job, "status": "cancelled", "concurrency_key": "c"},
        job,  # without a key
    ]
    rows = [{**row, "created_at": n, "updated_at": n} for n, row in enumerate(rows, 1)]
    type_rows = [
        {"type": "email", "paused": False, "max_running": 5, "max_running_per_key": 2,
         "rate_per_second": None, "burst": None, "updated_at": 1},
        {"type": "pdf", "paused": True, "max_running": None, "max_running_per_key": None,
         "rate_per_second": 2.5, "burst": 3, "updated_at": 2},
    ]
    engine = make_engine(empty_db_url, pooled=False)
    with engine.begin() as conn:  # the tables as 0015 left them
        conn.execute(table("jobs", *map(column, job)).insert(), rows)
        conn.execute(text(
            "INSERT INTO job_dependencies (job_id, position, depends_on_id, cancel_on_failure, "
            "resolved) VALUES (4, 0, 8, 1, 0)"))
        conn.execute(table("job_types", *map(column, type_rows[0])).insert(), type_rows)

    jobs_0015 = table("jobs", column("id"), *map(column, job))
    types_0015 = table("job_types", *map(column, type_rows[0]))

    def stored(query: Any) -> list[tuple[Any, ...]]:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(
                text(query) if isinstance(query, str) else query)]

    def statuses() -> dict[int, tuple[str, int | None]]:
        return {job_id: (status, fair_round) for job_id, status, fair_round
                in stored("SELECT id, status, fair_round FROM jobs")}

    jobs_before = stored(select(jobs_0015).order_by(jobs_0015.c.id))
    dependencies_before = stored("SELECT * FROM job_dependencies")
    types_before = stored(select(types_0015).order_by(types_0015.c.type))
    assert len(jobs_before) == 10 and len(types_before) == 2

    upgrade(empty_db_url)

    assert stored(select(jobs_0015).order_by(jobs_0015.c.id)) == jobs_before
    assert stored("SELECT * FROM job_dependencies") == dependencies_before
    assert stored("SELECT DISTINCT fair_round FROM jobs") == [(None,)]
    assert stored(select(types_0015).order_by(types_0015.c.type)) == types_before
    assert stored("SELECT fairness, ordering, on_failure FROM job_types") == [
        (None, None, None)] * 2
    assert stored("SELECT * FROM key_turns") == []

    application = create_app({"TESTING": True, "DATABASE_URL": empty_db_url,
                              "JOB_TYPES": frozenset({"email", "pdf"}),
                              "CLOCK": ManualClock(start_us=now), "DB_POOL_SIZE": 2})
    keys = application.extensions["queuelog"].keys
    admin = {"Authorization": f"Bearer {keys.create_key('admin-1', Role.ADMIN)}"}
    worker = {"Authorization": f"Bearer {keys.create_key('worker-1', Role.WORKER)}"}
    client = application.test_client()
    shown = client.get("/types/email", headers=admin).json
    assert {name: shown[name] for name in ("fairness", "ordering", "on_failure",
                                           "blocked_keys", "max_running")} == {
        "fairness": None, "ordering": None, "on_failure": "skip", "blocked_keys": 0,
        "max_running": 5}

    changed = client.patch("/types/email", json={"ordering": "key", "fairness": "key"},
                           headers=admin)
    assert changed.status_code == 200, changed.json
    assert (changed.json["ordering"], changed.json["fairness"]) == ("key", "key")
    # Each key's turn is its running job, else its oldest unfinished one (not its highest
    # priority); the rest of the key waits. The key's and the keyless pending jobs are
    # numbered, each its key's first round among its producer's keys, hence one round each
    # among the producers (keys per producer, migration 0021).
    assert stored("SELECT type, concurrency_key, job_id, blocked FROM key_turns "
                  "ORDER BY concurrency_key") == [("email", "a", 2, 0), ("email", "b", 5, 0)]
    assert statuses() == {1: ("completed", None), 2: ("running", None), 3: ("waiting", None),
                          4: ("waiting", None), 5: ("pending", 0), 6: ("waiting", None),
                          7: ("failed", None), 8: ("pending", None), 9: ("cancelled", None),
                          10: ("pending", 1)}
    reasons = client.get("/jobs/3/explain", headers=admin).json["reasons"]
    assert (reasons[0]["code"], reasons[0]["job_id"]) == ("key_turn", 2)

    claimed = client.post("/jobs/claim-many", json={"max_jobs": 10, "types": ["email"]},
                          headers=worker)
    assert [claimed_job["id"] for claimed_job in claimed.json["jobs"]] == [5, 10]
    assert client.post("/jobs/5/complete", json={}, headers=worker).status_code == 200
    # Key b's turn passes to its next job.
    again = client.post("/jobs/claim", json={"types": ["email"]}, headers=worker)
    assert again.status_code == 200 and again.json["id"] == 6
    application.extensions["queuelog"].db.engine.dispose()

    command.downgrade(alembic_config(empty_db_url), "0015")

    # Job 3 waited for its key's turn alone; job 4 still waits for job 8.
    assert stored("SELECT id, status FROM jobs WHERE id IN (3, 4) ORDER BY id") == [
        (3, "pending"), (4, "waiting")]
    engine.dispose()


def test_running_jobs_migration_keeps_the_stored_jobs_and_lets_them_be_controlled(
        empty_db_url, engine_name):
    """0017 on a database 0016 filled: every job stays as it was, none has a timeout, an
    expiry or controls; the upgraded service then cancels a running job stored before (its
    heartbeat is told, its report ends it cancelled), takes a new job's timeout and expiry,
    and the way down drops what 0017 added and keeps the jobs."""
    upgrade(empty_db_url, "0016")
    now = 1_800_000_000_000_000
    job = {"type": "email", "payload": "{}", "priority": 10, "status": "pending",
           "retry_count": 0, "max_retries": 3, "producer": "producer-1", "run_at": 0,
           "claimed_at": None, "worker_id": None, "lease_expires_at": None,
           "lease_token": None, "error": None, "created_at": 0, "updated_at": 0,
           "concurrency_key": None, "fair_round": None}
    rows = [
        {**job, "status": "completed"},
        {**job, "status": "running", "worker_id": "worker-1", "claimed_at": now - 10_000_000,
         "lease_expires_at": now + 3_600_000_000, "lease_token": "t"},
        job,
        {**job, "status": "failed", "retry_count": 3, "error": "boom"},
    ]
    rows = [{**row, "created_at": n, "updated_at": n} for n, row in enumerate(rows, 1)]
    engine = make_engine(empty_db_url, pooled=False)
    with engine.begin() as conn:  # the table as 0016 left it
        conn.execute(table("jobs", *map(column, job)).insert(), rows)
    jobs_0016 = table("jobs", column("id"), *map(column, job))

    def stored(query: Any) -> list[tuple[Any, ...]]:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(
                text(query) if isinstance(query, str) else query)]

    before = stored(select(jobs_0016).order_by(jobs_0016.c.id))

    upgrade(empty_db_url)

    assert stored(select(jobs_0016).order_by(jobs_0016.c.id)) == before
    assert stored("SELECT DISTINCT timeout_seconds, expires_at FROM jobs") == [(None, None)]
    assert stored("SELECT * FROM job_checkpoints") == []
    if engine_name == "postgresql":
        [(options,)] = stored("SELECT reloptions FROM pg_class WHERE relname = 'job_checkpoints'")
        assert "fillfactor=70" in options

    application = create_app({"TESTING": True, "DATABASE_URL": empty_db_url,
                              "JOB_TYPES": frozenset({"email"}),
                              "CLOCK": ManualClock(start_us=now), "DB_POOL_SIZE": 2})
    keys = application.extensions["queuelog"].keys
    admin = {"Authorization": f"Bearer {keys.create_key('admin-1', Role.ADMIN)}"}
    worker = {"Authorization": f"Bearer {keys.create_key('worker-1', Role.WORKER)}"}
    client = application.test_client()
    assert client.get("/jobs/2", headers=admin).json["cancel_requested"] is False
    assert client.post("/jobs/2/cancel", headers=admin).json["cancel_requested"] is True
    beat = client.post("/jobs/2/heartbeat", json={"progress": {"done": 1, "total": 2}},
                       headers=worker)
    assert beat.json["cancel_requested"] is True
    assert client.post("/jobs/2/fail", json={"error": "stopping"},
                       headers=worker).json["status"] == "cancelled"
    new = client.post("/jobs", json={"type": "email", "timeout_seconds": 30,
                                     "expires_in_seconds": 60}, headers=admin).json
    assert (new["timeout_seconds"], new["expires_at"]) == (30, "2027-01-15T08:01:00.000000Z")
    claimed = client.post("/jobs/claim", json={}, headers=worker).json
    assert claimed["id"] == 3 and claimed["checkpoint"] is None
    application.extensions["queuelog"].db.engine.dispose()

    command.downgrade(alembic_config(empty_db_url), "0016")

    assert [row[:2] for row in stored("SELECT id, status FROM jobs ORDER BY id")] == [
        (1, "completed"), (2, "cancelled"), (3, "running"), (4, "failed"), (5, "pending")]
    engine.dispose()


def test_reserved_jobs_migration_keeps_jobs_and_keys_and_takes_reservations(empty_db_url):
    """0018 on a database 0017 filled: every job and key stays as it was, no key has a check,
    no reservation exists; the upgraded service reserves, confirms and releases; the way
    down releases (cancels) a job still reserved, which an older release could never run."""
    upgrade(empty_db_url, "0017")
    now = 1_800_000_000_000_000
    job = {"type": "email", "payload": "{}", "priority": 10, "status": "pending",
           "retry_count": 0, "max_retries": 3, "producer": "producer-1", "run_at": 0,
           "claimed_at": None, "worker_id": None, "lease_expires_at": None,
           "lease_token": None, "error": None, "created_at": 1, "updated_at": 1}
    engine = make_engine(empty_db_url, pooled=False)
    with engine.begin() as conn:  # the tables as 0017 left them
        conn.execute(table("jobs", *map(column, job)).insert(),
                     [job, {**job, "status": "completed", "created_at": 2}])
    jobs_0017 = table("jobs", column("id"), *map(column, job))

    def stored(query: Any) -> list[tuple[Any, ...]]:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(
                text(query) if isinstance(query, str) else query)]

    before = stored(select(jobs_0017).order_by(jobs_0017.c.id))
    upgrade(empty_db_url)

    assert stored(select(jobs_0017).order_by(jobs_0017.c.id)) == before
    assert stored("SELECT * FROM job_reservations") == []
    application = create_app({"TESTING": True, "DATABASE_URL": empty_db_url,
                              "JOB_TYPES": frozenset({"email"}),
                              "CLOCK": ManualClock(start_us=now), "DB_POOL_SIZE": 2})
    keys = application.extensions["queuelog"].keys
    producer = {"Authorization": f"Bearer {keys.create_key('producer-1', Role.PRODUCER)}"}
    assert stored("SELECT check_url, check_secret FROM api_keys") == [(None, None)]
    client = application.test_client()
    reserve = {"type": "email", "reserve": {"confirm_within_seconds": 60}}
    confirmed = client.post("/jobs", json=reserve, headers=producer).json["id"]
    released = client.post("/jobs", json=reserve, headers=producer).json["id"]
    left = client.post("/jobs", json=reserve, headers=producer).json["id"]
    assert client.post(f"/jobs/{confirmed}/confirm", headers=producer).json["status"] == "pending"
    assert client.post(f"/jobs/{released}/release",
                       headers=producer).json["status"] == "cancelled"
    application.extensions["queuelog"].db.engine.dispose()

    command.downgrade(alembic_config(empty_db_url), "0017")

    assert stored("SELECT id, status FROM jobs ORDER BY id")[-3:] == [
        (confirmed, "pending"), (released, "cancelled"), (left, "cancelled")]
    engine.dispose()


def test_retention_and_failure_groups_migration_keeps_jobs_and_groups_new_failures(
        empty_db_url):
    """0019 on a database 0018 filled: every job, attempt and type setting stays as it was,
    no attempt has a fingerprint and no group exists; the upgraded service groups a new
    failure and shows each type's retention (the defaults); the way down drops what 0019
    added and keeps the jobs and attempts."""
    upgrade(empty_db_url, "0018")
    now = 1_800_000_000_000_000
    job = {"type": "email", "payload": "{}", "priority": 10, "status": "failed",
           "retry_count": 1, "max_retries": 0, "producer": "producer-1", "run_at": 0,
           "claimed_at": None, "worker_id": None, "lease_expires_at": None,
           "lease_token": None, "error": "smtp 421", "created_at": 1, "updated_at": 2}
    attempt = {"job_id": 1, "number": 1, "worker_id": "worker-1", "claimed_at": 1,
               "ended_at": 2, "outcome": "failed", "error": "smtp 421"}
    engine = make_engine(empty_db_url, pooled=False)
    with engine.begin() as conn:  # the tables as 0018 left them
        conn.execute(table("jobs", *map(column, job)).insert(),
                     [job, {**job, "status": "pending", "error": None, "created_at": 3}])
        conn.execute(table("job_attempts", *map(column, attempt)).insert(), [attempt])
        conn.execute(text("INSERT INTO job_types (type, paused, updated_at) "
                          "VALUES ('email', true, 5)"))
    jobs_0018 = table("jobs", column("id"), *map(column, job))
    attempts_0018 = table("job_attempts", column("id"), *map(column, attempt))

    def stored(query: Any) -> list[tuple[Any, ...]]:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(
                text(query) if isinstance(query, str) else query)]

    before = (stored(select(jobs_0018).order_by(jobs_0018.c.id)),
              stored(select(attempts_0018).order_by(attempts_0018.c.id)))
    upgrade(empty_db_url)

    assert (stored(select(jobs_0018).order_by(jobs_0018.c.id)),
            stored(select(attempts_0018).order_by(attempts_0018.c.id))) == before
    assert stored("SELECT fingerprint FROM job_attempts") == [(None,)]
    assert stored("SELECT * FROM failure_groups") == []
    assert stored("SELECT retention_completed_seconds, retention_failed_seconds, "
                  "retention_cancelled_seconds FROM job_types") == [(None, None, None)]
    application = create_app({"TESTING": True, "DATABASE_URL": empty_db_url,
                              "JOB_TYPES": frozenset({"email"}),
                              "CLOCK": ManualClock(start_us=now), "DB_POOL_SIZE": 2})
    keys = application.extensions["queuelog"].keys
    admin = {"Authorization": f"Bearer {keys.create_key('admin-1', Role.ADMIN)}"}
    worker = {"Authorization": f"Bearer {keys.create_key('worker-1', Role.WORKER)}"}
    client = application.test_client()
    assert client.get("/types/email", headers=admin).json["retention"] == {
        "completed_seconds": 7 * 86_400, "failed_seconds": 30 * 86_400,
        "cancelled_seconds": 7 * 86_400}
    assert client.patch("/types/email", headers=admin, json={"paused": False}).status_code == 200
    claimed = client.post("/jobs/claim", json={}, headers=worker).json
    assert claimed["id"] == 2
    client.post("/jobs/2/fail", headers=worker,
                json={"lease_token": claimed["lease_token"], "error": "smtp 421 busy"})
    [group] = client.get("/failures", headers=admin).json["groups"]
    assert (group["type"], group["count"], group["jobs_failed"]) == ("email", 1, 1)
    application.extensions["queuelog"].db.engine.dispose()

    command.downgrade(alembic_config(empty_db_url), "0018")

    assert stored("SELECT id, status FROM jobs ORDER BY id") == [(1, "failed"), (2, "failed")]
    assert len(stored("SELECT id FROM job_attempts")) == 2
    engine.dispose()


def test_a_postgres_write_undone_to_break_a_deadlock_is_run_again(postgres_server):
    """Two writes that lock two rows in opposite orders: PostgreSQL undoes one of them to break
    the deadlock, and Database.run_write runs it again, so both land. (SQLite serialises its
    writers: two write transactions never overlap there.)"""
    db = Database(make_engine(postgres_server.create_database()))
    with db.write() as conn:
        conn.execute(text("INSERT INTO key_activity (name, last_seen_at) VALUES ('a', 0), "
                          "('b', 0)"))
    both_hold_one = threading.Barrier(2)
    runs: list[str] = []

    def lock_in_order(first: str, second: str) -> Any:
        def work(conn: Any) -> str:
            runs.append(first)
            lock = text("SELECT name FROM key_activity WHERE name = :name FOR UPDATE")
            conn.execute(lock, {"name": first})
            if runs.count(first) == 1:  # only the first run of each waits for the other
                both_hold_one.wait(timeout=10)
            conn.execute(lock, {"name": second})
            conn.execute(text("UPDATE key_activity SET last_seen_at = last_seen_at + 1 "
                              "WHERE name = :name"), {"name": second})
            return first
        return db.run_write(work)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda pair: lock_in_order(*pair), [("a", "b"), ("b", "a")]))
    assert results == ["a", "b"]
    # One of the two ran again (under load a rerun may meet the other's lock once more and
    # run a third time); either way each write landed exactly once, which the sum shows.
    assert len(runs) >= 3
    with db.read() as conn:
        assert conn.execute(text("SELECT sum(last_seen_at) FROM key_activity")).scalar() == 2
    db.engine.dispose()


def test_stats_tags_and_trace_migration_keeps_jobs_and_schedules_and_serves_the_new_fields(
        empty_db_url):
    """0020 on a database 0019 filled: every job and schedule stays as it was, with no tags,
    no trace and no stats; the upgraded service stores a new job's tags and trace context,
    hands the trace to its claim, counts it, and a schedule stored before fires without a
    trace; the way down drops what 0020 added and keeps the jobs."""
    upgrade(empty_db_url, "0019")
    now = 1_800_000_000_000_000
    job = {"type": "email", "payload": "{}", "priority": 10, "status": "pending",
           "retry_count": 0, "max_retries": 3, "producer": "producer-1", "run_at": 0,
           "claimed_at": None, "worker_id": None, "lease_expires_at": None,
           "lease_token": None, "error": None, "created_at": 1, "updated_at": 2}
    schedule = {"name": "nightly", "cron": "* * * * *", "timezone": "UTC",
                "job": '{"type":"email"}', "catch_up": "latest", "paused": False,
                "next_run_at": now + 60_000_000, "last_run_at": None, "last_job_id": None,
                "created_at": 1, "updated_at": 1}
    engine = make_engine(empty_db_url, pooled=False)
    with engine.begin() as conn:  # the tables as 0019 left them
        conn.execute(table("jobs", *map(column, job)).insert(), [job])
        conn.execute(table("schedules", *map(column, schedule)).insert(), [schedule])
    jobs_0019 = table("jobs", column("id"), *map(column, job))
    schedules_0019 = table("schedules", *map(column, schedule))

    def stored(query: Any) -> list[tuple[Any, ...]]:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(
                text(query) if isinstance(query, str) else query)]

    before = (stored(select(jobs_0019)), stored(select(schedules_0019)))
    upgrade(empty_db_url)

    assert (stored(select(jobs_0019)), stored(select(schedules_0019))) == before
    for name, key in (("job_tags", "job_id"), ("job_traces", "job_id"),
                      ("job_stats", "minute"), ("job_depth", "minute")):
        assert stored(select(table(name, column(key)))) == [], name
    assert stored("SELECT traceparent, tracestate FROM schedules") == [(None, None)]
    clock = ManualClock(start_us=now)
    application = create_app({"TESTING": True, "DATABASE_URL": empty_db_url,
                              "JOB_TYPES": frozenset({"email"}), "CLOCK": clock,
                              "DB_POOL_SIZE": 2})
    services = application.extensions["queuelog"]
    keys = services.keys
    admin = {"Authorization": f"Bearer {keys.create_key('admin-1', Role.ADMIN)}"}
    producer = {"Authorization": f"Bearer {keys.create_key('producer-1', Role.PRODUCER)}"}
    worker = {"Authorization": f"Bearer {keys.create_key('worker-1', Role.WORKER)}"}
    client = application.test_client()
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    made = client.post("/jobs", json={"type": "email", "tags": ["order:1001", "vip"]},
                       headers={**producer, "traceparent": traceparent})
    assert made.status_code == 201 and made.json["tags"] == ["order:1001", "vip"]
    first = client.post("/jobs/claim", json={}, headers=worker).json
    assert first["id"] == 1 and first["trace"] is None  # stored before: no trace
    second = client.post("/jobs/claim", json={}, headers=worker).json
    assert second["trace"] == {"traceparent": traceparent, "tracestate": None}
    listed = client.get("/jobs", query_string={"tag": "vip"}, headers=admin).json["jobs"]
    assert [job["id"] for job in listed] == [second["id"]]
    clock.advance(60)
    services.schedules.fire_due()
    fired = client.post("/jobs/claim", json={}, headers=worker).json
    assert fired["schedule"] == "nightly" and fired["trace"] is None
    bucket = client.get("/stats", query_string={"type": "email", "from": "2027-01-15T08:00:00Z",
                                                "to": "2027-01-15T08:02:00Z"},
                        headers=admin).json["buckets"]
    assert [(b["enqueued"], b["claimed"]) for b in bucket] == [(1, 2), (1, 1)]
    services.db.engine.dispose()

    command.downgrade(alembic_config(empty_db_url), "0019")

    assert stored("SELECT id, status FROM jobs ORDER BY id") == [
        (1, "running"), (2, "running"), (3, "running")]
    engine.dispose()


def test_dependency_cascades_migration_keeps_waiting_jobs_and_applies_their_dependencies_end(
        empty_db_url):
    """0022 on a database 0021 filled: a waiting job and its edge stay as they were, no
    cascade is under way; the upgraded service releases the job when its dependency
    completes; the way down drops the table and the index and keeps the jobs."""
    upgrade(empty_db_url, "0021")
    job = {"type": "email", "payload": "{}", "priority": 10, "retry_count": 0,
           "max_retries": 3, "producer": "producer-1", "run_at": 0, "created_at": 1,
           "updated_at": 2}
    edge = {"job_id": 2, "position": 0, "depends_on_id": 1, "cancel_on_failure": 1,
            "resolved": 0}
    engine = make_engine(empty_db_url, pooled=False)
    with engine.begin() as conn:  # the tables as 0021 left them
        jobs_0021 = table("jobs", *map(column, [*job, "status"]))
        conn.execute(jobs_0021.insert(), [{**job, "status": "pending"},
                                          {**job, "status": "waiting"}])
        conn.execute(table("job_dependencies", *map(column, edge)).insert(), [edge])

    def stored(query: str) -> list[tuple[Any, ...]]:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(query))]

    upgrade(empty_db_url)

    assert stored("SELECT id, status FROM jobs ORDER BY id") == [(1, "pending"), (2, "waiting")]
    assert stored("SELECT job_id, depends_on_id, resolved FROM job_dependencies") == [(2, 1, 0)]
    assert stored("SELECT job_id FROM dependency_cascades") == []
    application = create_app({"TESTING": True, "DATABASE_URL": empty_db_url,
                              "JOB_TYPES": frozenset({"email"}), "DB_POOL_SIZE": 2,
                              "CLOCK": ManualClock(start_us=1_800_000_000_000_000)})
    services = application.extensions["queuelog"]
    worker = {"Authorization": f"Bearer {services.keys.create_key('worker-1', Role.WORKER)}"}
    client = application.test_client()
    first = client.post("/jobs/claim", json={}, headers=worker).json
    assert first["id"] == 1
    assert client.post("/jobs/1/complete", json={"result": {}}, headers=worker).status_code == 200
    assert client.post("/jobs/claim", json={}, headers=worker).json["id"] == 2
    services.db.engine.dispose()

    command.downgrade(alembic_config(empty_db_url), "0021")

    assert stored("SELECT id, status FROM jobs ORDER BY id") == [(1, "completed"), (2, "running")]
    with engine.connect() as conn:
        tables = {row[0] for row in conn.execute(text(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'index')"
            if engine.dialect.name == "sqlite" else
            "SELECT relname FROM pg_class WHERE relkind IN ('r', 'i')"))}
    assert "dependency_cascades" not in tables
    assert "ix_job_dependencies_unresolved" not in tables
    engine.dispose()
