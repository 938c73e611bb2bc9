"""The engine and its engine-specific hooks, and the Database the services write through.

SQLite and PostgreSQL differ in exactly these places, all in app/storage:
- SQLite connections get WAL, a busy timeout and `synchronous`, and Python's sqlite3
  module is kept from issuing its own BEGIN so that writes can open with BEGIN IMMEDIATE
  (SQLAlchemy's documented pysqlite recipe);
- the claim's `FOR UPDATE SKIP LOCKED`, rendered by PostgreSQL and left out by SQLite, and the
  dialect's own INSERT for ON CONFLICT DO NOTHING (the repositories' statements);
- PostgreSQL connections are never pinged (a round trip on every checkout): a pooled
  connection whose server closed it is dropped at checkout by a look at its socket, and a
  write whose first statement still meets a dead connection runs again once on another
  (`Database.run_write`), which is safe because nothing of it can have been committed;
- a step that is one statement runs on PostgreSQL in autocommit, without BEGIN and COMMIT
  (`Database.run_statement`).
"""

from __future__ import annotations

import os
import random
import select
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import quote

from sqlalchemy import (
    Connection,
    Engine,
    create_engine,
    event,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, DisconnectionError, OperationalError
from sqlalchemy.pool import NullPool

from app.config import DEFAULT_COUNTING_READS
from app.core.errors import CountingReadsBusy
from app.core.redaction import redact_error
from app.storage.connect_args import postgres_connect_args
from app.storage.files import create_private
from app.storage.group_commit import SqliteWriter

T = TypeVar("T")


def _install_sqlite_hooks(engine: Engine, synchronous: str, busy_timeout_ms: int,
                          read_only: bool) -> None:
    path = engine.url.database
    if path and not engine.url.query:  # a plain file path, not a URI with a mode of its own

        @event.listens_for(engine, "do_connect")
        def create_database_file(*_args: Any) -> None:
            # Created here rather than by SQLite, which would give it (and so its -wal and
            # -shm files) whatever the umask allows.
            create_private(path)

    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Keep pysqlite from emitting BEGIN itself; the "begin" hook below does it.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if not read_only:  # the journal mode is written into the file; a reader leaves it
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(conn: Connection) -> None:
        # A write that starts as a reader can fail with SQLITE_BUSY without waiting when it
        # later needs the lock; BEGIN IMMEDIATE takes the write lock up front and waits.
        sql = "BEGIN IMMEDIATE" if conn.get_execution_options().get("queuelog_write") else "BEGIN"
        if conn.dispatch.before_cursor_execute or conn.dispatch.after_cursor_execute:
            conn.exec_driver_sql(sql)  # whoever listens sees it, as every other statement
            return
        # Straight to the driver otherwise: through Core this costs several times the
        # statement, and on SQLite it opens every write, inside the serial section.
        error_class = conn.dialect.loaded_dbapi.Error
        try:
            conn.connection.driver_connection.execute(sql)  # type: ignore[union-attr]
        except error_class as error:
            raise DBAPIError.instance(sql, (), error, error_class,
                                      dialect=conn.dialect) from error


class DatabaseSetupError(ValueError):
    """The database named cannot be used as it is. The message says what is wrong and what
    to do, in one line: the command line prints it as it is."""


_ENGINES = ("queuelog runs on SQLite (sqlite:////path/to/queuelog.sqlite3) or PostgreSQL "
            "(postgresql+psycopg://user@host/database)")


def parse_database_url(url: str) -> URL:
    """The URL parsed, if queuelog can run on it; DatabaseSetupError says why not. (SQLAlchemy
    would fail later and deeper: a dialect it cannot load, a driver not installed.)"""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise DatabaseSetupError(
            f"{redact_error(url)!r} is not a database URL; {_ENGINES}") from None
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "postgres" or (backend == "postgresql" and driver != "psycopg"):
        raise DatabaseSetupError(
            f"{parsed.drivername}:// names a driver queuelog does not install: write "
            "postgresql+psycopg://user@host/database")
    if backend not in ("sqlite", "postgresql"):
        raise DatabaseSetupError(f"{parsed.drivername}:// is not supported: {_ENGINES}")
    if backend == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise DatabaseSetupError("queuelog needs a SQLite file, not an in-memory database")
    return parsed


def shown_url(url: str) -> str:
    """The URL as it may be printed: its password hidden."""
    return make_url(url).render_as_string(hide_password=True)


def sqlite_path(url: str) -> str | None:
    """The SQLite file a URL names (absolute), or None for another engine."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    return os.path.abspath(parsed.database or "")


def database_identity(url: str) -> str:
    """The database `url` names, the same for every URL that names it and never with a
    password: a SQLite file's absolute path, a PostgreSQL URL with its password hidden."""
    return sqlite_path(url) or shown_url(url)


def explain_database_error(error: BaseException, url: str) -> str | None:
    """One line for an operator: what went wrong talking to the database at `url`, and what to
    do. None for an error that is not the database's (a bug, which keeps its traceback).

    The driver's own first line is kept: it names the cause exactly (a refused connection, a
    missing database or role), and a connection failure carries no SQLSTATE to go by."""
    if not isinstance(error, DBAPIError):
        return None
    orig = str(error.orig).strip()
    cause = orig.splitlines()[0] if orig else type(error.orig).__name__
    path = sqlite_path(url)
    if path is not None:
        return (f"the SQLite database {path} cannot be used: {cause}; check the file, its "
                "directory and their permissions, or choose another (QUEUELOG_DATABASE_URL)")
    parsed = make_url(url)
    where = f"{parsed.host or 'localhost'}:{parsed.port or 5432}/{parsed.database or ''}"
    if getattr(error.orig, "sqlstate", None) == "42P01":  # undefined_table
        return (f"the PostgreSQL database {where} has no queuelog tables: run "
                "`queuelog db upgrade` first")
    if isinstance(error, OperationalError):
        return (f"cannot use PostgreSQL at {where}: {cause}; check that it is running, that "
                "the database and user exist, and QUEUELOG_DATABASE_URL")
    return f"PostgreSQL at {where} refused a statement: {cause}"


def make_engine(url: str, *, pooled: bool = True, pool_size: int = 5, pool_timeout: int = 10,
                sqlite_synchronous: str = "FULL", sqlite_busy_timeout_ms: int = 30_000,
                read_only: bool = False, notify: bool = True,
                prepared_statements: bool = True) -> Engine:
    """An engine for `url`, with the hooks its dialect needs. Connects lazily.

    `pooled=False` is for one-off commands (migrations, key management): nothing stays open.
    `notify=False` (PostgreSQL) has the database's triggers send no notification for this
    engine's sessions.
    `prepared_statements=False` (PostgreSQL) has the driver prepare nothing: for a transaction
    pooler (PgBouncer before 1.21) that hands each transaction to any server session.
    `read_only=True` opens a SQLite file read-only (a `mode=ro` URI), which also refuses to
    create a missing file; it is for reading a database another service owns (a copy's
    source), and changes nothing on other engines.
    """
    parsed = parse_database_url(url)
    is_sqlite = parsed.get_backend_name() == "sqlite"
    if is_sqlite and read_only:
        path = os.path.abspath(parsed.database or "")
        url = parsed.set(database=f"file:{quote(path)}",
                         query={"mode": "ro", "uri": "true"}).render_as_string()
    options: dict[str, Any] = {}
    if pooled:
        # PostgreSQL's connections are counted against its max_connections by every host: a
        # process holds DB_POOL_SIZE at most, never more in a burst, so that a host's share
        # is known (docs/SCALING.md, "Connections"). A SQLite file has no such budget.
        options.update(pool_size=pool_size, max_overflow=pool_size if is_sqlite else 0,
                       pool_timeout=pool_timeout)
    else:
        options["poolclass"] = NullPool
    if is_sqlite:
        # Connections move between gunicorn's threads; the pool hands each to one at a time.
        # Every transaction here ends in COMMIT or ROLLBACK through SQLAlchemy, so the
        # pool's own ROLLBACK on each check-in would only cost time on every request.
        engine = create_engine(url, connect_args={"check_same_thread": False},
                               pool_reset_on_return=None, **options)
        _install_sqlite_hooks(engine, sqlite_synchronous, sqlite_busy_timeout_ms, read_only)
        return engine
    engine = create_engine(url, connect_args=postgres_connect_args(
        parsed, notify=notify, prepared_statements=prepared_statements), **options)
    _install_postgres_hooks(engine)
    return engine


# Kept in each pooled PostgreSQL connection's info: the statements sent since its checkout.
_SENT = "queuelog_sent"
# Kept likewise: the statements that may write sent in one-statement work.
_WRITES = "queuelog_writes"
# An execution option: the connection runs one statement in autocommit (run_statement).
_ONE_STATEMENT = "queuelog_one_statement"
# Set on a driver error raised by a disconnect that came at the first statement of a
# transaction: nothing of the transaction can have been committed.
NOTHING_COMMITTED = "queuelog_nothing_committed"


class SecondStatementInAutocommit(RuntimeError):
    """Work run as one statement (Database.run_statement) sent a second statement that may
    write: the first is committed already, so the two are not atomic. A defect of the work,
    raised before the statement is sent. (Plain reads before or after the write are
    allowed: a read of settings first, a read of why the write changed nothing after.)"""


def _install_postgres_hooks(engine: Engine) -> None:
    @event.listens_for(engine, "checkout")
    def drop_if_closed(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        record.info[_SENT] = record.info[_WRITES] = 0
        if _closed_by_server(dbapi_connection):
            # The pool connects this record afresh and hands that out instead.
            raise DisconnectionError("the server closed this pooled connection")

    @event.listens_for(engine, "before_cursor_execute")
    def count_sent(conn: Connection, _cursor: Any, statement: str, *_args: Any) -> None:
        info = conn.info
        info[_SENT] = info.get(_SENT, 0) + 1
        if conn.get_execution_options().get(_ONE_STATEMENT) and _may_write(statement):
            if info.get(_WRITES, 0):
                raise SecondStatementInAutocommit(
                    f"a second write in autocommit, after one already committed: "
                    f"{statement[:80]!r}")
            info[_WRITES] = 1

    @event.listens_for(engine, "handle_error")
    def on_error(context: Any) -> None:
        # A backend that dies in the middle of a pipelined statement (psycopg pipelines an
        # executemany) leaves its connection unable to leave pipeline mode; psycopg then
        # reports that rather than the lost connection. The connection can never run
        # another statement: marked a disconnect, the pool discards it at once instead of
        # failing (and logging a traceback) when it tries to roll it back on check-in.
        conn = context.connection
        raw = conn.connection.dbapi_connection if conn is not None else None
        if getattr(raw, "broken", False) or "pipeline mode" in str(context.original_exception):
            context.is_disconnect = True
        # A connection that died before or at its transaction's first statement: nothing
        # it sent can have been committed (COMMIT comes after the statements; in autocommit
        # the statement is its own commit, so there it never counts).
        if (context.is_disconnect and conn is not None and context.statement is not None
                and context.sqlalchemy_exception is not None
                and conn.info.get(_SENT, 0) <= 1
                and not conn.get_execution_options().get(_ONE_STATEMENT)):
            setattr(context.sqlalchemy_exception, NOTHING_COMMITTED, True)


class RunInTransaction(Exception):
    """Raised by need_transaction: the one-statement work is to run again in a transaction."""


def in_one_statement(conn: Connection) -> bool:
    """Whether `conn` runs one-statement work (Database.run_statement on PostgreSQL, in
    autocommit): the work may send one statement that writes, and must otherwise ask for a
    transaction (need_transaction) before it sends any."""
    return bool(conn.get_execution_options().get(_ONE_STATEMENT))


def need_transaction(conn: Connection) -> None:
    """In one-statement work (Database.run_statement), once its statement changed nothing
    (a row not found, a conflict) and what the work must do next needs a transaction
    (several writes, a lock held): raise RunInTransaction, and run_statement runs the work
    again, from the start, in a transaction. Nothing was committed, so that is safe. In a
    transaction already (and on SQLite), nothing happens: the work goes on."""
    if conn.get_execution_options().get(_ONE_STATEMENT):
        raise RunInTransaction


@contextmanager
def statement_of_its_own(conn: Connection) -> Iterator[None]:
    """In one-statement work (Database.run_statement), let the block send a write that needs
    no atomicity with the statement before it (a note whose loss only delays it): in
    autocommit it is a transaction of its own. Nothing changes elsewhere."""
    if not conn.get_execution_options().get(_ONE_STATEMENT):
        yield
        return
    info = conn.info
    writes = info.get(_WRITES, 0)
    info[_WRITES] = 0
    try:
        yield
    finally:
        info[_WRITES] = max(writes, info.get(_WRITES, 0))


def _closed_by_server(dbapi_connection: Any) -> bool:
    """Whether an idle pooled connection was closed by its server (a restart, a terminated
    backend, an idle timeout), seen without a round trip: an idle connection has nothing to
    read unless the server said goodbye (its last message, then the end of the stream).
    Anything to read counts: libpq takes a goodbye's FATAL message without marking the
    connection bad until it meets the end of the stream, which may arrive a moment later;
    the rare harmless message (a setting the server reports having changed) costs a new
    connection, never a failed request."""
    if getattr(dbapi_connection, "closed", False) or getattr(dbapi_connection, "broken", False):
        return True
    try:
        poller = select.poll()
        poller.register(dbapi_connection.pgconn.socket, select.POLLIN)
        return bool(poller.poll(0))
    except Exception:  # whatever the socket or the driver says, it is unusable
        return True


def _may_write(statement: str) -> bool:
    """Whether a statement may write: anything but a plain SELECT (which answers why the
    one statement changed nothing)."""
    return (statement.lstrip()[:6].upper() != "SELECT"
            or " FOR UPDATE" in statement.upper())


# deadlock_detected, serialization_failure: a transaction PostgreSQL undid whole, to be run
# again; a write meeting one is run up to this many times, each time after a short random
# pause that grows with the attempts: run again at once, the two transactions of a deadlock
# meet again the same way, and under load three such meetings in a row were seen (a 503 in
# a workflows test).
_RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})
_WRITE_ATTEMPTS = 5
_RETRY_PAUSE_SECONDS = 0.01


