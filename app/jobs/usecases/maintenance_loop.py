"""The maintenance loop: one leader per database runs the chores, off the request path.

Every served process runs the loop's thread; the one holding the database's leadership
(app/storage/leadership.py) runs the chores — lease rescue and expiry (app/jobs/usecases/sweeps.py),
the next steps of cascades (app/jobs/usecases/cascades.py), overdue reservations, retention — every
LEAD_SECONDS, so that a lease is rescued within a second of running out. The others ask for
the lead every FOLLOW_SECONDS and take over when its holder stops or dies. Claims send no
sweep of their own: a job whose lease ran out is still running, and one past its expiry is
never a candidate, until the leader settles them (docs/OPERATIONS.md, "Maintenance").

On PostgreSQL with notifications (docs/SCALING.md, "The database tells every host") the lead
lives on the host's listening session instead (app/jobs/usecases/listening_lead.py): the
leader asks once a second, in one statement, what is due, and wakes this loop for the chores
that have work; an idle database costs one statement a second, and a process that does not
lead costs none.

Each chore reports its failures to MaintenanceHealth (the log, /metrics, /readyz); one that
fails stops none of the others.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Sequence

from sqlalchemy.exc import SQLAlchemyError

from app.core.clock import Clock
from app.core.periodic import PeriodicThread
from app.storage.leadership import Leadership

log = logging.getLogger(__name__)

# The leader's pace: a lease that runs out is rescued within about this long (plus the
# chores' own time), well within a second.
LEAD_SECONDS = 0.5
# How often a process that does not lead asks for the lead again.
FOLLOW_SECONDS = 3.0
# Woken only, how long the thread waits for a wake before a round of whatever is due (none,
# unless a wake was missed).
WOKEN_SAFETY_SECONDS = 60.0
# How long stop() waits for a round under way to end.
STOP_TIMEOUT_SECONDS = 5.0

Chore = Callable[[], object]


class MaintenanceLoop:
    """`chores` run in order each round this process leads; each reports its own failures
    (MaintenanceHealth), and one that raises is logged and stops no other."""

    def __init__(self, leadership: Leadership, chores: Sequence[Chore], clock: Clock) -> None:
        self.leadership = leadership
        self.chores = list(chores)
        self._round = threading.Lock()
        self._due_lock = threading.Lock()
        self._leading = False
        self._unanswered = False
        # The chores the next woken round runs (None: every chore): see wake().
        self._due: set[str] | None = None
        self._woken_only = False
        # A clock moved by hand (the tests' ManualClock) runs a round each time it moves,
        # in the thread that moves it, and no thread is started: time passes only when it
        # is moved, so a thread would find nothing due between two moves, and would run
        # chores at moments no test chose. The round is the one the thread runs.
        self._by_hand = clock.on_advance(self.run_round)
        # Stopped (at exit, and from gunicorn's worker_exit hook), it lets a round under way
        # end first, then gives the lead up.
        self._thread = PeriodicThread("queuelog-maintenance", self._paced_round, LEAD_SECONDS,
                                      at_exit=self.stop, stop_timeout=STOP_TIMEOUT_SECONDS)

    @property
    def leading(self) -> bool:
        """Whether this process led maintenance at its last round."""
        return self._leading

    def start(self) -> MaintenanceLoop:
        if not self._by_hand:
            self._thread.start()
        return self

    def stop(self) -> None:
        """End the loop, letting a round under way end, and give the lead up."""
        self._thread.stop()
        with self._round:
            self.leadership.release()
            self._leading = False

    def woken_only(self) -> MaintenanceLoop:
        """Run rounds only when wake() says which chores have work (and the thread's
        interval is a long safety net): for a lead that asks what is due itself."""
        self._woken_only = True
        self._due = set()
        self._thread.interval = WOKEN_SAFETY_SECONDS
        return self

    def wake(self, chores: Collection[str]) -> None:
        """Run the chores named (their functions' names) in the next round, now."""
        with self._due_lock:
            if self._due is not None:
                self._due.update(chores)
        self._thread.wake()

    def run_round(self) -> bool:
        """Take or keep the lead and, leading, run every chore once (woken only: the chores
        named since the last round); True when this process leads."""
        with self._round:
            if self._thread.stopping:
                return False
            leading = self._hold()
            if leading != self._leading:
                log.info("maintenance: this process %s the database's maintenance",
                         "leads" if leading else "no longer leads")
            self._leading = leading
            with self._due_lock:
                due, self._due = self._due, (set() if self._woken_only else None)
            if leading:
                for chore in self.chores:
                    if due is None or getattr(chore, "__name__", "") in due:
                        self._run_chore(chore)
            return leading

    def _hold(self) -> bool:
        try:
            leading = self.leadership.hold()
        except (SQLAlchemyError, OSError) as error:  # OSError: the lock file (SQLite's)
            if not self._unanswered:
                log.warning("maintenance: the lead could not be asked for (%s); "
                            "retrying every %.1f s", type(error).__name__, FOLLOW_SECONDS)
            self._unanswered = True
            return False
        if self._unanswered:
            log.warning("maintenance: the database answers again")
            self._unanswered = False
        return leading

    @staticmethod
    def _run_chore(chore: Chore) -> None:
        try:
            chore()
        except Exception as error:  # a chore's failure must stop no other
            # The class alone: a driver's message can carry the SQL, its values or the host.
            log.error("maintenance: %s failed (%s); retried next round",
                      getattr(chore, "__name__", "a chore"), type(error).__name__,
                      exc_info=None if isinstance(error, SQLAlchemyError) else error)

    def _paced_round(self) -> float:
        """The thread's round: the leader comes back sooner than a follower."""
        leading = self.run_round()
        if self._woken_only:
            return WOKEN_SAFETY_SECONDS
        return LEAD_SECONDS if leading else FOLLOW_SECONDS
