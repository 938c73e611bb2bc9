"""A push type's circuit breaker (docs/FLOW-CONTROL.md, "Circuit breaker"), both engines: the
dispatcher's deliveries that fail open the circuit, after which it delivers nothing of the
type until the probe, and a probe that succeeds half-opens it."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.clock import Clock
from tests.dispatch.receiver import Receiver, Reply
from tests.dispatch.test_dispatcher import dispatching, make_push, wait_until  # noqa: F401

CIRCUIT = {"failure_ratio": 0.5, "min_attempts": 3, "window_seconds": 60,
           "cooldown_seconds": 1}


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    # Deliveries, retries and the cooldown run on the wall clock.
    return {**app_config, "CLOCK": Clock(), "RETRY_BACKOFF_SECONDS": 3600.0}


def test_failing_deliveries_open_a_push_types_circuit_and_a_probe_heals_it(
        app, client, api, admin, producer, dispatching):  # noqa: F811 (the fixture above)
    services = app.extensions["queuelog"]
    down = {"yes": True}
    receiver = Receiver(answer=lambda _r: Reply(500, b"down") if down["yes"] else Reply())
    with receiver:
        make_push(client, admin, receiver.url, circuit=CIRCUIT)
        ids = [api.enqueue(producer, type="email").json["id"] for _ in range(12)]
        running = dispatching(concurrency=1)

        def state() -> str:
            services.protection.tick()
            shown: str = client.get("/types/email",
                                    headers=admin.headers).json["circuit_state"]["state"]
            return shown

        wait_until(lambda: state() == "open", "the circuit to open")
        delivered = len(receiver.received)
        assert delivered >= CIRCUIT["min_attempts"]
        down["yes"] = False
        # After its cooldown one probe is delivered; it succeeds: half-open, then the waves.
        wait_until(lambda: state() == "half_open", "the probe to half-open it", timeout=60)
        wait_until(lambda: all(api.get(admin, job_id).json["status"] != "pending"
                               for job_id in ids[delivered:]), "the rest delivered", timeout=60)
        running.stop()
    # The failed ones wait for their backoff; every other job was delivered once and completed.
    statuses = [api.get(admin, job_id).json["status"] for job_id in ids]
    assert statuses.count("completed") == len(ids) - delivered
    assert len(receiver.received) == len(ids)
