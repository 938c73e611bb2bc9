"""The rules of adaptive push concurrency (app/dispatch/adaptive.py), on a clock moved by hand:
no database, no HTTP."""

from __future__ import annotations

import logging

import pytest

from app.core.clock import MICROS, ManualClock
from app.dispatch.adaptive import (
    NOTHING_SAID,
    PROBE_WINDOWS,
    OriginLimits,
    Said,
    Verdict,
    origin_caps,
    said_by,
)
from app.dispatch.outcome import Kind, Outcome
from app.types.models import TypeSettings
from app.types.origin_repository import OriginFigure

ORIGIN = "https://hooks.example.com:443"
OK = Said(Verdict.SUCCESS)
BUSY = Said(Verdict.OVERLOAD, "HTTP 429")


def busy_for(seconds: int) -> Said:
    return Said(Verdict.OVERLOAD, "HTTP 429", retry_after_seconds=seconds)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start_us=1_000 * MICROS)


def limits_of(clock: ManualClock, cap: int = 8) -> OriginLimits:
    limits = OriginLimits(clock.now_us, default_cap=16)
    limits.set_caps({ORIGIN: cap})
    return limits


def limit_of(limits: OriginLimits, origin: str = ORIGIN) -> int:
    return next(f.concurrency for f in limits.figures() if f.origin == origin)


def test_an_origin_starts_at_its_cap_and_lets_start_no_more(clock):
    limits = limits_of(clock, cap=3)
    assert limits.room(ORIGIN) == 3
    tickets = [limits.started(ORIGIN) for _ in range(3)]
    assert limits.room(ORIGIN) == 0
    limits.finished(tickets[0], NOTHING_SAID)
    assert limits.room(ORIGIN) == 1
    assert limits.figures() == [OriginFigure(ORIGIN, 3, 3, None)]


def test_an_origin_never_seen_has_the_dispatchers_concurrency_as_cap(clock):
    limits = OriginLimits(clock.now_us, default_cap=5)
    assert limits.room("http://other:80") == 5


@pytest.mark.parametrize("said", [BUSY, Said(Verdict.OVERLOAD, "HTTP 503"),
                                  Said(Verdict.OVERLOAD, "a timeout"),
                                  Said(Verdict.OVERLOAD, "a connection failure")])
def test_an_overload_halves_the_limit(clock, said):
    limits = limits_of(clock, cap=8)
    limits.finished(limits.started(ORIGIN), said)
    assert limit_of(limits) == 4


def test_halving_stops_at_one(clock):
    limits = limits_of(clock, cap=3)
    for _ in range(4):
        limits.finished(limits.started(ORIGIN), BUSY)
    assert limit_of(limits) == 1 and limits.room(ORIGIN) == 1


def test_overloads_of_deliveries_sent_before_a_halving_do_not_halve_it_again(clock):
    limits = limits_of(clock, cap=8)
    burst = [limits.started(ORIGIN) for _ in range(8)]
    for ticket in burst[3:]:
        limits.finished(ticket, BUSY)
    assert limit_of(limits) == 4
    # A delivery sent after the halving tells of the new limit.
    limits.finished(limits.started(ORIGIN), BUSY)
    assert limit_of(limits) == 2


def test_a_retry_after_holds_the_origin_until_its_moment(clock):
    limits = limits_of(clock, cap=8)
    limits.finished(limits.started(ORIGIN), busy_for(2))
    assert limits.room(ORIGIN) == 0
    assert limits.held_for(ORIGIN) == 2.0
    assert limits.next_hold_end_in() == 2.0
    [figure] = limits.figures()
    assert figure == OriginFigure(ORIGIN, 4, 8, clock.now_us() + 2 * MICROS)
    clock.advance(1.5)
    assert limits.room(ORIGIN) == 0 and limits.held_for(ORIGIN) == 0.5
    clock.advance(0.5)
    assert limits.room(ORIGIN) == 4 and limits.held_for(ORIGIN) == 0
    assert limits.next_hold_end_in() is None
    assert limits.figures()[0].held_until is None


