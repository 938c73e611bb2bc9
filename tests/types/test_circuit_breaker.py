"""A type's circuit breaker (docs/FLOW-CONTROL.md, "Circuit breaker"): its rules as numbers,
then through the API on both engines, the process's protection thread driven by hand and the
clock moved by hand."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from app.core.clock import MICROS
from app.types.protection import circuit
from app.types.protection.circuit import CircuitSettings
from tests.conftest import Api, Key

CONFIG = CircuitSettings(failure_ratio=0.5, min_attempts=4, window_seconds=60,
                         cooldown_seconds=30)
SINCE = 1_000 * MICROS


# -- the rules ------------------------------------------------------------------------------


def test_an_open_circuit_lets_nothing_run_until_its_cooldown_then_one_probe():
    assert circuit.cap(CONFIG, circuit.OPEN, SINCE, SINCE) == 0
    assert circuit.cap(CONFIG, circuit.OPEN, SINCE, SINCE + 30 * MICROS - 1) == 0
    assert circuit.cap(CONFIG, circuit.OPEN, SINCE, SINCE + 30 * MICROS) == 1
    assert circuit.cap(CONFIG, circuit.OPEN, SINCE, SINCE + 3600 * MICROS) == 1
    assert circuit.cap(CONFIG, None, SINCE, SINCE) is None
    assert circuit.cap(None, circuit.OPEN, SINCE, SINCE) is None


def test_a_half_open_circuit_doubles_its_wave_each_cooldown_until_min_attempts():
    waves = [circuit.cap(CONFIG, circuit.HALF_OPEN, SINCE, SINCE + k * 30 * MICROS)
             for k in range(4)]
    # A wave of 4 would be min_attempts: it runs unlimited instead, and closes.
    assert waves == [1, 2, None, None]
    assert CONFIG.closes_at(SINCE) == SINCE + 2 * 30 * MICROS
    one = CircuitSettings(0.5, 1, 60, 30)
    assert circuit.cap(one, circuit.HALF_OPEN, SINCE, SINCE) is None


def test_the_ratio_counts_only_from_min_attempts():
    assert not CONFIG.trips(finished=3, failed=3)
    assert CONFIG.trips(finished=4, failed=2)
    assert not CONFIG.trips(finished=5, failed=2)


def test_what_ends_moves_a_tripped_circuit_only_after_its_cooldown():
    before = SINCE + 10 * MICROS
    after = SINCE + 31 * MICROS
    # What ran before it opened ends: nothing moves.
    assert circuit.after_end(CONFIG, circuit.OPEN, SINCE, 1, 1, before) is None
    probe_ok = circuit.after_end(CONFIG, circuit.OPEN, SINCE, 1, 0, after)
    assert probe_ok is not None and probe_ok.state == circuit.HALF_OPEN
    probe_failed = circuit.after_end(CONFIG, circuit.OPEN, SINCE, 1, 1, after)
    assert probe_failed is not None and probe_failed.state == circuit.OPEN
    reopened = circuit.after_end(CONFIG, circuit.HALF_OPEN, SINCE, 3, 1, before)
    assert reopened is not None and reopened.state == circuit.OPEN
    assert circuit.after_end(CONFIG, circuit.HALF_OPEN, SINCE, 3, 0, before) is None
    assert circuit.after_end(CONFIG, None, None, 0, 9, before) is None


# -- through the API ------------------------------------------------------------------------


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    return {**app_config, "TYPE_COUNTS_MAX_AGE_SECONDS": 0}


def _patch(api: Api, admin: Key, **body: Any) -> Any:
    return api.client.patch("/types/email", json=body, headers=admin.headers)


def _state(api: Api, admin: Key) -> dict[str, Any]:
    shown: dict[str, Any] = api.client.get("/types/email", headers=admin.headers).json
    return shown["circuit_state"]


def _tick(app: Any) -> None:
    app.extensions["queuelog"].protection.tick()


def _moves(caplog: Any) -> list[str]:
    """The log lines of the circuits' moves, one per move."""
    return [r.getMessage() for r in caplog.records
            if r.getMessage().startswith("circuit of type")]


def _claim(api: Api, worker: Key) -> Any:
    return api.claim(worker, types=["email"])


