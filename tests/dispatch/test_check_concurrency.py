"""Reservations' checks asked concurrently, each origin's share capped (both engines), against
real check endpoints on loopback: a check url that hangs holds its origin's share and no more,
and the checks of other origins, other producers', are asked and decided beside it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from app.core.clock import Clock
from app.dispatch.check_rounds import Checker
from app.dispatch.checks import CheckSettings
from app.dispatch.dispatcher import Dispatcher
from app.dispatch.http import PushClient
from app.dispatch.metrics import DispatchMetrics
from app.keys.repository import KeyRepository
from tests.conftest import Api, Key
from tests.dispatch.receiver import Received, Receiver, Reply
from tests.dispatch.test_dispatcher import Running, wait_until

COMMIT = Reply(200, b'{"commit": true}')
# Far above what any wait here needs: a hanging endpoint is cut off by the test, not by it.
LONG_TIMEOUT_SECONDS = 60.0


@pytest.fixture
def endpoints() -> Iterator[list[Receiver]]:
    """Three check endpoints, three origins (their ports), started before the app so that
    the operator's list can name them; each test sets their answers."""
    started = [Receiver(answer=lambda _r: COMMIT) for _ in range(3)]
    for receiver in started:
        receiver.__enter__()
    yield started
    for receiver in started:
        receiver.__exit__()


@pytest.fixture
def app_config(app_config: dict[str, Any], endpoints: list[Receiver]) -> dict[str, Any]:
    # The wall clock: deadlines pass by themselves while the loop runs.
    return {**app_config, "CLOCK": Clock(), "CHECK_URL_ORIGINS": ",".join(
        r.url.removesuffix("hook") for r in endpoints)}


def reserve(api: Api, producer: Key, url: str | None, count: int) -> list[int]:
    """`count` reservations with this check url (None: the key's), due in a second."""
    made = []
    for _ in range(count):
        check = {} if url is None else {"check_url": url}
        answer = api.enqueue(producer, reserve={"confirm_within_seconds": 1, **check})
        assert answer.status_code == 201, answer.json
        made.append(answer.json["id"])
    return made


def statuses(api: Api, admin: Key, job_ids: list[int]) -> list[str]:
    return [api.get(admin, job_id).json["status"] for job_id in job_ids]


def blocking_until(event: threading.Event) -> Callable[[Received], Reply]:
    """An endpoint that answers commit once `event` is set (the test's hand on it)."""
    def answer(_received: Received) -> Reply:
        event.wait(LONG_TIMEOUT_SECONDS)
        return COMMIT

    return answer


@pytest.fixture
def checking(app: Any) -> Iterator[Callable[[CheckSettings], Checker]]:
    """The dispatcher's check loop (Checker.run) on a thread, with these settings."""
    stopping = threading.Event()
    threads = []

    def start(settings: CheckSettings) -> Checker:
        services = app.extensions["queuelog"]
        checker = Checker(services.jobs.reservations, PushClient(16), services.clock,
                          settings)
        thread = threading.Thread(target=checker.run, args=(stopping,), daemon=True)
        thread.start()
        threads.append(thread)
        return checker

    yield start
    stopping.set()
    for thread in threads:
        thread.join(10)


def test_checks_are_asked_at_once_at_several_origins_never_beyond_each_ones_share(
        api, producer, admin, endpoints, checking):
    """Each endpoint holds its answers until both endpoints have the origin's share (3) in
    flight at once: asked one at a time, or one origin after the other, they never would."""
    first, second, _ = endpoints
    together = threading.Event()

    def answer(_received: Received) -> Reply:
        if first.running + second.running >= 6:
            together.set()
        together.wait(LONG_TIMEOUT_SECONDS)
        return COMMIT

    first.answer = second.answer = answer
    jobs = reserve(api, producer, first.url, 9) + reserve(api, producer, second.url, 9)

    checking(CheckSettings(concurrency=8, per_origin=3, timeout_seconds=LONG_TIMEOUT_SECONDS))
    wait_until(together.is_set, "both origins' checks in flight at once")
    wait_until(lambda: set(statuses(api, admin, jobs)) == {"pending"}, "every check decided")

    assert (first.max_running, second.max_running) == (3, 3)
    assert len(first.received) == len(second.received) == 9  # each asked once
    assert {r.method for r in first.received + second.received} == {"GET"}


