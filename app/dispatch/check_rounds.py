"""Asking the due checks of reservations concurrently, each origin's share capped.

Rounds take the checks due now, soonest first (one transaction each), into a queue per
origin (scheme://host:port, app/core/origins.py: the rule of the operator's allow lists, and
the key of the HTTP client's per-host pool). `concurrency` threads ask them, each taking the
next check of an origin with fewer than `per_origin` requests in flight, the origins in
turn; a thread records the answer after the request is done, outside its origin's share. A
receiver that hangs thus holds `per_origin` requests for one timeout at a time, and the
checks of every other origin go on beside it.

An origin's queue holds at most QUEUED_PER_SLOT checks per request it may have in flight.
A due check beyond that is put off, its count of checks unchanged, to when its origin could
ask it at the pace its checks take (the slower of their recent average and the oldest one
in flight, within the timeout), at most PUT_OFF_MAX_SECONDS: so the checks due behind it, at
other origins, come up in the next rounds, and a slow origin's backlog is spread over time
rather than read again at every round. A round goes on to the next at once while it found a
full round and there is room; else it waits for room, or for CHECK_INTERVAL_SECONDS.

A check taken is held (its next check moved past the longest it may wait and take) so that
no other dispatcher asks it meanwhile; one that dies leaves it to be asked again then.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from app.core.clock import MICROS, Clock
from app.core.origins import push_origin
from app.dispatch.checks import CheckAsker, CheckSettings
from app.dispatch.http import PushClient
from app.jobs.sql.reservation_repository import DueCheck
from app.jobs.usecases.reservations import Reservations

log = logging.getLogger(__name__)

# How often due checks are looked for when the last round was not full.
CHECK_INTERVAL_SECONDS = 0.5
# An origin's queue: this many checks for each request it may have in flight; and checks
# taken (queued, asked or being recorded) at once: this many per thread. So origins that
# hang fill the room no sooner than they hold every thread: concurrency / per_origin of them.
QUEUED_PER_SLOT = 8
# What a held check leaves beyond its wait and its timeout to record its answer.
RECORD_SECONDS = 5.0
# What a check of an origin never asked yet is guessed to take.
FIRST_GUESS_SECONDS = 0.05
# How much each check's time moves its origin's average.
AVERAGE_WEIGHT = 0.2
# A check put off is due again within this.
PUT_OFF_MAX_SECONDS = 300.0
# Origins remembered (their pace) while they have nothing in hand.
IDLE_ORIGINS_KEPT = 1024


@dataclass
class _Origin:
    """What this dispatcher holds and knows of one origin."""

    queued: deque[DueCheck] = field(default_factory=deque)
    asking: dict[int, float] = field(default_factory=dict)  # job id: when sent (monotonic)
    seconds: float = FIRST_GUESS_SECONDS  # the recent average a check takes

    @property
    def in_hand(self) -> int:
        return len(self.queued) + len(self.asking)

    def pace(self, timeout_seconds: float) -> float:
        """What a check of this origin takes now, as far as can be told."""
        now = time.monotonic()
        oldest = max((now - sent for sent in self.asking.values()), default=0.0)
        return min(max(self.seconds, oldest), timeout_seconds)


@dataclass(frozen=True)
class _Plan:
    """A round's view of the origins, taken under the lock: what `choose` may read."""

    room: int
    in_hand: dict[str, int]
    pace: dict[str, float]


