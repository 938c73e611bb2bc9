"""The schema (one MetaData for the code and Alembic), the engine, and its engine-specific hooks.

SQLite and PostgreSQL differ in exactly these places, all in this module:
- SQLite connections get WAL, a busy timeout and `synchronous`, and Python's sqlite3
  module is kept from issuing its own BEGIN so that writes can open with BEGIN IMMEDIATE
  (SQLAlchemy's documented pysqlite recipe);
Two more differences live in the repository's statements (app/jobs/repository.py): the
claim's `FOR UPDATE SKIP LOCKED`, rendered by PostgreSQL and left out by SQLite, and the
dialect's own INSERT for ON CONFLICT DO NOTHING.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    create_engine,
    event,
    text,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from app.jobs.models import STATUS_BITS

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

T = TypeVar("T")

metadata = MetaData(naming_convention=NAMING_CONVENTION)

# SQLite only makes INTEGER PRIMARY KEY an alias of the rowid; PostgreSQL gets a bigint.
Id = BigInteger().with_variant(Integer(), "sqlite")
Micros = BigInteger  # microseconds since the epoch, see app.clock

jobs = Table(
    "jobs",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("type", String(100), nullable=False),
    Column("payload", Text, nullable=False),
    Column("priority", SmallInteger, nullable=False),
    Column("status", String(16), nullable=False),
    Column("retry_count", Integer, nullable=False),
    Column("max_retries", Integer, nullable=False),
    Column("producer", String(100), nullable=False),
    Column("idempotency_key", String(255), nullable=True),
    Column("request_fingerprint", String(64), nullable=True),
    Column("run_at", Micros, nullable=False),
    Column("claimed_at", Micros, nullable=True),
    Column("worker_id", String(100), nullable=True),
    Column("lease_expires_at", Micros, nullable=True),
    Column("lease_token", String(64), nullable=True),
    Column("result", Text, nullable=True),
    Column("error", Text, nullable=True),
    Column("created_at", Micros, nullable=False),
    Column("updated_at", Micros, nullable=False),
    Column("unique_key", String(255), nullable=True),
    Column("unique_scope", String(64), nullable=True),
    Column("unique_while", SmallInteger, nullable=True),
)

# The claim reads this index in claim order; it holds only pending rows, so its size and the
# claim's cost do not grow with the finished jobs kept beside them. The literal status
# matches the claim's WHERE, which is what lets both planners use a partial index.
Index(
    "ix_jobs_claim_order",
    jobs.c.priority.desc(),
    jobs.c.created_at,
    jobs.c.id,
    sqlite_where=text("status = 'pending'"),
    postgresql_where=text("status = 'pending'"),
)
# The same order within each type, for claims limited to some types (workers whose keys
# list types): without it such a claim walks past every pending job of the other types.
Index(
    "ix_jobs_claim_order_by_type",
    jobs.c.type,
    jobs.c.priority.desc(),
    jobs.c.created_at,
    jobs.c.id,
    sqlite_where=text("status = 'pending'"),
    postgresql_where=text("status = 'pending'"),
)
# Expired leases are found through this one, again holding only the running rows.
Index(
    "ix_jobs_lease_expires_at",
    jobs.c.lease_expires_at,
    sqlite_where=text("status = 'running'"),
    postgresql_where=text("status = 'running'"),
)
# The idempotency guard: one job per (producer, key); NULL keys never collide.
Index("uq_jobs_producer_idempotency_key", jobs.c.producer, jobs.c.idempotency_key, unique=True)
# Unique jobs: one job per (producer, scope) among the jobs whose status is in their own
# `while` set. The predicate reads the row itself, so a transition that moves a job out of
# its while statuses frees its key in the same statement, with no code of its own. Holder
# look-ups repeat this text: both planners use a partial index only for a WHERE that
# implies the index's own.
UNIQUE_HOLDER_PREDICATE = (
    "unique_scope IS NOT NULL AND (unique_while & CASE status "
    + " ".join(f"WHEN '{status.value}' THEN {bit}" for status, bit in STATUS_BITS.items())
    + " ELSE 0 END) <> 0"
)
Index(
    "uq_jobs_producer_unique_scope",
    jobs.c.producer,
    jobs.c.unique_scope,
    unique=True,
    sqlite_where=text(UNIQUE_HOLDER_PREDICATE),
    postgresql_where=text(UNIQUE_HOLDER_PREDICATE),
)
# Listing a producer's or a worker's own jobs. There is deliberately no index on status
# alone: without statistics SQLite's planner prefers it for the claim's status = 'pending'
# and then sorts every pending row, where the partial index above needs no sort at all.
Index("ix_jobs_producer_id", jobs.c.producer, jobs.c.id)
Index("ix_jobs_worker_id_id", jobs.c.worker_id, jobs.c.id)

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("name", String(100), nullable=False, unique=True),
    Column("role", String(16), nullable=False),
    Column("token_digest", String(64), nullable=False, unique=True),
    Column("max_priority", SmallInteger, nullable=False),
    Column("job_types", Text, nullable=True),  # comma-separated; NULL means every type
    Column("created_at", Micros, nullable=False),
    Column("revoked_at", Micros, nullable=True),
)


def _install_sqlite_hooks(engine: Engine, synchronous: str, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Keep pysqlite from emitting BEGIN itself; the "begin" hook below does it.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(conn: Connection) -> None:
        # A write that starts as a reader can fail with SQLITE_BUSY without waiting when it
        # later needs the lock; BEGIN IMMEDIATE takes the write lock up front and waits.
        if conn.get_execution_options().get("queuelog_write"):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.exec_driver_sql("BEGIN")


def make_engine(url: str, *, pooled: bool = True, pool_size: int = 5, pool_timeout: int = 10,
                sqlite_synchronous: str = "FULL", sqlite_busy_timeout_ms: int = 30_000,
                ) -> Engine:
    """An engine for `url`, with the hooks its dialect needs. Connects lazily.

    `pooled=False` is for one-off commands (migrations, key management): nothing stays open.
    """
    parsed = make_url(url)
    is_sqlite = parsed.get_backend_name() == "sqlite"
    if is_sqlite and parsed.database in (None, "", ":memory:"):
        raise ValueError("queuelog needs a SQLite file, not an in-memory database")
    options: dict[str, Any] = {}
    if pooled:
        options.update(pool_size=pool_size, max_overflow=pool_size, pool_timeout=pool_timeout)
    else:
        options["poolclass"] = NullPool
    if is_sqlite:
        # Connections move between gunicorn's threads; the pool hands each to one at a time.
        # Every transaction here ends in COMMIT or ROLLBACK through SQLAlchemy, so the
        # pool's own ROLLBACK on each check-in would only cost time on every request.
        engine = create_engine(url, connect_args={"check_same_thread": False},
                               pool_reset_on_return=None, **options)
        _install_sqlite_hooks(engine, sqlite_synchronous, sqlite_busy_timeout_ms)
        return engine
    return create_engine(url, pool_pre_ping=True, **options)


class _Work:
    """One caller's piece of a group commit, and what became of it."""

    __slots__ = ("done", "error", "fn", "result")

    def __init__(self, fn: Callable[[Connection], Any]) -> None:
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False