def test_a_hanging_check_url_holds_its_share_and_other_producers_checks_go_on(
        api, producer, admin, make_key, endpoints, checking):
    """30 reservations whose check url hangs, due first, and another producer's at another
    origin: the other's are asked and decided while the 30 still hang, and no more than the
    origin's share of the 30 is ever in flight."""
    hanging, prompt, _ = endpoints
    release = threading.Event()
    hanging.answer = blocking_until(release)
    stuck = reserve(api, producer, hanging.url, 30)
    theirs = reserve(api, make_key("producer-2", "producer"), prompt.url, 5)

    try:
        checking(CheckSettings(concurrency=4, per_origin=2,
                               timeout_seconds=LONG_TIMEOUT_SECONDS))
        wait_until(lambda: set(statuses(api, admin, theirs)) == {"pending"},
                   "the other producer's checks to be decided")
        wait_until(lambda: hanging.running == 2, "the hanging origin's share in flight")

        assert set(statuses(api, admin, stuck)) == {"reserved"}  # none has answered
        assert hanging.max_running == 2
        assert len(prompt.received) == 5
    finally:
        release.set()
    # Once it answers, its checks are decided in turn, still two at a time; those put off
    # while it hung were not counted as asked.
    wait_until(lambda: statuses(api, admin, stuck).count("pending") >= 6,
               "the released origin's checks to be decided")
    assert hanging.max_running == 2
    assert {received.attempt for received in hanging.received} == {1}


def test_the_dispatchers_checks_of_a_hanging_origin_never_keep_another_waiting(
        app, api, producer, admin, make_key, endpoints):
    """`queuelog dispatch` as it runs (its loop, its threads, its shared HTTP client):
    another producer's reservations, due after 30 that hang, are decided while those still
    hang, though the hanging ones' timeout is far away."""
    hanging, prompt, _ = endpoints
    release = threading.Event()
    hanging.answer = blocking_until(release)
    stuck = reserve(api, producer, hanging.url, 30)
    theirs = reserve(api, make_key("producer-2", "producer"), prompt.url, 3)
    services = app.extensions["queuelog"]
    running = Running(Dispatcher(
        services.jobs, services.types, concurrency=2, grace_seconds=1,
        metrics=DispatchMetrics(), clock=services.clock,
        checks=CheckSettings(concurrency=6, per_origin=3, timeout_seconds=LONG_TIMEOUT_SECONDS)))
    running.thread.start()
    try:
        wait_until(lambda: set(statuses(api, admin, theirs)) == {"pending"},
                   "the other producer's checks to be decided")
        assert set(statuses(api, admin, stuck)) == {"reserved"}
        assert hanging.max_running <= 3
    finally:
        release.set()
        running.stop()


def test_a_stored_check_url_the_rule_now_refuses_is_never_asked(
        app, api, producer, admin, endpoints, checking):
    """A key's check url stored before the rule refused disguised steps: its reservations
    take it, and their checks are never sent; each counts as unanswered."""
    target = endpoints[0]
    with app.extensions["queuelog"].db.write() as conn:
        KeyRepository(conn).set_check_url(
            producer.name, target.url.removesuffix("hook") + "%2e%2e/metrics")
    [job_id] = reserve(api, producer, None, 1)
    checking(CheckSettings(concurrency=2, per_origin=1, timeout_seconds=5))

    wait_until(lambda: unanswered_checks(app, job_id) >= 1, "the check to count as unanswered")
    assert target.received == []
    assert api.get(admin, job_id).json["status"] == "reserved"


def unanswered_checks(app: Any, job_id: int) -> int:
    """How many checks of the job's reservation went unanswered."""
    reservation = app.extensions["queuelog"].jobs.reservations.uow.read(
        lambda tx: tx.reservations.get(job_id))
    return 0 if reservation is None else reservation.checks