def test_a_stale_retry_after_still_holds_and_a_shorter_one_never_shortens_a_hold(clock):
    limits = limits_of(clock, cap=8)
    first, stale, later = (limits.started(ORIGIN) for _ in range(3))
    limits.finished(first, busy_for(5))
    limits.finished(stale, busy_for(9))
    assert limit_of(limits) == 4  # halved once
    assert limits.held_for(ORIGIN) == 9.0
    limits.finished(later, busy_for(1))
    assert limits.held_for(ORIGIN) == 9.0


def test_a_window_of_successes_grows_the_limit_by_one_up_to_the_cap(clock):
    limits = limits_of(clock, cap=4)
    limits.finished(limits.started(ORIGIN), BUSY)  # 4 -> 2: the origin takes 3
    grown = []
    for _ in range(2 + 3 * PROBE_WINDOWS + 4):
        limits.finished(limits.started(ORIGIN), OK)
        grown.append(limit_of(limits))
    # 2 successes at 2, then PROBE_WINDOWS windows at 3, what it takes, then the cap.
    assert grown == [2, 3] + [3] * (3 * PROBE_WINDOWS - 1) + [4] * 5


def test_deliveries_settle_at_what_the_origin_takes_probing_above_it_now_and_then(clock):
    limits = limits_of(clock, cap=8)
    takes = 3
    seen = []
    for _ in range(400):  # an origin that answers 429 beyond 3 at once
        ticket = limits.started(ORIGIN)
        limits.finished(ticket, BUSY if limit_of(limits) > takes else OK)
        seen.append(limit_of(limits))
    settled = seen[20:]
    above = sum(1 for limit in settled if limit > takes)
    assert above <= len(settled) / (takes * PROBE_WINDOWS) + 1
    assert max(settled) == takes + 1  # its probes, one step above
    # It recovers: the limit climbs back to the cap, a window a step once a probe succeeds.
    climbed = []
    while limit_of(limits) < 8:
        limits.finished(limits.started(ORIGIN), OK)
        climbed.append(limit_of(limits))
        assert len(climbed) <= takes * PROBE_WINDOWS + 4 + 5 + 6 + 7
    assert limit_of(limits) == 8


def test_successes_of_deliveries_sent_before_a_halving_do_not_count(clock):
    limits = limits_of(clock, cap=4)
    before = [limits.started(ORIGIN) for _ in range(4)]
    limits.finished(before[0], BUSY)
    assert limit_of(limits) == 2
    for ticket in before[1:]:
        limits.finished(ticket, OK)
    assert limit_of(limits) == 2
    limits.finished(limits.started(ORIGIN), OK)
    limits.finished(limits.started(ORIGIN), OK)
    assert limit_of(limits) == 3


def test_other_failures_change_nothing_and_do_not_break_a_window(clock):
    limits = limits_of(clock, cap=4)
    limits.finished(limits.started(ORIGIN), BUSY)
    assert limit_of(limits) == 2
    limits.finished(limits.started(ORIGIN), OK)
    limits.finished(limits.started(ORIGIN), NOTHING_SAID)  # a 500, a 400, not sent…
    assert limit_of(limits) == 2 and limits.room(ORIGIN) == 2
    limits.finished(limits.started(ORIGIN), OK)
    assert limit_of(limits) == 3


def test_an_overload_starts_the_window_again(clock):
    limits = limits_of(clock, cap=8)
    limits.finished(limits.started(ORIGIN), BUSY)
    limits.finished(limits.started(ORIGIN), BUSY)  # 2
    limits.finished(limits.started(ORIGIN), OK)
    limits.finished(limits.started(ORIGIN), BUSY)  # 1: the success before it is forgotten
    limits.finished(limits.started(ORIGIN), OK)
    assert limit_of(limits) == 1  # 1 is what it takes: PROBE_WINDOWS windows first
    for _ in range(PROBE_WINDOWS - 1):
        limits.finished(limits.started(ORIGIN), OK)
    assert limit_of(limits) == 2


def test_a_ticket_finished_twice_gives_its_slot_back_once(clock):
    limits = limits_of(clock, cap=2)
    ticket = limits.started(ORIGIN)
    limits.started(ORIGIN)
    limits.finished(ticket, OK)
    limits.finished(ticket, NOTHING_SAID)
    assert limits.room(ORIGIN) == 1


