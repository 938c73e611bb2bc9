"""Waking requests that wait: claims waiting for work (`wait_seconds`, like SQS long polling)
and reads waiting for a job to finish (GET /jobs/{id}?wait_seconds=N).

A change made by this process wakes its waiting requests at once through a condition
variable, and those of this host's other queuelog processes (the sibling gunicorn workers)
through a datagram (app/jobs/wake/host_wake.py). On SQLite, and wherever the database does not
tell, changes made elsewhere and delayed jobs coming due are noticed by a cheap indexed peek
every POLL_SECONDS, which needs no connection held while waiting. On PostgreSQL the database
tells every host (app/jobs/wake/database_wake.py): a served process's waits then peek only
every TOLD_PEEK_SECONDS, a safety net, and its changes are told by the database alone.

When the process is told to stop (gunicorn's SIGTERM, SIGINT or SIGQUIT: see
queuelog_gunicorn/shutdown.py), every wait ends at once and the waiting requests answer with
what there is (a claim 204, a read the job as it is), so that the server frees its port
without waiting out its long polls; a request that asks to wait after that is answered at
once too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

from app.jobs.wake.host_wake import HostWake

POLL_SECONDS = 0.05
# Where the database tells every process of each change (a missed notice costs a look at
# most: the listener delivers every kind when it listens again).
TOLD_PEEK_SECONDS = 60.0
# What a request that asked to wait but found the budget full is told (Retry-After): come
# back in this many seconds rather than at once, which would spin (a client asking again
# at once made thousands of requests in 10 s). A waiting slot frees as soon as one of its requests
# is answered, so a short pause, which clients stretch with their own jittered backoff.
NOT_WAITED_RETRY_AFTER_SECONDS = 1

T = TypeVar("T")
# Tells the database that this process waits for jobs of some types (None: any); returns
# until when (time.monotonic) its waits must still peek.
WaitingSaid = Callable[[Collection[str] | None], float]


@dataclass(frozen=True)
class WaitAnswer(Generic[T]):
    """The answer to a request that may wait. `not_waited`: it asked to wait, there was
    nothing to answer yet, and the budget was full, so it was answered at once anyway."""

    value: T
    not_waited: bool = False


class JobSignal:
    """Something the waiting requests wait for (jobs that may have become claimable, jobs
    that may have finished). With `host` and a `kind`, told to this host's other processes
    too, and woken by theirs."""

    def __init__(self, host: HostWake | None = None, kind: str = "") -> None:
        self._condition = threading.Condition()
        self._generation = 0
        self._ended = False
        self._host = host
        self._kind = kind
        self._database_tells = False
        # Told by the database: called before a request's first look, it returns until when
        # (time.monotonic) waits must still peek (app/jobs/usecases/waiters.py).
        self._before_wait: WaitingSaid | None = None
        self._peek_until = 0.0
        if host is not None:
            host.on_wake(kind, self.notify_here)

    def told_by_database(self, before_wait: WaitingSaid | None = None) -> None:
        """The database tells every process, this one's siblings included, of each change
        (a served process on PostgreSQL): waiters peek only as a safety net, and notify()
        wakes this process's waiters alone. `before_wait` holds the process's entry among
        the waiters (without one, the database tells nobody)."""
        self._database_tells = True
        self._before_wait = before_wait

    def before_wait(self, types: Collection[str] | None = None) -> None:
        """A request is about to look, and may wait (for jobs of `types`; None: any): where
        the database tells, it is told that this process waits (a statement at most every
        25 s or so, or when it waits for a new type)."""
        if self._before_wait is not None:
            self._peek_until = self._before_wait(types)

    @property
    def peek_seconds(self) -> float:
        """How long a waiter goes without looking when nothing wakes it."""
        if self._database_tells and time.monotonic() >= self._peek_until:
            return TOLD_PEEK_SECONDS
        return POLL_SECONDS

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def waits_ended(self) -> bool:
        """Whether end_waits was called: nothing waits for this signal any more."""
        return self._ended

    def end_waits(self) -> None:
        """The process is stopping: every wait for this signal returns now, and any later one
        at once. Safe from any thread (not from a signal handler: it takes a lock)."""
        with self._condition:
            self._ended = True
            self._generation += 1
            self._condition.notify_all()

    @contextmanager
    def watching(self) -> Iterator[None]:
        """While a request looks and maybe waits: the host's other processes' wakes are heard
        too (from before its first look, so that no change they commit after it goes unheard)."""
        if self._host is None:
            yield
            return
        with self._host.watching():
            yield

    def notify(self) -> None:
        """It may have happened: this process's waiting requests look, and the host's others'."""
        self.notify_here()
        if self._host is not None and not self._database_tells:
            self._host.send(self._kind)

    def notify_here(self) -> None:
        """As notify, for this process's waiting requests alone (another process told it)."""
        with self._condition:
            self._generation += 1
            self._condition.notify_all()

    def wait(self, seen_generation: int, timeout: float) -> bool:
        """Wait until notified after `seen_generation`, or the timeout. True when notified
        (or when the waits ended: a caller checks waits_ended before it waits again)."""
        with self._condition:
            return self._condition.wait_for(
                lambda: self._ended or self._generation != seen_generation, timeout=timeout)


class WaitingBudget:
    """How many requests of one kind may wait at once in this process. A waiting request
    holds a server thread; past the budget a request answers at once instead, so waiting
    requests can never take every thread from the others."""

    def __init__(self, limit: int) -> None:
        self._slots = threading.BoundedSemaphore(max(limit, 1))
        self._may_wait = limit > 0
        self._lock = threading.Lock()
        self._in_use = 0

    @property
    def in_use(self) -> int:
        """How many requests hold a slot now."""
        return self._in_use

    @contextmanager
    def slot(self) -> Iterator[bool]:
        """Yields whether this request may wait; the slot is given back on leaving."""
        granted = self._may_wait and self._slots.acquire(blocking=False)
        if granted:
            with self._lock:
                self._in_use += 1
        try:
            yield granted
        finally:
            if granted:
                with self._lock:
                    self._in_use -= 1
                self._slots.release()
