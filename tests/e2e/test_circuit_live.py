"""A circuit breaker under real concurrency (docs/FLOW-CONTROL.md, "Circuit breaker"):
gunicorn with 4 workers over each engine, and two gunicorn instances over one PostgreSQL
database, 16 claiming clients against a downstream that fails everything for a while and then
recovers. What runs is sampled from outside the servers, straight from the database."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
from sqlalchemy import create_engine, text

from app.types.protection import circuit
from app.types.protection.circuit import CircuitSettings
from tests.e2e.client import QueueClient, server_errors
from tests.e2e.test_flow_control import Cluster, cluster  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow

JOBS = 240
CONFIG = CircuitSettings(failure_ratio=0.5, min_attempts=20, window_seconds=60,
                         cooldown_seconds=2)
RUN_TIMEOUT_SECONDS = 240


@dataclass
class Watch:
    """What the outside monitor saw: the circuit's states in turn, the failed attempts counted
    when it first opened, the most jobs out at once that were claimed while it stood open
    (probes), and any sample where more ran than a half-open circuit's wave."""

    samples: int = 0
    failed_when_opened: int | None = None
    most_probes_while_open: int = 0
    over_the_wave: list[tuple[int, int]] = field(default_factory=list)
    states: list[str] = field(default_factory=list)
    opened_at: set[int] = field(default_factory=set)


class Monitor:
    def __init__(self, url: str) -> None:
        self.engine = create_engine(url)
        self.watch = Watch()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        query = text(
            "SELECT t.circuit_state, t.circuit_since,"
            " (SELECT coalesce(sum(g.count), 0) FROM failure_groups g WHERE g.type = 'pdf')"
            " FROM job_types t WHERE t.type = 'pdf'")
        running = text("SELECT claimed_at FROM jobs WHERE type = 'pdf' AND status = 'running'")
        watch = self.watch
        # Each opening (by its since): when this monitor first saw it. A job claimed after
        # that was claimed after the opening committed, so under it: a probe.
        first_seen: dict[int, int] = {}
        while not self._stop.is_set():
            with self.engine.connect() as conn:
                row = conn.execute(query).first()
                claimed = [int(at) for (at,) in conn.execute(running)]
            now = int(time.time() * 1_000_000)
            watch.samples += 1
            if row is None:
                continue
            state, since, failed = row[0], row[1], int(row[2])
            shown = circuit.shown_state(state)
            if not watch.states or watch.states[-1] != shown:
                watch.states.append(shown)
            if state == circuit.OPEN:
                watch.opened_at.add(since)
                seen = first_seen.setdefault(since, now)
                if watch.failed_when_opened is None:
                    watch.failed_when_opened = failed
                probes = sum(1 for at in claimed if at > seen)
                watch.most_probes_while_open = max(watch.most_probes_while_open, probes)
            elif state == circuit.HALF_OPEN:
                wave = circuit.cap(CONFIG, state, since, now)
                in_waves = sum(1 for at in claimed if at >= since)
                if wave is not None and in_waves > wave:
                    watch.over_the_wave.append((in_waves, wave))

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.engine.dispose()


def test_a_circuit_trips_probes_one_at_a_time_heals_and_loses_nothing(
        cluster: Cluster) -> None:  # noqa: F811 (the fixture imported above)
    cluster.set_type("pdf", circuit={"failure_ratio": CONFIG.failure_ratio,
                                     "min_attempts": CONFIG.min_attempts,
                                     "window_seconds": CONFIG.window_seconds,
                                     "cooldown_seconds": CONFIG.cooldown_seconds})
    ids = cluster.enqueue([{"type": "pdf", "max_retries": 25, "payload": {"n": n}}
                           for n in range(JOBS)])
    healthy = threading.Event()
    lock = threading.Lock()
    completed: list[int] = []
    unexpected: list[str] = []
    deadline = time.monotonic() + RUN_TIMEOUT_SECONDS

    def work(client: QueueClient) -> None:
        while time.monotonic() < deadline:
            with lock:
                if len(completed) >= JOBS or unexpected:
                    return
            response = client.claim(types=["pdf"], lease_seconds=600)
            if response.status_code == 204:
                time.sleep(0.01)
                continue
            if response.status_code != 200:
                unexpected.append(f"claim {response.status_code} {response.text[:200]}")
                return
            job = response.json()
            time.sleep(0.005)
            if healthy.is_set():
                done = client.complete(job["id"], lease_token=job["lease_token"])
                with lock:
                    completed.append(job["id"])
            else:
                done = client.request("POST", f"/jobs/{job['id']}/fail", json={
                    "lease_token": job["lease_token"], "retry_in_seconds": 0,
                    "error": "ConnectionRefusedError: downstream is down"})
            if done.status_code != 200:
                unexpected.append(f"report {done.status_code} {done.text[:200]}")

    def recover_after_two_failed_probes(monitor: Monitor) -> None:
        # Opened, then at least one probe failed (its cooldown began anew): recover.
        while time.monotonic() < deadline and len(monitor.watch.opened_at) < 2:
            time.sleep(0.05)
        healthy.set()

    with Monitor(cluster.database_url) as monitor:
        recovery = threading.Thread(target=recover_after_two_failed_probes, args=(monitor,))
        recovery.start()
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(work, cluster.workers()))
        healthy.set()
        recovery.join()
        time.sleep(0.5)

    watch = monitor.watch
    print(f"\ncircuit: {watch.samples} samples, states {watch.states}, "
          f"{watch.failed_when_opened} failed attempts when it opened, "
          f"{len(watch.opened_at)} openings, most probes out while open "
          f"{watch.most_probes_while_open}")
    assert unexpected == []
    assert sorted(completed) == sorted(ids)  # every job completed, each once
    assert watch.failed_when_opened is not None
    assert watch.failed_when_opened >= CONFIG.min_attempts  # opened after min_attempts
    assert watch.most_probes_while_open <= 1
    assert watch.over_the_wave == []
    assert circuit.HALF_OPEN in watch.states
    state = cluster.admin().request("GET", "/types/pdf").json()["circuit_state"]
    assert state["state"] in (circuit.HALF_OPEN, circuit.CLOSED)
    # A closed circuit shows no opener (its opened_by is null): the cause is asked of the
    # half-open one only.
    assert state["state"] == "closed" or "ConnectionRefusedError" in state["opened_by"]["sample"]
    assert server_errors(cluster.clients) == {}