def test_finishing_says_when_a_full_origin_has_room_again(clock):
    limits = limits_of(clock, cap=2)
    first, second = limits.started(ORIGIN), limits.started(ORIGIN)
    assert limits.finished(first, NOTHING_SAID) is True
    third = limits.started(ORIGIN)
    assert limits.finished(second, busy_for(3)) is False  # held: still no room
    assert limits.finished(third, NOTHING_SAID) is False


def test_caps_read_again_clamp_the_limit_and_raise_one_that_had_not_adapted(clock):
    limits = OriginLimits(clock.now_us, default_cap=16)
    limits.set_caps({ORIGIN: 8, "http://b:80": 8})
    limits.finished(limits.started("http://b:80"), BUSY)  # b adapted to 4
    limits.set_caps({ORIGIN: 6, "http://b:80": 6})
    assert limit_of(limits) == 6 and limit_of(limits, "http://b:80") == 4
    limits.set_caps({ORIGIN: 2, "http://b:80": 2})
    assert limit_of(limits) == 2 and limit_of(limits, "http://b:80") == 2
    limits.finished(limits.started("http://b:80"), BUSY)  # b adapted to 1
    limits.set_caps({ORIGIN: 7, "http://b:80": 7})
    assert limit_of(limits) == 7 and limit_of(limits, "http://b:80") == 1
    assert [f.cap for f in limits.figures()] == [7, 7]


def test_each_change_of_a_limit_is_one_info_line(clock, caplog):
    caplog.set_level(logging.INFO, logger="app.dispatch.adaptive")
    limits = limits_of(clock, cap=2)
    limits.finished(limits.started(ORIGIN), busy_for(1))
    clock.advance(1)
    for _ in range(PROBE_WINDOWS + 2):  # 1 is what it took: PROBE_WINDOWS windows there
        limits.finished(limits.started(ORIGIN), OK)
    assert [r.getMessage() for r in caplog.records] == [
        f"dispatch: {ORIGIN}: concurrency 2 -> 1 (HTTP 429)",
        f"dispatch: {ORIGIN}: concurrency 1 -> 2 ({PROBE_WINDOWS} successes in a row)"]


@pytest.mark.parametrize(("outcome", "said"), [
    (Outcome(Kind.COMPLETED, 200), Said(Verdict.SUCCESS)),
    (Outcome(Kind.RETRY_AFTER, 429, retry_in_seconds=7), Said(Verdict.OVERLOAD, "HTTP 429", 7)),
    (Outcome(Kind.RETRY_AFTER, 503, retry_in_seconds=0), Said(Verdict.OVERLOAD, "HTTP 503", 0)),
    (Outcome(Kind.HTTP_ERROR, 429), Said(Verdict.OVERLOAD, "HTTP 429")),
    (Outcome(Kind.HTTP_ERROR, 503), Said(Verdict.OVERLOAD, "HTTP 503")),
    (Outcome(Kind.TIMEOUT), Said(Verdict.OVERLOAD, "a timeout")),
    (Outcome(Kind.CONNECTION_ERROR), Said(Verdict.OVERLOAD, "a connection failure")),
    (Outcome(Kind.HTTP_ERROR, 500), NOTHING_SAID),
    (Outcome(Kind.HTTP_ERROR, 400), NOTHING_SAID),
    (Outcome(Kind.HTTP_ERROR, 307), NOTHING_SAID),
])
def test_what_an_outcome_says_of_its_origin(outcome, said):
    assert said_by(outcome) == said


def test_an_origins_cap_is_the_concurrency_or_its_types_smallest_max_running():
    def push(name: str, url: str, max_running: int | None = None) -> TypeSettings:
        return TypeSettings(type=name, push_url=url, max_running=max_running)

    targets = [push("a", "https://u:p@Hooks.example.com/a", max_running=5),
               push("b", "https://hooks.example.com:443/b?sig=1", max_running=3),
               push("c", "http://10.0.0.1:8080/c"),
               push("d", "http://10.0.0.2/d", max_running=40)]
    assert origin_caps(targets, concurrency=16) == {
        "https://hooks.example.com:443": 3, "http://10.0.0.1:8080": 16,
        "http://10.0.0.2:80": 16}
