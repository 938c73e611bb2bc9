"""What this process's jobs of the protected types did, and the circuits' moves it makes.

A job transaction of a type with a circuit breaker or a retry budget hands its counts (ended,
failed, first attempts started) here once committed, through the stats buffer
(app/jobs/timeline/stats_buffer.py): the request writes nothing more. A thread of the process
adds them to type_tallies about every TICK_SECONDS, one statement, and in the same
transaction makes the moves they call for (app/types/protection/circuit.py):

- a closed circuit whose window, every process's tallies summed, reaches its ratio with
  min_attempts opens, named after the failure group that dominated the window;
- a tripped circuit moves on the outcomes this process saw end (a probe's), at once: the
  thread is woken by them rather than waiting for its tick;
- a half-open circuit whose last wave has passed closes.

Each move is a conditional UPDATE from the state as read, so that of several processes and
hosts one makes it and logs it. The database tells the other processes (a settings change:
PostgreSQL's 'types' notice, else their copy's next read within a second); this one reads
its copy again at once.

With stats off (QUEUELOG_STATS=0) no count reaches here, and no circuit opens (docs/
FLOW-CONTROL.md says so).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sqlalchemy import Connection, select
from sqlalchemy.exc import SQLAlchemyError

from app.core.clock import MICROS, Clock
from app.core.periodic import PeriodicThread
from app.storage.engine import Database
from app.storage.schema import job_types
from app.types.models import TypeSettings
from app.types.protection import circuit
from app.types.protection.circuit import CircuitSettings, Move
from app.types.protection.repository import ProtectionRepository, Window

log = logging.getLogger(__name__)

# A second, as the stats flusher: failures wake the thread sooner (WOKEN_SECONDS), so a
# circuit opens as soon after them, and completions alone wait for the tick.
TICK_SECONDS = 1.0
# Tallies older than the longest window (an hour) are removed this often by each process.
FORGET_EVERY_SECONDS = 60.0
KEPT_SECONDS = 3600 + 60
# Counts of a type this process does not see protected are kept this long (in seconds), for
# a protection set on another process that its copy of the settings has not read yet.
GRACE_SECONDS = 3
# Woken by the outcomes it watches, a round comes at most this soon after the last one: an
# outage's failures make a write every WOKEN_SECONDS per process, not one per failure.
WOKEN_SECONDS = 0.05
# The stats counts (app/jobs/timeline/recorder.py) tallied: attempts ended completed or failed,
# and first attempts started.
COUNTED = frozenset({"completed", "failed", "claimed_first"})

# Told of each move made here: (type, from state, to state, why). Metrics and tests listen.
MoveSink = Callable[[str, str, str, str], None]


@dataclass
class _Pending:
    """What this process counted since its last write."""

    by_second: defaultdict[tuple[str, int], Counter[str]] = field(
        default_factory=lambda: defaultdict(Counter))
    ended: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))


class Protection:
    def __init__(self, db: Database, clock: Clock, slot: int,
                 copy: Callable[[], Mapping[str, TypeSettings] | None],
                 refresh_copy: Callable[[], None], on_move: MoveSink | None = None,
                 tick_seconds: float = TICK_SECONDS) -> None:
        self.db = db
        self.clock = clock
        self.slot = slot
        self._copy = copy
        self._refresh_copy = refresh_copy
        self._sinks: list[MoveSink] = [on_move] if on_move is not None else []
        self._pending = _Pending()
        self._lock = threading.Lock()
        self._tripped_seen = False  # the last read showed an open or half-open circuit
        self._forgotten_at = 0.0
        self._round_at = 0.0
        self._failing = False
        self._thread = PeriodicThread("queuelog-protection", self.tick, tick_seconds,
                                      at_exit=self.stop)

    def start(self) -> Protection:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, letting a round under way end, then write what is left."""
        started = self._thread.started
        self._thread.stop()
        if started:
            self.tick()

    def on_move(self, sink: MoveSink) -> None:
        self._sinks.append(sink)

    # -- from the job transactions ---------------------------------------------------------

    def observe(self, counts: Mapping[tuple[str, str], int]) -> None:
        """A committed transaction's counts (type, kind) -> n, kept until the next round,
        which writes those of the protected types (see tick: a type protected on another
        process a moment ago is not in this process's copy yet)."""
        current = self._copy()
        second = self.clock.now_us() // MICROS
        wake = False
        with self._lock:
            for (job_type, kind), n in counts.items():
                if kind not in COUNTED or not n:
                    continue
                settings = None if current is None else current.get(job_type)
                tally = self._pending.by_second[job_type, second]
                if kind == "claimed_first":
                    tally["started_first"] += n
                    continue
                tally["finished"] += n
                self._pending.ended[job_type][kind] += n
                if kind == "failed":
                    tally["failed"] += n
                # A probe's end moves its circuit at once, and failures open a closed one
                # without waiting for the tick; a completion of a closed circuit's type, and
                # any type without a circuit, waits.
                wake = wake or (current is None) or (settings is not None and (
                    settings.circuit_state is not None
                    or (kind == "failed" and settings.circuit is not None)))
        if wake and self._thread.running and time.monotonic() - self._round_at >= WOKEN_SECONDS:
            self._thread.wake()

    def unflushed_firsts(self, job_type: str, since_second: int) -> int:
        """This process's first attempts of `job_type` from `since_second` on that its thread
        has not written yet (a retry budget counts them with the tallies)."""
        with self._lock:
            return sum(tally["started_first"]
                       for (counted, second), tally in self._pending.by_second.items()
                       if counted == job_type and second >= since_second)

    # -- the thread ------------------------------------------------------------------------

    def tick(self) -> float | None:
        """One round (see the module's docstring); never raises."""
        self._round_at = time.monotonic()
        with self._lock:
            taken, self._pending = self._pending, _Pending()
        taken = self._protected_only(taken)
        if not taken.by_second and not self._tripped_seen:
            return None  # nothing to write, no circuit to watch: no statement
        try:
            moves = self.db.run_write(lambda conn: self._write(conn, taken))
        except SQLAlchemyError as error:
            self._put_back(taken)
            if not self._failing:
                log.warning("protection: the database did not take this process's tallies "
                            "(%s); retrying", type(error).__name__)
            self._failing = True
            return None
        self._failing = False
        if moves:
            self._refresh_copy()
            for job_type, before, after, why in moves:
                log.info("circuit of type %s: %s -> %s (%s)", job_type, before, after, why)
                for sink in self._sinks:
                    sink(job_type, before, after, why)
        self._forget_old()
        return None

    def _protected_only(self, taken: _Pending) -> _Pending:
        """What of `taken` to write: the counts of the types the copy shows protected (all
        of them without a fresh copy: the write filters). The others' recent counts are kept
        for the next rounds, in case the copy has not seen their protection yet (set on
        another process within the last REFRESH_SECONDS); older ones go."""
        current = self._copy()
        if current is None:
            return taken
        kept, recent = _Pending(), _Pending()
        oldest = self.clock.now_us() // MICROS - GRACE_SECONDS
        for (job_type, second), tally in taken.by_second.items():
            settings = current.get(job_type)
            if settings is not None and settings.is_protected:
                kept.by_second[job_type, second] = tally
            elif second >= oldest:
                recent.by_second[job_type, second] = tally
        for job_type, ended in taken.ended.items():
            settings = current.get(job_type)
            if settings is not None and settings.is_protected:
                kept.ended[job_type] = ended
        if recent.by_second:
            self._put_back(recent)
        return kept

    def _put_back(self, taken: _Pending) -> None:
        with self._lock:
            for key, tally in taken.by_second.items():
                self._pending.by_second[key].update(tally)
            for job_type, ended in taken.ended.items():
                self._pending.ended[job_type].update(ended)

    def _write(self, conn: Connection, taken: _Pending) -> list[tuple[str, str, str, str]]:
        now = self.clock.now_us()
        protected = {s.type: s for s in _protected_settings(conn)}
        repo = ProtectionRepository(conn)
        repo.add_tallies([
            {"type": job_type, "second": second, "slot": self.slot,
             "finished": tally["finished"], "failed": tally["failed"],
             "started_first": tally["started_first"]}
            for (job_type, second), tally in taken.by_second.items() if job_type in protected])
        self._tripped_seen = any(s.circuit_state is not None for s in protected.values())
        made: list[tuple[str, str, str, str]] = []
        to_judge: dict[str, int] = {}
        for job_type, settings in protected.items():
            config = settings.circuit_settings
            if config is None:
                continue
            move = self._move_of(settings, config, taken.ended.get(job_type, Counter()), now)
            if move is not None:
                opened_by = None
                if repo.move_circuit(job_type, move, now, opened_by):
                    made.append((job_type, circuit.shown_state(move.current),
                                 circuit.shown_state(move.state), move.why))
            elif settings.circuit_state is None and any(
                    t == job_type for t, _ in taken.by_second):
                # Its window: never from before it last closed (its outage is not counted
                # twice).
                since = max(now // MICROS - config.window_seconds,
                            (settings.circuit_since or 0) // MICROS)
                to_judge[job_type] = since
        for job_type, window in repo.windows(to_judge).items():
            config = protected[job_type].circuit_settings
            assert config is not None
            if config.trips(window.finished, window.failed):
                opened_by = _opened_by(repo, job_type, to_judge[job_type])
                if repo.move_circuit(job_type, Move(circuit.OPEN, None, None, ""), now,
                                     opened_by):
                    made.append((job_type, circuit.CLOSED, circuit.OPEN,
                                 _why_opened(window, config)))
        return made

    @staticmethod
    def _move_of(settings: TypeSettings, config: CircuitSettings, ended: Counter[str],
                 now: int) -> Move | None:
        state, since = settings.circuit_state, settings.circuit_since
        if state is None or since is None:
            return None
        move = circuit.after_end(config, state, since, ended["completed"], ended["failed"],
                                 now)
        if move is None and state == circuit.HALF_OPEN and now >= config.closes_at(since):
            return Move(None, circuit.HALF_OPEN, since,
                        "its waves reached min_attempts with no failure")
        return move

    def _forget_old(self) -> None:
        now = time.monotonic()
        if now - self._forgotten_at < FORGET_EVERY_SECONDS:
            return
        self._forgotten_at = now
        before = self.clock.now_us() // MICROS - KEPT_SECONDS
        with contextlib.suppress(SQLAlchemyError):  # the next minute's try removes them
            self.db.run_write(lambda conn: ProtectionRepository(conn).forget_tallies(before))


def _protected_settings(conn: Connection) -> list[TypeSettings]:
    rows = conn.execute(select(job_types).where(
        (job_types.c.circuit.is_not(None)) | (job_types.c.retry_budget.is_not(None))))
    return [TypeSettings.from_row(row._mapping) for row in rows]


def _opened_by(repo: ProtectionRepository, job_type: str, since_second: int) -> str | None:
    dominant = repo.dominant_failure(job_type, since_second * MICROS)
    if dominant is None:
        return None
    fingerprint, sample = dominant
    return json.dumps({"fingerprint": fingerprint, "sample": sample}, separators=(",", ":"))


def _why_opened(window: Window, config: CircuitSettings) -> str:
    return (f"{window.failed} of {window.finished} attempts failed in {config.window_seconds} s,"
            f" ratio {config.failure_ratio}")