class Checker:
    """Asks due checks on its own threads (started as needed); thread-safe."""

    def __init__(self, reservations: Reservations, client: PushClient, clock: Clock,
                 settings: CheckSettings | None = None) -> None:
        self.reservations = reservations
        self.settings = settings or CheckSettings()
        self.asker = CheckAsker(reservations, client, clock,
                                timeout_seconds=self.settings.timeout_seconds)
        self.max_held = self.settings.concurrency * QUEUED_PER_SLOT
        self._lock = threading.Condition()
        self._origins: dict[str, _Origin] = {}
        self._held = 0  # checks taken and not yet recorded
        self._threads = 0
        self._failing = False
        # How often due checks are looked for after a round that was not full.
        self.interval = CHECK_INTERVAL_SECONDS

    def run(self, stopping: threading.Event) -> None:
        """Ask due checks until `stopping` is set; a failed round is logged (once per
        outage) and tried again after the interval. Checks held then are left to their
        threads (daemons): one cut short is asked again once its hold ends."""
        while not stopping.is_set():
            try:
                _taken, full, put_off_for = self._round()
            except Exception as exc:
                if not self._failing:
                    log.warning("dispatch: reservation checks failed (%s); retrying",
                                type(exc).__name__)
                self._failing = True
                stopping.wait(CHECK_INTERVAL_SECONDS)
                continue
            if self._failing:
                log.warning("dispatch: reservation checks resumed")
                self._failing = False
            if not full:
                # Until the soonest check put off is due, if that comes first.
                stopping.wait(min(self.interval, put_off_for))
                continue
            with self._lock:  # more may be due: as soon as there is room
                self._lock.wait_for(lambda: self._held < self.max_held,
                                    timeout=CHECK_INTERVAL_SECONDS)

    def run_once(self) -> int:
        """One round: take the checks due now that fit; how many it took."""
        return self._round()[0]

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every check taken is recorded; False if `timeout` passed first."""
        with self._lock:
            return self._lock.wait_for(lambda: self._held == 0, timeout=timeout)

    # -- a round ------------------------------------------------------------------------

    def _round(self) -> tuple[int, bool, float]:
        """Take what fits of the checks due now: how many, whether the round was full (so
        that more may be due now), and the seconds until the soonest check it put off is
        due (CHECK_INTERVAL_SECONDS if none)."""
        plan = self._plan()
        if plan.room <= 0:
            return 0, True, CHECK_INTERVAL_SECONDS
        latest_us = round(PUT_OFF_MAX_SECONDS * MICROS)
        looked = [0]
        soonest = [latest_us]
        per_origin = self.settings.per_origin
        share = per_origin * QUEUED_PER_SLOT

        def choose(due: list[DueCheck], now_us: int) -> tuple[list[DueCheck],
                                                              dict[int, int]]:
            # Inside the round's transaction (on SQLite perhaps on another thread): reads
            # the plan, and changes nothing but its own locals.
            looked[0] = len(due)
            in_hand = dict(plan.in_hand)  # with those put off: the origin's line
            take: list[DueCheck] = []
            put_off: dict[int, int] = {}
            for check in due:
                origin = origin_of(check)
                ahead = in_hand.get(origin, 0)
                if ahead < share and len(take) < plan.room:
                    take.append(check)
                elif ahead >= share:
                    # When its origin, at its pace, would come to it.
                    pace = plan.pace.get(origin, FIRST_GUESS_SECONDS)
                    wait_us = min(round((ahead // per_origin) * pace * MICROS), latest_us)
                    put_off[check.reservation.job_id] = now_us + wait_us
                    soonest[0] = min(soonest[0], wait_us)
                else:
                    continue  # no room left this round: still due
                in_hand[origin] = ahead + 1
            return take, put_off

        wait = (QUEUED_PER_SLOT + 2) * self.settings.timeout_seconds + RECORD_SECONDS
        taken = self.reservations.take_due_checks(plan.room, choose,
                                                  asking_us=round(wait * MICROS))
        self._hand_out(taken)
        return (len(taken), looked[0] >= plan.room,
                min(soonest[0] / MICROS, CHECK_INTERVAL_SECONDS))

    def _plan(self) -> _Plan:
        timeout = self.settings.timeout_seconds
        with self._lock:
            return _Plan(self.max_held - self._held,
                         {name: o.in_hand for name, o in self._origins.items()},
                         {name: o.pace(timeout) for name, o in self._origins.items()})

    def _hand_out(self, checks: list[DueCheck]) -> None:
        with self._lock:
            for check in checks:
                self._origin(origin_of(check)).queued.append(check)
            self._held += len(checks)
            for _ in range(min(self.settings.concurrency - self._threads, len(checks))):
                self._threads += 1
                threading.Thread(target=self._ask_forever, daemon=True,
                                 name=f"queuelog-check-{self._threads}").start()
            self._lock.notify_all()

    def _origin(self, name: str) -> _Origin:
        origin = self._origins.get(name)
        if origin is None:
            if len(self._origins) >= IDLE_ORIGINS_KEPT:
                for idle in [n for n, o in self._origins.items() if not o.in_hand]:
                    del self._origins[idle]
            origin = self._origins[name] = _Origin()
        return origin

    # -- asking -------------------------------------------------------------------------

    def _next(self) -> tuple[str, DueCheck] | None:
        """The next check to ask: the first origin, in turn, with one queued and room for
        another request (the origin then goes to the back of the turn)."""
        for name, origin in self._origins.items():
            if origin.queued and len(origin.asking) < self.settings.per_origin:
                check = origin.queued.popleft()
                origin.asking[check.reservation.job_id] = time.monotonic()
                del self._origins[name]  # to the back of the turn
                self._origins[name] = origin
                return name, check
        return None

    def _ask_forever(self) -> None:
        while True:
            with self._lock:
                while (picked := self._next()) is None:
                    self._lock.wait()
                name, check = picked
            try:
                self.asker.ask(check, sent=self._sent_callback(name, check))
            except Exception as exc:
                # The database, most likely: the check stays held, and is asked again once
                # its hold ends. (No url in the message: it may hold credentials.)
                log.warning("dispatch: the check of job %d failed (%s); asking it again "
                            "later", check.reservation.job_id, type(exc).__name__)
            finally:
                with self._lock:
                    origin = self._origins.get(name)
                    if origin is not None:  # sent() was not reached: the share is free
                        origin.asking.pop(check.reservation.job_id, None)
                    self._held -= 1
                    self._lock.notify_all()

    def _sent_callback(self, name: str, check: DueCheck) -> Callable[[], None]:
        def sent() -> None:
            """The request is done: its origin's share is free again, and its time counts
            in the origin's pace."""
            with self._lock:
                origin = self._origins[name]  # kept while it has a check in hand
                began = origin.asking.pop(check.reservation.job_id, None)
                if began is not None:
                    took = min(time.monotonic() - began, self.settings.timeout_seconds)
                    origin.seconds += AVERAGE_WEIGHT * (took - origin.seconds)
                self._lock.notify_all()

        return sent


def origin_of(check: DueCheck) -> str:
    """The origin a check is counted under: where its client connects (an unreadable url,
    never sent, under its own name)."""
    url = check.reservation.check_url or ""
    return push_origin(url) or url