class SqliteWriter:
    """Serialises SQLite writers and commits their work in groups.

    SQLite has one writer at a time, and with synchronous=FULL every commit waits for an
    fsync (about 2 ms here). Callers that arrive while a commit is under way queue up; the
    next one to get the lock (the leader) runs everything queued, each caller's work in its
    own SAVEPOINT, and commits once. Every caller returns only after the commit that holds
    its work is on disk, so durability is unchanged while one fsync serves many requests.

    Between processes (gunicorn workers, the CLI) the leader holds an exclusive flock on a
    file beside the database: a waiting process sleeps in the kernel and wakes as soon as
    the lock is free, instead of SQLite's busy handler, which sleeps in coarse steps.
    """

    def __init__(self, engine: Engine, lock_path: str, max_batch: int = 256) -> None:
        self.engine = engine
        self.lock_path = lock_path
        self.max_batch = max_batch
        self._leader = threading.Lock()
        self._queued: list[_Work] = []
        self._queue_lock = threading.Lock()
        self._lock_file: Any = None
        self._lock_pid = 0
        self._conn: Connection | None = None
        self._conn_pid = 0

    def run(self, fn: Callable[[Connection], T]) -> T:
        work = _Work(fn)
        with self._queue_lock:
            self._queued.append(work)
        while not work.done:
            with self._leader:
                if work.done:
                    break
                with self._queue_lock:
                    batch = self._queued[: self.max_batch]
                    del self._queued[: self.max_batch]
                self._commit(batch)
        if work.error is not None:
            raise work.error
        return work.result  # type: ignore[no-any-return]

    @contextmanager
    def exclusive(self) -> Iterator[Connection]:
        """A write transaction of one caller, outside any group (key commands, purge)."""
        with self._leader, self._process_lock():
            conn = self._connection()
            with conn.begin():
                yield conn

    def _commit(self, batch: list[_Work]) -> None:
        try:
            with self._process_lock():
                conn = self._connection()
                try:
                    with conn.begin():
                        if len(batch) == 1:
                            batch[0].result = batch[0].fn(conn)
                        else:
                            for work in batch:
                                self._run_in_savepoint(conn, work)
                except DBAPIError as exc:
                    if exc.connection_invalidated:
                        self._drop_connection()
                    raise
        except BaseException as exc:  # BEGIN, COMMIT or a lone caller's work failed
            for work in batch:
                work.error = work.error or exc
        finally:
            for work in batch:
                work.done = True

    def _connection(self) -> Connection:
        """The writer's own connection, kept open: only the leader uses it, under _leader."""
        if self._conn is None or self._conn_pid != os.getpid() or self._conn.closed:
            self._conn = self.engine.connect().execution_options(queuelog_write=True)
            self._conn_pid = os.getpid()
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    @staticmethod
    def _run_in_savepoint(conn: Connection, work: _Work) -> None:
        savepoint = conn.begin_nested()
        try:
            work.result = work.fn(conn)
        except Exception as exc:
            # This caller's error (a 409, say) undoes only its own writes.
            savepoint.rollback()
            work.error = exc
        else:
            savepoint.commit()

    @contextmanager
    def _process_lock(self) -> Iterator[None]:
        if self._lock_pid != os.getpid():
            # A forked child must not share its parent's open file: flock locks belong to
            # the open file, so parent and child would both believe they hold it.
            self._lock_file = open(self.lock_path, "a+b")  # noqa: SIM115 (kept open)
            self._lock_pid = os.getpid()
        fcntl.flock(self._lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)


class Database:
    """Opens the transactions the services run in."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sqlite_writer = None
        if engine.dialect.name == "sqlite":
            path = engine.url.database
            self._sqlite_writer = SqliteWriter(engine, f"{path}-writelock")

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def run_write(self, fn: Callable[[Connection], T]) -> T:
        """Run `fn` in a write transaction and return its result once committed.

        On SQLite the work may share its transaction (and fsync) with other callers', each
        in its own SAVEPOINT: `fn` must do all its writing through the connection it is
        given and keep no state of its own across calls. Its exception rolls back its work.
        """
        if self._sqlite_writer is not None:
            return self._sqlite_writer.run(fn)
        with self.write() as conn:
            return fn(conn)

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
    def read(self) -> Iterator[Connection]:
        """A read-only transaction (deferred BEGIN on SQLite: readers never block writers)."""
        with self.engine.connect() as conn, conn.begin():
            yield conn
