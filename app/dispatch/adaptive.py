"""Adaptive push concurrency (docs/PUSH.md, "Adaptive concurrency"): how many deliveries to
one origin (scheme://host:port) the dispatcher lets run at once, free of I/O.

Each origin's `limit` starts at its cap (the dispatcher's concurrency, or the smallest
max_running among the push types sending there, when lower) and moves below it, additive
increase and multiplicative decrease as TCP does:

- a 429, a 503, a timeout or a connection failure halves it (at least 1), and a Retry-After
  holds the origin: no delivery starts there before that moment;
- a window of successes grows it by one, never above the cap: `limit` 2xx answers in a row,
  each to a delivery sent since the last halving;
- the limit a halving came from, less one, is remembered as what the origin takes: the limit
  climbs back to it at a window a step, and above it only after PROBE_WINDOWS windows there,
  so that deliveries settle at what the origin takes, probing above it now and then; a
  window of successes above it forgets it (the origin takes more now), and the climb to
  the cap goes on at a window a step;
- any other answer (500, 400, …) changes nothing, and does not break a window either: it
  says nothing of the origin's load.

Answers to deliveries sent before the last halving neither halve the limit again nor count
toward a window (their Retry-After still holds the origin): they tell of the load that
halving already answered, so a burst of 429s to deliveries sent together halves it once.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from app.core.clock import MICROS
from app.core.origins import push_origin
from app.dispatch.outcome import Kind, Outcome
from app.types.models import TypeSettings
from app.types.origin_repository import OriginFigure

log = logging.getLogger(__name__)

_OVERLOAD_STATUSES = frozenset({429, 503})
# Windows of successes at what the origin was found to take before the limit probes above it.
PROBE_WINDOWS = 8


class Verdict(enum.Enum):
    SUCCESS = "success"  # a 2xx
    OVERLOAD = "overload"  # a 429, a 503, a timeout, a connection failure
    NEUTRAL = "neutral"  # any other answer, or nothing sent


@dataclass(frozen=True)
class Said:
    """What a delivery's outcome tells of its origin's load, and why (for the log)."""

    verdict: Verdict
    why: str = ""
    retry_after_seconds: int | None = None


NOTHING_SAID = Said(Verdict.NEUTRAL)


def said_by(outcome: Outcome) -> Said:
    """What the outcome of a delivery that was sent tells of its origin."""
    if outcome.kind is Kind.COMPLETED:
        return Said(Verdict.SUCCESS)
    if outcome.kind is Kind.TIMEOUT:
        return Said(Verdict.OVERLOAD, "a timeout")
    if outcome.kind is Kind.CONNECTION_ERROR:
        return Said(Verdict.OVERLOAD, "a connection failure")
    if outcome.status in _OVERLOAD_STATUSES:
        return Said(Verdict.OVERLOAD, f"HTTP {outcome.status}",
                    outcome.retry_in_seconds if outcome.kind is Kind.RETRY_AFTER else None)
    return NOTHING_SAID


def origin_of(settings: TypeSettings) -> str:
    """The origin a push type's deliveries go to. A url that names none (the API's pattern
    lets none through) is limited under a name of its own."""
    url = settings.push_url or ""
    return push_origin(url) or f"(no origin: {settings.type})"


def origin_caps(targets: Iterable[TypeSettings], concurrency: int) -> dict[str, int]:
    """Each origin's cap: the dispatcher's concurrency, or the smallest max_running among
    the push types sending there when that is lower."""
    caps: dict[str, int] = {}
    for target in targets:
        origin = origin_of(target)
        cap = min(concurrency, target.max_running or concurrency)
        caps[origin] = min(caps.get(origin, cap), cap)
    return caps


@dataclass(eq=False)
class Ticket:
    """One delivery's slot at its origin, from started() to finished()."""

    origin: str
    epoch: int  # the origin's halvings before it was sent
    open: bool = True


@dataclass
class _Origin:
    limit: int
    cap: int
    active: int = 0
    held_until: int = 0  # µs; no delivery starts before
    epoch: int = 0  # halvings so far
    successes: int = 0  # toward the window at `limit`
    # What the origin was found to take: the limit its last halving came from, less one
    # (None: nothing found, or a window above it succeeded since).
    takes: int | None = None

    def successes_to_grow(self) -> int:
        """The 2xx answers in a row at `limit` that grow it: a window, or PROBE_WINDOWS of
        them at what the origin was found to take."""
        if self.takes is not None and self.limit == self.takes:
            return self.limit * PROBE_WINDOWS
        return self.limit


