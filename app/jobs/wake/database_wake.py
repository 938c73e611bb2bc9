"""What the database's notifications wake in a served process (PostgreSQL: docs/SCALING.md,
"The database tells every host").

One process per host listens (app/storage/listener.py) and hands each notification's kinds
to deliver(): it wakes its own waiters and sends each kind to the host's other processes
(app/jobs/wake/host_wake.py), whose sockets stay bound, so that a change committed on any
host wakes every host's waiting claims, waiting reads, settings copies and tickers within
milliseconds, with no process peeking in the meantime.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from app.jobs.wake.host_wake import HostWake

# The kinds the database's triggers send (migration 0025) beside the jobs' own (claimable,
# finished: app/jobs/tx/uow.py).
TYPES = "types"
SCHEDULES = "schedules"


class DatabaseWakes:
    """The handlers of each kind in this process, run when this process's listener delivers
    it or a sibling's datagram carries it."""

    def __init__(self, host: HostWake, kinds: frozenset[str]) -> None:
        self.host = host
        self.kinds = kinds
        self._handlers: dict[str, list[Callable[[], None]]] = {kind: [] for kind in kinds}
        for kind in kinds:
            host.on_wake(kind, lambda kind=kind: self._run(kind))  # type: ignore[misc]

    def on(self, kinds: Iterable[str], handler: Callable[[], None]) -> None:
        for kind in kinds:
            self._handlers[kind].append(handler)

    def deliver(self, kinds: frozenset[str]) -> None:
        """The listener's: wake this process's handlers and tell the host's others."""
        for kind in sorted(kinds & self.kinds):
            self.host.send(kind)
            self._run(kind)

    def _run(self, kind: str) -> None:
        for handler in self._handlers[kind]:
            handler()