def test_a_circuit_is_set_shown_and_refused_out_of_bounds(api, admin):
    assert api.client.get("/types/email", headers=admin.headers).json["circuit"] is None
    answer = _patch(api, admin, circuit={})
    assert answer.status_code == 200, answer.json
    assert answer.json["circuit"] == {"failure_ratio": 0.5, "min_attempts": 20,
                                      "window_seconds": 60, "cooldown_seconds": 30}
    assert answer.json["circuit_state"] == {"state": "closed", "since": None,
                                            "opened_by": None, "next_probe_at": None,
                                            "wave": None}
    for bad in ({"failure_ratio": 0.01}, {"min_attempts": 0}, {"window_seconds": 5},
                {"cooldown_seconds": 0}, {"failure_ratio": "half"}, {"extra": 1}):
        refused = _patch(api, admin, circuit=bad)
        assert refused.status_code == 422, (bad, refused.json)
    assert _patch(api, admin, circuit=None).json["circuit"] is None
    no_circuit = _patch(api, admin, circuit_state="open")
    assert no_circuit.status_code == 422 and "circuit_state" in no_circuit.json["errors"]
    assert _patch(api, admin, circuit_state="half_open").status_code == 422


def test_a_circuit_opens_at_min_attempts_probes_one_at_a_time_and_heals(
        app, api, producer, worker, admin, clock, caplog):
    caplog.set_level(logging.INFO, logger="app.types.protection.tallies")
    assert _patch(api, admin, circuit={"failure_ratio": 0.5, "min_attempts": 4,
                                       "window_seconds": 60, "cooldown_seconds": 30}
                  ).status_code == 200
    ids = [api.enqueue(producer, max_retries=0).json["id"] for _ in range(12)]

    for attempt in range(4):
        job = _claim(api, worker).json
        assert api.fail(worker, job["id"], error="KeyError: 'address'").status_code == 200
        _tick(app)
        # Open after min_attempts, not earlier.
        assert _state(api, admin)["state"] == ("open" if attempt == 3 else "closed")
    state = _state(api, admin)
    group = api.client.get("/failures", query_string={"type": "email"},
                           headers=admin.headers).json["groups"][0]
    assert state["opened_by"] == {"fingerprint": group["fingerprint"],
                                  "sample": "KeyError: 'address'"}
    assert _moves(caplog) == [
        "circuit of type email: closed -> open (4 of 4 attempts failed in 60 s, ratio 0.5)"]

    assert _claim(api, worker).status_code == 204  # open: nothing is claimed
    reasons = api.explain(producer, ids[4])
    assert not reasons["claimable_now"]
    assert reasons["reasons"][0]["code"] == "circuit_open"
    metrics = api.client.get("/metrics", headers=admin.headers).text
    assert 'queuelog_circuit_state{type="email"} 2.0' in metrics

    clock.advance(30)
    probe = _claim(api, worker)
    assert probe.status_code == 200
    assert _claim(api, worker).status_code == 204  # one probe at a time
    assert api.complete(worker, probe.json["id"]).status_code == 200
    _tick(app)
    assert _state(api, admin)["state"] == "half_open" and _state(api, admin)["wave"] == 1

    first_wave = _claim(api, worker)
    assert first_wave.status_code == 200 and _claim(api, worker).status_code == 204
    assert api.explain(producer, ids[6])["reasons"][0]["code"] == "circuit_half_open"
    api.complete(worker, first_wave.json["id"])
    _tick(app)
    clock.advance(30)  # the wave doubles
    second_wave = api.client.post("/jobs/claim-many", json={"types": ["email"], "max_jobs": 5},
                                  headers=worker.headers).json["jobs"]
    assert len(second_wave) == 2
    for job in second_wave:
        api.complete(worker, job["id"])
    _tick(app)
    clock.advance(30)  # the wave reaches min_attempts: it closes
    _tick(app)
    assert _state(api, admin)["state"] == "closed"
    rest = api.client.post("/jobs/claim-many", json={"types": ["email"], "max_jobs": 50},
                           headers=worker.headers).json["jobs"]
    assert len(rest) == 4  # the whole backlog runs again
    assert _moves(caplog)[-1] == (
        "circuit of type email: half_open -> closed (its waves reached min_attempts with no "
        "failure)")
    metrics = api.client.get("/metrics", headers=admin.headers).text
    assert 'queuelog_circuit_state{type="email"} 0.0' in metrics