class OriginLimits:
    """The limits of every push origin, shared by the claim loop (room, started) and the
    delivery threads (held_for, finished). `now_us` is the wall clock (a Retry-After date is
    a wall-clock moment, and held_until is shown as one)."""

    def __init__(self, now_us: Callable[[], int], default_cap: int) -> None:
        self._now_us = now_us
        self._default_cap = default_cap
        self._origins: dict[str, _Origin] = {}
        self._lock = threading.Lock()

    def set_caps(self, caps: Mapping[str, int]) -> None:
        """The caps of the push types' origins, read again. A lower cap lowers the limit to
        it; a higher one raises a limit that stood at the old cap (it had not adapted), while
        one below it climbs as successes come."""
        with self._lock:
            for origin, cap in caps.items():
                state = self._origins.get(origin)
                if state is None:
                    self._origins[origin] = _Origin(limit=cap, cap=cap)
                    continue
                old_cap, state.cap = state.cap, cap
                if state.limit > cap or state.limit == old_cap:
                    self._change(origin, state, cap, "its cap changed")

    def room(self, origin: str) -> int:
        """How many more deliveries to `origin` may start now (0 while it is held)."""
        with self._lock:
            return self._room(self._state(origin), self._now_us())

    def started(self, origin: str) -> Ticket:
        """A delivery to `origin` takes a slot (the claim loop checked room() first)."""
        with self._lock:
            state = self._state(origin)
            state.active += 1
            return Ticket(origin, state.epoch)

    def held_for(self, origin: str) -> float:
        """Seconds until `origin`'s Retry-After moment; 0 when it is not held."""
        with self._lock:
            return max(0, self._state(origin).held_until - self._now_us()) / MICROS

    def next_hold_end_in(self) -> float | None:
        """Seconds until the soonest hold of an origin ends; None when none is held."""
        with self._lock:
            now = self._now_us()
            ends = [s.held_until - now for s in self._origins.values() if s.held_until > now]
        return min(ends) / MICROS if ends else None

    def finished(self, ticket: Ticket, said: Said) -> bool:
        """The delivery of `ticket` ended (answered, failed, or never sent: NOTHING_SAID) and
        gives its slot back; a ticket already finished is left alone. True when the origin
        had no room and has some now: a claim loop waiting for room should look again."""
        with self._lock:
            if not ticket.open:
                return False
            ticket.open = False
            state = self._origins[ticket.origin]
            now = self._now_us()
            had_room = self._room(state, now) > 0
            state.active -= 1
            if said.retry_after_seconds:
                state.held_until = max(state.held_until,
                                       now + said.retry_after_seconds * MICROS)
            current = ticket.epoch == state.epoch
            if said.verdict is Verdict.OVERLOAD and current:
                state.epoch += 1
                state.successes = 0
                state.takes = max(1, state.limit - 1)
                self._change(ticket.origin, state, max(1, state.limit // 2), said.why)
            elif said.verdict is Verdict.SUCCESS and current:
                state.successes += 1
                needed = state.successes_to_grow()
                if state.successes >= needed:
                    state.successes = 0
                    if state.takes is not None and state.limit > state.takes:
                        state.takes = None  # a window above it: the origin takes more now
                    plural = "es" if needed > 1 else ""
                    self._change(ticket.origin, state, min(state.cap, state.limit + 1),
                                 f"{needed} success{plural} in a row")
            return not had_room and self._room(state, now) > 0

    def figures(self) -> list[OriginFigure]:
        """Every origin's figure now, by origin (what push_origins and the gauge show)."""
        with self._lock:
            now = self._now_us()
            return [OriginFigure(origin, s.limit, s.cap,
                                 s.held_until if s.held_until > now else None)
                    for origin, s in sorted(self._origins.items())]

    def _state(self, origin: str) -> _Origin:
        state = self._origins.get(origin)
        if state is None:
            state = self._origins[origin] = _Origin(self._default_cap, self._default_cap)
        return state

    @staticmethod
    def _room(state: _Origin, now: int) -> int:
        if state.held_until > now:
            return 0
        return max(0, state.limit - state.active)

    @staticmethod
    def _change(origin: str, state: _Origin, new: int, why: str) -> None:
        if new != state.limit:
            log.info("dispatch: %s: concurrency %d -> %d (%s)", origin, state.limit, new, why)
            state.limit = new
