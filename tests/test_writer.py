"""The SQLite group-commit writer (app/storage/group_commit.py), driven directly on a real
SQLite file."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError

from app.storage.engine import make_engine
from app.storage.group_commit import SqliteWriter

# Long enough for any thread here; a thread still alive after it means a hung group.
JOIN_SECONDS = 30


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[SqliteWriter]:
    path = tmp_path / "w.sqlite3"
    engine = make_engine(f"sqlite:///{path}", pool_size=2)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (v INTEGER NOT NULL UNIQUE)")
        conn.exec_driver_sql("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        # Checked at COMMIT: the way to make a COMMIT fail after every SAVEPOINT succeeded.
        conn.exec_driver_sql("CREATE TABLE child (parent_id INTEGER NOT NULL REFERENCES "
                             "parent (id) DEFERRABLE INITIALLY DEFERRED)")
    yield SqliteWriter(engine, f"{path}-writelock")
    engine.dispose()


def stored(writer: SqliteWriter) -> list[int]:
    with sqlite3.connect(writer.engine.url.database or "") as reader:
        return sorted(v for (v,) in reader.execute("SELECT v FROM t"))


def insert(value: int) -> Callable[[Connection], int]:
    def write(conn: Connection) -> int:
        conn.exec_driver_sql("INSERT INTO t VALUES (?)", (value,))
        return value
    return write


class Group:
    """Callers whose work the writer must run as one group: a first caller's work holds the
    leader until every other caller has queued behind it."""

    def __init__(self, writer: SqliteWriter) -> None:
        self.writer = writer
        self.outcomes: dict[int, tuple[str, Any]] = {}
        self.threads: dict[int, threading.Thread] = {}
        self.transactions: dict[int, int] = {}

    def run(self, works: dict[int, Callable[[Connection], Any]]) -> None:
        gate = threading.Event()

        def hold(conn: Connection) -> None:
            gate.wait(JOIN_SECONDS)

        self._start(-1, hold)
        while not self.writer._leader.locked():
            time.sleep(0.001)
        for key, work in works.items():
            self._start(key, self._recording(key, work))
        while len(self.writer._queued) < len(works):
            time.sleep(0.001)
        gate.set()
        for thread in self.threads.values():
            thread.join(JOIN_SECONDS)
            assert not thread.is_alive(), "a caller of the group was never answered"

    def _recording(self, key: int, work: Callable[[Connection], Any]) -> Callable[..., Any]:
        def recorded(conn: Connection) -> Any:
            self.transactions[key] = id(conn.get_transaction())
            return work(conn)
        return recorded

    def _start(self, key: int, work: Callable[[Connection], Any]) -> None:
        def call() -> None:
            try:
                self.outcomes[key] = ("returned", self.writer.run(work))
            except BaseException as exc:  # what each caller saw is the point
                self.outcomes[key] = ("raised", exc)

        thread = threading.Thread(target=call, name=f"caller-{key}")
        self.threads[key] = thread
        thread.start()


def test_a_failing_member_of_a_group_undoes_only_its_own_work(writer):
    def fails(conn: Connection) -> None:
        conn.exec_driver_sql("INSERT INTO t VALUES (3)")
        raise ValueError("member 3 refuses")

    group = Group(writer)
    group.run({1: insert(1), 2: insert(2), 3: fails, 4: insert(4)})

    assert len(set(group.transactions.values())) == 1  # one transaction, one COMMIT
    assert {key: group.outcomes[key] for key in (1, 2, 4)} == {
        1: ("returned", 1), 2: ("returned", 2), 4: ("returned", 4)}
    kind, error = group.outcomes[3]
    assert kind == "raised" and isinstance(error, ValueError)
    assert stored(writer) == [1, 2, 4]


def test_a_failed_commit_fails_every_member_and_applies_nothing(writer):
    def orphan(conn: Connection) -> str:
        conn.exec_driver_sql("INSERT INTO child VALUES (99)")  # no parent 99: COMMIT fails
        return "orphan"

    group = Group(writer)
    group.run({1: insert(1), 2: orphan, 3: insert(3)})

    assert len(set(group.transactions.values())) == 1
    for key in (1, 2, 3):
        kind, error = group.outcomes[key]
        assert kind == "raised" and isinstance(error, IntegrityError), group.outcomes[key]
    assert stored(writer) == []
    # The writer goes on: its connection was left outside any transaction.
    assert writer.run(insert(5)) == 5
    assert stored(writer) == [5]


def test_an_interrupt_in_a_member_ends_the_group_and_reaches_the_thread_it_was_raised_on(
        writer):
    led_by_another = False
    for attempt in range(20):
        base = attempt * 10
        ran_on: list[threading.Thread] = []

        def interrupted(conn: Connection, base: int = base,
                        ran_on: list[threading.Thread] = ran_on) -> None:
            conn.exec_driver_sql("INSERT INTO t VALUES (?)", (base + 3,))
            ran_on.append(threading.current_thread())
            raise SystemExit("stop")

        group = Group(writer)
        group.run({base + 1: insert(base + 1), base + 2: insert(base + 2),
                   base + 3: interrupted, base + 4: insert(base + 4)})

        kind, error = group.outcomes[base + 3]
        assert kind == "raised" and isinstance(error, SystemExit)
        leader = next(key for key, thread in group.threads.items() if thread is ran_on[0])
        assert group.outcomes[leader][0] == "raised"
        assert isinstance(group.outcomes[leader][1], SystemExit)
        answered = {key for key, (kind, _) in group.outcomes.items()
                    if kind == "returned" and key >= 0}
        # Every caller whose run returned has its work committed; the interrupted work not.
        rows = set(stored(writer))
        assert answered <= rows and base + 3 not in rows
        assert answered | {leader, base + 3} == {base + 1, base + 2, base + 3, base + 4}
        if leader != base + 3:
            led_by_another = True
            break
    assert led_by_another, "the interrupted work always ran on its own caller's thread"


def dbapi_connection_of(conn: Connection) -> int:
    return id(conn.connection.dbapi_connection)


def test_a_forked_child_opens_its_own_connection_and_lock_file(writer):
    assert writer.run(insert(1)) == 1  # the parent's connection and lock file are open
    parents_connection = writer.run(dbapi_connection_of)
    parents_lock_file = writer._open_lock_file()
    with writer.exclusive() as conn:  # the parent holds the lock across the fork
        conn.exec_driver_sql("INSERT INTO t VALUES (2)")
        pid = os.fork()
        if pid == 0:  # the child: report by exit status, never return into pytest
            status = 1
            try:
                own = writer._open_lock_file()
                try:
                    fcntl.flock(own, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    status = 2  # it took the lock its parent holds: a shared open file
                except BlockingIOError:
                    if own is not parents_lock_file:
                        status = 0
            finally:
                os._exit(status)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0

    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            writer.engine.dispose(close=False)  # as the app's post_fork hook does
            if writer.run(dbapi_connection_of) != parents_connection:
                code = 0 if writer.run(insert(3)) == 3 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert stored(writer) == [1, 2, 3]
    assert writer.run(insert(4)) == 4  # the parent's connection still works after the child's