def test_a_failure_while_half_open_opens_it_again_and_a_failed_probe_waits_anew(
        app, api, producer, worker, admin, clock):
    _patch(api, admin, circuit={"min_attempts": 1, "cooldown_seconds": 10})
    for _ in range(6):
        api.enqueue(producer, max_retries=0)
    api.fail(worker, _claim(api, worker).json["id"])
    _tick(app)
    opened = _state(api, admin)
    assert opened["state"] == "open"
    clock.advance(10)
    api.fail(worker, _claim(api, worker).json["id"], error="still down")
    _tick(app)
    again = _state(api, admin)
    assert again["state"] == "open" and again["since"] > opened["since"]  # cooldown anew
    assert _claim(api, worker).status_code == 204
    _patch(api, admin, circuit={"min_attempts": 4, "cooldown_seconds": 10})
    clock.advance(10)
    api.complete(worker, _claim(api, worker).json["id"])
    _tick(app)
    assert _state(api, admin)["state"] == "half_open"
    api.fail(worker, _claim(api, worker).json["id"], error="down again")
    _tick(app)
    assert _state(api, admin)["state"] == "open"
    assert _claim(api, worker).status_code == 204
    # With min_attempts 1 a probe's success is the whole sample: it closes at the next round.
    _patch(api, admin, circuit={"min_attempts": 1, "cooldown_seconds": 10})
    clock.advance(10)
    api.complete(worker, _claim(api, worker).json["id"])
    _tick(app)
    _tick(app)
    assert _state(api, admin)["state"] == "closed"


def test_an_admin_opens_and_closes_a_circuit_by_hand(app, api, producer, worker, admin, clock,
                                                     caplog):
    caplog.set_level(logging.INFO, logger="app.types.service")
    _patch(api, admin, circuit={"cooldown_seconds": 60})
    api.enqueue(producer)
    opened = _patch(api, admin, circuit_state="open")
    assert opened.status_code == 200
    assert opened.json["circuit_state"]["state"] == "open"
    assert opened.json["circuit_state"]["opened_by"] is None
    assert _claim(api, worker).status_code == 204
    closed = _patch(api, admin, circuit_state="closed")
    assert closed.json["circuit_state"]["state"] == "closed"
    assert _claim(api, worker).status_code == 200
    assert _moves(caplog) == [
        "circuit of type email: closed -> open (by hand)",
        "circuit of type email: open -> closed (by hand)"]
    # A circuit removed forgets where it stood.
    _patch(api, admin, circuit_state="open")
    removed = _patch(api, admin, circuit=None)
    assert removed.json["circuit_state"] is None
    api.enqueue(producer)
    assert _claim(api, worker).status_code == 200


def test_a_closed_circuit_counts_its_window_from_its_closing(app, api, producer, worker, admin,
                                                             clock):
    """The outage that opened it is not counted again once it closes by hand."""
    _patch(api, admin, circuit={"min_attempts": 3, "window_seconds": 60})
    for _ in range(8):
        api.enqueue(producer, max_retries=0)
    for _ in range(3):
        api.fail(worker, _claim(api, worker).json["id"])
    _tick(app)
    assert _state(api, admin)["state"] == "open"
    clock.advance(1)
    _patch(api, admin, circuit_state="closed")
    clock.advance(1)
    api.complete(worker, _claim(api, worker).json["id"])
    api.fail(worker, _claim(api, worker).json["id"])
    _tick(app)
    assert _state(api, admin)["state"] == "closed"  # 1 of 2 since it closed: too few
    api.fail(worker, _claim(api, worker).json["id"])
    _tick(app)
    assert _state(api, admin)["state"] == "open"  # 2 of 3 since it closed


def test_failures_seen_before_the_process_knew_of_the_circuit_still_open_it(
        app, api, producer, worker, admin, clock):
    """A circuit set on another process reaches this one's copy of the settings within a
    second; the failures this process saw meanwhile are counted all the same."""
    from app.types.protection.tallies import Protection

    services = app.extensions["queuelog"]
    copy: dict[str, Any] = {"now": {}}  # this process's copy: the type not protected yet
    protection = Protection(services.db, services.clock, 0, lambda: copy["now"], lambda: None)
    services.stats_flusher.buffer.watch(protection.observe)
    _patch(api, admin, circuit={"min_attempts": 3})
    for _ in range(3):
        api.enqueue(producer, max_retries=0)
    for _ in range(3):
        api.fail(worker, _claim(api, worker).json["id"])
    protection.tick()  # the copy still does not show it: kept, not written, not dropped
    assert _state(api, admin)["state"] == "closed"
    services.type_settings.refresh()
    copy["now"] = services.type_settings.snapshot()
    protection.tick()
    assert _state(api, admin)["state"] == "open"
