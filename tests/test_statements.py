"""Hot statements run on SQLite's driver cursor (app/storage/statements.py): the same rows and the
same errors as through Core, and nothing silently left on the slow path."""

from __future__ import annotations

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, event, insert, select
from sqlalchemy.exc import IntegrityError

from app.core.errors import IdempotencyKeyTaken
from app.jobs.sql import repository as job_repository
from app.jobs.timeline import repository as history_repository
from app.storage.engine import Database, make_engine
from app.storage.statements import DriverStatement

_metadata = MetaData()
_things = Table("things", _metadata, Column("id", Integer, primary_key=True),
                Column("name", String(20), nullable=False, unique=True))
_insert_thing = DriverStatement(insert(_things).returning(_things.c.id, _things.c.name))
_thing_named = DriverStatement(select(_things).where(_things.c.name == "b"))


@pytest.fixture
def database(tmp_path):
    database = Database(make_engine(f"sqlite:///{tmp_path / 'things.sqlite3'}"))
    _metadata.create_all(database.engine)
    yield database
    database.engine.dispose()


# The driver path is SQLite's alone (PostgreSQL always runs through Core): this test is
# collected for SQLite only rather than skipped on PostgreSQL.
@pytest.mark.parametrize("engine_name", ["sqlite"], indirect=True)
def test_the_hot_statements_of_a_job_cycle_take_the_driver_path(engine_name, api, producer,
                                                                  worker, monkeypatch):
    # Which plan each statement run got: a listener on the cursor events would itself send
    # every statement through Core, so the plans are watched where they are chosen.
    chosen = []
    choose = DriverStatement._driver_plan

    def watched(statement, conn, params):
        plan = choose(statement, conn, params)
        chosen.append((statement, plan))
        return plan

    monkeypatch.setattr(DriverStatement, "_driver_plan", watched)
    job = api.enqueue(producer).json
    claimed = api.claim(worker).json
    assert claimed["id"] == job["id"]
    assert api.complete(worker, job["id"], lease_token=claimed["lease_token"]).status_code == 200

    # The enqueue's INSERT (with its key check), the claim and the complete's UPDATE: each
    # a statement of its own, and every one compiled for the driver.
    assert len({id(statement) for statement, _plan in chosen}) >= 3
    assert [statement.statement for statement, plan in chosen if plan is None] == []


def test_rows_and_constants_are_as_through_core(database):
    with database.write() as conn:
        assert _insert_thing.rows(conn, {"name": "a"}) == [(1, "a")]
        assert _insert_thing.first(conn, {"name": "b"}) == (2, "b")
        # A literal in the statement is bound by SQLAlchemy itself, and kept.
        assert _thing_named.rows(conn, {}) == [tuple(row) for row in
                                                conn.execute(_thing_named.statement)]


def test_a_driver_error_is_sqlalchemys_and_rolls_back_with_the_transaction(database):
    with pytest.raises(IntegrityError), database.write() as conn:
        _insert_thing.rows(conn, {"name": "a"})
        _insert_thing.rows(conn, {"name": "a"})
    with database.read() as conn:
        assert conn.execute(select(_things)).all() == []


def test_cursor_listeners_see_every_statement(database):
    seen: list[str] = []
    with database.write() as conn:
        event.listen(conn, "before_cursor_execute", lambda *args: seen.append(args[2]))
        _insert_thing.rows(conn, {"name": "a"})
    assert any(sql.startswith("INSERT INTO things") for sql in seen)


def test_listeners_on_the_engine_see_every_statement_too(database):
    seen: list[str] = []
    event.listen(database.engine, "before_cursor_execute", lambda *args: seen.append(args[2]))
    with database.write() as conn:
        _insert_thing.rows(conn, {"name": "a"})
    assert any(sql.startswith("INSERT INTO things") for sql in seen)


_insert_plain_thing = DriverStatement(insert(_things))


def test_many_rows_are_stored_as_through_core_and_come_back_each_once(database):
    with database.write() as conn:
        _insert_plain_thing.execute_many(conn, [{"name": "a"}, {"name": "b"}])
        returned = _insert_thing.insert_many(conn, [{"name": f"n{i}"} for i in range(2500)])
        assert returned is not None
        assert sorted(name for _, name in returned) == sorted(f"n{i}" for i in range(2500))
    with database.read() as conn:
        assert [name for _, name in conn.execute(select(_things).order_by(_things.c.id))] == [
            "a", "b", *(f"n{i}" for i in range(2500))]


def test_an_error_in_many_rows_is_sqlalchemys_and_stores_none_of_them(database):
    with pytest.raises(IntegrityError), database.write() as conn:
        _insert_thing.insert_many(conn, [{"name": "a"}, {"name": "b"}, {"name": "a"}])
    with pytest.raises(IntegrityError), database.write() as conn:
        _insert_plain_thing.execute_many(conn, [{"name": "c"}, {"name": "c"}])
    with database.read() as conn:
        assert conn.execute(select(_things)).all() == []


def test_a_batch_of_jobs_comes_back_in_the_order_sent(db_url):
    # Rows alike but for their payload, sent so that their payloads do not sort as sent.
    database = Database(make_engine(db_url))
    try:
        now = 1_700_000_000_000_000
        rows = [{"type": "email", "payload": f'{{"n":{(i * 7919) % 1000}}}', "priority": 2,
                 "status": "pending", "retry_count": 0, "max_retries": 3, "producer": "p",
                 "run_at": now, "created_at": now, "updated_at": now} for i in range(1000)]
        with database.write() as conn:
            made = job_repository.JobRepository(conn).insert_jobs(rows)
        assert [job.payload for job in made] == [row["payload"] for row in rows]
        assert [job.id for job in made] == sorted(job.id for job in made)
    finally:
        database.engine.dispose()


def test_many_events_and_a_refused_batch_on_either_engine(db_url):
    # PostgreSQL sends many rows as one JSON document (columns all NULL among them); SQLite
    # as multi-row VALUES. Either stores each row once, or none when one row is refused.
    database = Database(make_engine(db_url))
    try:
        now = 1_700_000_000_000_000
        rows = [{"type": "email", "payload": "{}", "priority": 2, "status": "pending",
                 "retry_count": 0, "max_retries": 3, "producer": "p", "run_at": now,
                 "created_at": now, "updated_at": now, "idempotency_key": f"k{i}",
                 "concurrency_key": None} for i in range(3)]
        with database.write() as conn:
            made = job_repository.JobRepository(conn).insert_jobs(rows)
            history_repository.HistoryRepository(conn).add_events(
                [{"job_id": job.id, "at": now, "event": "enqueued", "actor": "p",
                  "detail": None} for job in made])
        assert [job.idempotency_key for job in made] == ["k0", "k1", "k2"]
        assert all(job.concurrency_key is None for job in made)
        if database.engine.dialect.name == "postgresql":
            insert_jobs = job_repository._insert_statement("postgresql", skip_conflicts=False)
            assert insert_jobs._row_documents and history_repository._insert_event._row_documents
        with database.read() as conn:
            events = history_repository.HistoryRepository(conn).events_of(made[1].id, 10)
        assert [event.event for event in events] == ["enqueued"]
        with pytest.raises(IdempotencyKeyTaken), database.write() as conn:
            job_repository.JobRepository(conn).insert_jobs(
                [{**rows[0], "idempotency_key": "k9"}, rows[1]])
        with database.read() as conn:
            assert job_repository.JobRepository(conn).find_by_idempotency_key("p", "k9") is None
    finally:
        database.engine.dispose()
