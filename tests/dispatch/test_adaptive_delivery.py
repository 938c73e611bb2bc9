"""Adaptive push concurrency end to end (both engines): a real dispatcher delivering to a
receiver that takes 3 deliveries at once and answers 429 with Retry-After beyond that."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from app.core.clock import MICROS, Clock
from app.dispatch.adaptive import PROBE_WINDOWS, OriginLimits, Said, Ticket, Verdict
from app.dispatch.dispatcher import Dispatcher
from app.dispatch.metrics import DispatchMetrics
from app.dispatch.origin_figures import FigureRecorder
from tests.dispatch.receiver import Received, Receiver, Reply
from tests.dispatch.test_dispatcher import Running, make_push, wait_until

TAKES = 3  # deliveries the receiver takes at once
CAP = 8
JOBS = 60


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    # Retry-After holds and retries run on the wall clock.
    return {**app_config, "CLOCK": Clock(), "RETRY_BACKOFF_SECONDS": 60.0}


class RecordingLimits(OriginLimits):
    """The dispatcher's limits, recording under one lock each moment a delivery was let go
    (held_for said 0, just before it is sent) and each Retry-After hold it learned (from when,
    until when), so that the two compare without a race."""

    def __init__(self, clock: Clock, cap: int) -> None:
        super().__init__(clock.now_us, cap)
        self.clock = clock
        self.record = threading.Lock()
        self.sent_at: list[int] = []
        self.holds: list[tuple[int, int]] = []

    def held_for(self, origin: str) -> float:
        with self.record:
            held = super().held_for(origin)
            if held == 0:
                self.sent_at.append(self.clock.now_us())
            return held

    def finished(self, ticket: Ticket, said: Said) -> bool:
        with self.record:
            learned = self.clock.now_us()
            if said.retry_after_seconds:
                self.holds.append((learned, learned + said.retry_after_seconds * MICROS))
            return super().finished(ticket, said)


class Overloaded:
    """The receiver's rule: 429 with Retry-After: 1 whenever more than TAKES deliveries are in
    flight at once (this one counted), each request's count at arrival recorded."""

    def __init__(self) -> None:
        self.receiver = Receiver(answer=self.answer)
        self.recovered = False
        self.arrivals: list[tuple[float, int]] = []  # (time.monotonic, in flight)
        self.turned_away: list[Received] = []  # answered 429: Retry-After from its `at`

    def answer(self, received: Received) -> Reply:
        with self.receiver.lock:
            running = self.receiver.running
            if not self.recovered:
                self.arrivals.append((received.at, running))
            if running > TAKES and not self.recovered:
                self.turned_away.append(received)
                return Reply(429, b"busy", {"Retry-After": "1"})
        return Reply(200, b"{}", delay=0.05 if self.recovered else 0.2)


def concurrency_shown(client: Any, admin: Any) -> dict[str, Any] | None:
    shown: dict[str, Any] | None = client.get(
        "/types/email", headers=admin.headers).json["push"]["concurrency"]
    return shown


def test_deliveries_settle_at_what_the_receiver_takes_and_climb_back_when_it_recovers(
        app, client, api, admin, producer):
    services = app.extensions["queuelog"]
    limits = RecordingLimits(services.clock, CAP)
    overloaded = Overloaded()
    with overloaded.receiver as receiver:
        make_push(client, admin, receiver.url)
        ids = [api.enqueue(producer, type="email", max_retries=25).json["id"]
               for _ in range(JOBS)]
        running = Running(Dispatcher(services.jobs, services.types, concurrency=CAP,
                                     grace_seconds=10, metrics=DispatchMetrics(),
                                     clock=services.clock, limits=limits))
        running.thread.start()
        wait_until(lambda: all(api.get(admin, j).json["status"] == "completed" for j in ids),
                   "every completion", timeout=120)
        overloaded_phase = list(receiver.received)

        overloaded.recovered = True
        more = [api.enqueue(producer, type="email").json["id"] for _ in range(80)]
        origin = receiver.url.removesuffix("/hook")
        wait_until(lambda: concurrency_shown(client, admin) == {
            "origin": origin, "current": CAP, "cap": CAP, "held_until": None},
            "the limit back at the cap", timeout=60)
        wait_until(lambda: all(api.get(admin, j).json["status"] == "completed"
                               for j in more), "the later completions")
        running.stop()

    assert overloaded.turned_away and limits.holds
    first_moment = min(r.at for r in overloaded.turned_away) + 1
    # Once the first hold is over, every delivery arriving was sent after the limit came
    # down: the receiver never had more than it takes, plus the one delivery by which the
    # limit probes above it now and then (and is turned away).
    settled = [n for at, n in overloaded.arrivals if at >= first_moment]
    assert max(settled) <= TAKES + 1
    assert sum(1 for n in settled if n > TAKES) <= len(settled) / (TAKES * PROBE_WINDOWS) + 1
    # No delivery was let go inside a Retry-After hold the dispatcher had learned.
    assert not [(sent, hold) for sent in limits.sent_at for hold in limits.holds
                if hold[0] < sent < hold[1]]
    # A job turned away came back no sooner than the moment it was given.
    for away in overloaded.turned_away:
        assert all(r.at >= away.at + 1 for r in overloaded_phase
                   if r.job_id == away.job_id and r.at > away.at)
    # None lost, none run twice: each job answered 200 once, its attempts in order.
    accepted = Counter(r.job_id for r in receiver.received
                       if not any(r is away for away in overloaded.turned_away))
    assert accepted == Counter(ids + more)
    for job_id in ids:
        attempts = [r.attempt for r in receiver.of_job(job_id)]
        assert attempts == list(range(1, len(attempts) + 1))


def test_a_figure_is_written_when_it_changes_and_again_after_a_write_that_failed(
        app, client, admin, monkeypatch):
    services = app.extensions["queuelog"]
    db = services.types.db
    make_push(client, admin, "https://svc.internal/jobs")
    origin = "https://svc.internal:443"
    limits = OriginLimits(services.clock.now_us, CAP)
    limits.set_caps({origin: CAP})
    metrics = DispatchMetrics()
    recorder = FigureRecorder(db, services.clock, limits, metrics)
    writes: list[object] = []
    write = db.run_write

    def counted(fn: Any) -> Any:
        writes.append(fn)
        return write(fn)

    monkeypatch.setattr(db, "run_write", counted)
    recorder.record()
    recorder.record()  # nothing changed: nothing written
    assert len(writes) == 1
    assert concurrency_shown(client, admin) == {"origin": origin, "current": CAP, "cap": CAP,
                                                "held_until": None}

    def away(fn: Any) -> Any:
        raise OperationalError("UPDATE", {}, Exception("the database is away"))

    limits.finished(limits.started(origin), Said(Verdict.OVERLOAD, "a timeout"))
    monkeypatch.setattr(db, "run_write", away)
    recorder.record()
    assert concurrency_shown(client, admin)["current"] == CAP
    monkeypatch.setattr(db, "run_write", counted)
    recorder.record()
    assert concurrency_shown(client, admin)["current"] == CAP // 2
    assert metrics.registry.get_sample_value(
        "queuelog_push_concurrency", {"origin": origin}) == CAP // 2
