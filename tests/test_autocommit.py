"""Work that is one statement runs on PostgreSQL in autocommit (Database.run_statement): no
BEGIN, no COMMIT. A second statement that may write would not be atomic with the first,
already committed: it fails loudly before it is sent. On SQLite the work runs in the group
commit's transaction as any write."""

from __future__ import annotations

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, func, insert, select

from app.storage.engine import (
    Database,
    SecondStatementInAutocommit,
    make_engine,
    need_transaction,
    statement_of_its_own,
)

_metadata = MetaData()
_notes = Table("autocommit_notes", _metadata, Column("id", Integer, primary_key=True))


@pytest.fixture
def database(db_url):
    database = Database(make_engine(db_url))
    _metadata.create_all(database.engine)
    yield database
    _metadata.drop_all(database.engine)
    database.engine.dispose()


def _notes_stored(database: Database) -> list[int]:
    with database.read() as conn:
        return list(conn.scalars(select(_notes.c.id).order_by(_notes.c.id)))


def test_one_statement_is_committed_by_itself(database):
    def note(conn):
        return conn.execute(insert(_notes).values(id=1).returning(_notes.c.id)).scalar_one()

    assert database.run_statement(note) == 1
    assert _notes_stored(database) == [1]


def test_reads_after_the_statement_are_allowed(database):
    def note_and_count(conn):
        conn.execute(insert(_notes).values(id=1))
        return conn.execute(select(func.count()).select_from(_notes)).scalar_one()

    assert database.run_statement(note_and_count) == 1


@pytest.mark.parametrize("engine_name", ["postgresql"], indirect=True)
def test_a_second_write_fails_before_it_is_sent(engine_name, database):
    def two_notes(conn):
        conn.execute(insert(_notes).values(id=1))
        conn.execute(insert(_notes).values(id=2))

    with pytest.raises(SecondStatementInAutocommit):
        database.run_statement(two_notes)
    assert _notes_stored(database) == [1]  # the first was committed alone; the second never sent


@pytest.mark.parametrize("engine_name", ["postgresql"], indirect=True)
def test_a_write_declared_a_statement_of_its_own_is_allowed(engine_name, database):
    def two_notes(conn):
        conn.execute(insert(_notes).values(id=1))
        with statement_of_its_own(conn):
            conn.execute(insert(_notes).values(id=2))
        conn.execute(insert(_notes).values(id=3))

    with pytest.raises(SecondStatementInAutocommit):
        database.run_statement(two_notes)
    assert _notes_stored(database) == [1, 2]


def test_run_write_is_unguarded(database):
    def two_notes(conn):
        conn.execute(insert(_notes).values(id=1))
        conn.execute(insert(_notes).values(id=2))

    database.run_write(two_notes)
    assert _notes_stored(database) == [1, 2]


def test_work_whose_statement_changed_nothing_may_go_on_in_a_transaction(database):
    runs = []

    def note_unless_renamed(conn):
        runs.append(conn.get_execution_options().get("isolation_level"))
        if not conn.execute(_notes.update().where(_notes.c.id == 7).values(id=8)).rowcount:
            need_transaction(conn)  # nothing changed: the rest needs a transaction
            conn.execute(insert(_notes).values(id=1))
            conn.execute(insert(_notes).values(id=2))
        return len(runs)

    runs_taken = database.run_statement(note_unless_renamed)
    assert _notes_stored(database) == [1, 2]
    assert runs_taken == (2 if database.engine.dialect.name == "postgresql" else 1)
    if database.engine.dialect.name == "postgresql":
        assert runs == ["AUTOCOMMIT", None]  # alone first, then in a transaction


@pytest.mark.parametrize("engine_name", ["postgresql"], indirect=True)
def test_a_statement_undone_to_break_a_deadlock_is_run_again(engine_name, database):
    # PostgreSQL's own deadlock_detected, raised by the server on the first run: the
    # statement committed nothing, so it runs again, as a transaction would.
    runs = []

    def note(conn):
        runs.append(len(runs))
        if len(runs) == 1:
            conn.exec_driver_sql(
                "DO $$ BEGIN RAISE EXCEPTION 'deadlock' USING ERRCODE = '40P01'; END $$")
        return conn.execute(insert(_notes).values(id=7).returning(_notes.c.id)).scalar_one()

    assert database.run_statement(note) == 7
    assert runs == [0, 1] and _notes_stored(database) == [7]