def _pause_before_attempt(attempt: int) -> None:
    time.sleep(random.uniform(0, _RETRY_PAUSE_SECONDS * attempt))


def undone_to_run_again(error: DBAPIError) -> bool:
    """Whether PostgreSQL undid the transaction whole to break a deadlock or a serialization
    failure: nothing of it stands, and it may simply run again."""
    return getattr(error.orig, "sqlstate", None) in _RETRYABLE_SQLSTATES

# How long a counting read waits for a slot of its budget before it answers 503: a slot
# frees as soon as one of them ends (a bounded count takes milliseconds), so a burst is
# served rather than refused; a flood is refused quickly, holding a thread but no connection.
COUNTING_READ_WAIT_SECONDS = 0.5


class Database:
    """Opens the transactions the services run in.

    `counting_reads` is how many counting reads (`counting_read`: the reads whose cost grows
    with what is stored, even bounded) this process runs at once. Each holds a pooled
    connection; kept below the pool's size, they can never take every connection, so that
    enqueues, claims, health checks and the schedule ticker always find one.
    """

    def __init__(self, engine: Engine, counting_reads: int = DEFAULT_COUNTING_READS) -> None:
        self.engine = engine
        self._counting_slots = threading.BoundedSemaphore(counting_reads)
        self._sqlite_writer: SqliteWriter | None = None
        if engine.dialect.name == "sqlite":
            path = engine.url.database
            self._sqlite_writer = SqliteWriter(engine, f"{path}-writelock")

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def run_write(self, fn: Callable[[Connection], T]) -> T:
        """Run `fn` in a write transaction and return its result once committed.

        On SQLite `fn` may run on another request's thread, in a transaction shared with
        other callers' work: it must follow the contract in app/storage/group_commit.py (the
        connection it is given for all its work, no effects outside the database: those come
        after this returns). Its exception rolls back its own work and is raised here.
        """
        if self._sqlite_writer is not None:
            return self._sqlite_writer.run(fn)
        attempts = 1
        reconnected = False
        while True:
            try:
                with self.write() as conn:
                    return fn(conn)
            except DBAPIError as exc:
                if getattr(exc, NOTHING_COMMITTED, False) and not reconnected:
                    # The connection was dead before its first statement (its server closed
                    # it unseen): once more, on another connection.
                    reconnected = True
                    continue
                # PostgreSQL undid the transaction whole to break a deadlock (or a
                # serialization failure): `fn` may run again (the rule above), and its
                # next run finds the other transaction committed.
                if not undone_to_run_again(exc) or attempts == _WRITE_ATTEMPTS:
                    raise
                attempts += 1
                _pause_before_attempt(attempts)

    def run_statement(self, fn: Callable[[Connection], T]) -> T:
        """As run_write, for work that sends one statement that may write: on PostgreSQL in
        autocommit, without BEGIN and COMMIT (the statement is atomic by itself); elsewhere
        exactly as run_write. What `fn` sends after it may only be plain SELECTs (which say
        why it changed nothing); a statement that may write raises
        SecondStatementInAutocommit before it is sent. `fn` must not fail once its statement
        has changed something: nothing would roll it back. Work whose statement changed
        nothing and which must go on in a transaction says so (need_transaction): it runs
        again in one, by run_write.

        Not run again after a dead connection: the statement may have committed. A pooled
        connection its server closed is dropped at checkout instead. Run again when
        PostgreSQL undid it to break a deadlock (nothing of it stands), up to as many times
        as a transaction."""
        if self._sqlite_writer is not None:
            return self._sqlite_writer.run(fn)
        attempts = 1
        while True:
            try:
                with self.engine.connect() as conn:
                    conn.execution_options(isolation_level="AUTOCOMMIT",
                                           **{_ONE_STATEMENT: True})
                    return fn(conn)
            except RunInTransaction:
                return self.run_write(fn)
            except DBAPIError as exc:
                # A statement PostgreSQL undid to break a deadlock committed nothing: it is
                # run again, as a transaction would be.
                if not undone_to_run_again(exc) or attempts == _WRITE_ATTEMPTS:
                    raise
                attempts += 1
                _pause_before_attempt(attempts)

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction of its own (BEGIN IMMEDIATE on SQLite); commits unless an
        error escapes."""
        if self._sqlite_writer is not None:
            with self._sqlite_writer.exclusive() as conn:
                yield conn
            return
        with self.engine.connect() as conn:
            conn = conn.execution_options(queuelog_write=True)
            with conn.begin():
                yield conn

    @contextmanager
    def counting_read(self) -> Iterator[Connection]:
        """A read transaction within the counting-reads budget; CountingReadsBusy (503,
        Retry-After) when every slot stays taken for COUNTING_READ_WAIT_SECONDS."""
        if not self._counting_slots.acquire(timeout=COUNTING_READ_WAIT_SECONDS):
            raise CountingReadsBusy
        try:
            with self.read() as conn:
                yield conn
        finally:
            self._counting_slots.release()

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read-only transaction (deferred BEGIN on SQLite: readers never block writers)."""
        with self.engine.connect() as conn, conn.begin():
            yield conn
