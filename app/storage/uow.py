"""The unit of work: one transaction, the repositories on it, and what it did, told after.

A resource package (app/jobs/tx/uow.py) supplies `bind`, which builds its Transaction — the
repositories as attributes, all on the transaction's one connection. The use cases hand
their work to `run` (write) or `read` and never see a Database or a Connection of their
own. The events the work counts on `tx.events` are told once the transaction holding them
has committed (`Transaction.committed` is called then too), and never for work rolled back.

The group-commit rule, enforced here for every write (app/storage/group_commit.py): `work`
may run on another request's thread, inside a transaction shared with other requests'
work, and may run again after a rollback. So it touches only `tx` and its own locals: it
reads no thread-local state, changes nothing outside the database (a metric, a signal, a
log line saying a thing happened, a list of the caller's), and returns whatever the caller
needs to act on afterwards.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Generic, TypeVar

from sqlalchemy import Connection

from app.storage.engine import (
    Database,
    in_one_statement,
    need_transaction,
    statement_of_its_own,
)

# What one transaction did, counted by name ("enqueued", "claimed", …).
Events = Counter[str]
# Told of what happened and how many (metrics), once it has committed.
EventSink = Callable[[str, int], None]

T = TypeVar("T")


def ignore_event(_name: str, _count: int) -> None:
    pass


class Transaction:
    """What `work` is handed: the connection its repositories share, and the events it counts.
    A resource package subclasses it to add its repositories as attributes."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.events: Events = Counter()

    def before_commit(self) -> None:
        """Called once `work` has returned, in its transaction, before it commits: what a
        subclass must still check or write there."""

    def committed(self) -> None:
        """Called once the transaction holding `work` has committed, never for work rolled
        back, before the events are told: what a subclass hands on to its process (the
        stats counts it keeps). The connection is no longer its to use."""

    @property
    def one_statement(self) -> bool:
        """Whether this work runs as one statement (UnitOfWork.run_statement on PostgreSQL):
        it may send one write, and asks for a transaction (need_transaction) before sending
        anything when it must do more."""
        return in_one_statement(self.conn)

    def need_transaction(self) -> None:
        """For work run by UnitOfWork.run_statement whose statement changed nothing and
        which must go on in a transaction: it runs again, in one (app/storage/engine.py).
        Nothing happens in a transaction."""
        need_transaction(self.conn)

    def statement_of_its_own(self) -> AbstractContextManager[None]:
        """For work run by UnitOfWork.run_statement: the block may send a write that needs
        no atomicity with the work's statement (app/storage/engine.py)."""
        return statement_of_its_own(self.conn)


TxT = TypeVar("TxT", bound=Transaction)


class UnitOfWork(Generic[TxT]):
    """Runs work in a transaction of `db` on a Transaction built by `bind`.

    `on_event` is told each counted event after the commit; `signals` names the counts that
    are no metric but wake this process's waiters (each told by its callable, once, when the
    count is not zero). It is an attribute: whoever tells the metrics may be set later.
    """

    def __init__(self, db: Database, bind: Callable[[Connection], TxT], *,
                 on_event: EventSink = ignore_event,
                 signals: Mapping[str, Callable[[], None]] | None = None) -> None:
        self.db = db
        self.bind = bind
        self.on_event = on_event
        self.signals = dict(signals or {})

    def run(self, work: Callable[[TxT], T]) -> T:
        """Run `work` in a write transaction (Database.run_write) and return its result once
        committed, after telling what it counted. `work` keeps the rule in this module's
        docstring: it touches `tx` and its own locals alone."""

        def in_transaction(conn: Connection) -> tuple[T, TxT]:
            # Built afresh on every run: a run again after a rollback starts from nothing.
            tx = self.bind(conn)
            result = work(tx)
            tx.before_commit()
            return result, tx

        result, tx = self.db.run_write(in_transaction)
        tx.committed()
        self.publish(tx.events)
        return result

    def run_statement(self, work: Callable[[TxT], T]) -> T:
        """As run, for work that sends one statement that may write (and, when it changed
        nothing, reads saying why): on PostgreSQL in autocommit, one round trip rather than
        BEGIN, the statement and COMMIT (Database.run_statement, whose rules `work` keeps: a
        second write fails loudly before it is sent)."""

        def alone(conn: Connection) -> tuple[T, TxT]:
            tx = self.bind(conn)
            result = work(tx)
            tx.before_commit()
            return result, tx

        result, tx = self.db.run_statement(alone)
        tx.committed()
        self.publish(tx.events)
        return result

    def read(self, work: Callable[[TxT], T]) -> T:
        """Run `work` in a read-only transaction; a read counts nothing."""
        with self.db.read() as conn:
            return work(self.bind(conn))

    def counting_read(self, work: Callable[[TxT], T]) -> T:
        """As read, within the database's budget of counting reads (app/storage/engine.py)."""
        with self.db.counting_read() as conn:
            return work(self.bind(conn))

    def write_alone(self, work: Callable[[TxT], T]) -> T:
        """Run `work` in a write transaction of its own (Database.write: never grouped with
        other requests' work, on this thread), then tell what it counted."""
        with self.db.write() as conn:
            tx = self.bind(conn)
            result = work(tx)
            tx.before_commit()
        tx.committed()
        self.publish(tx.events)
        return result

    def publish(self, events: Events) -> None:
        """Tell what a committed transaction counted: its signals, then its metrics."""
        for name, notify in self.signals.items():
            if events.pop(name, 0):
                notify()
        for name, count in events.items():
            if count:
                self.on_event(name, count)
