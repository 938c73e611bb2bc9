"""A background load for the latency benchmarks: closed-loop clients in a forked process of
their own (off the measuring process's GIL) that keep the server busy while a figure is taken.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any

from bench.data import RESULT, job_body
from bench.load import Client, HttpError

# The load's jobs are of this type (job_body's): whatever is measured beside it asks for others.
LOAD_TYPE = "email"
# The load runs this long before the first sample.
WARM_UP_SECONDS = 1.0


def _load_process(port: int, producer: str, worker: str | None, clients: int, stop: Any,
                  moved: Any, failed: Any) -> None:
    """`clients` threads, each enqueuing a LOAD_TYPE job and (given a worker key) claiming
    one and completing it, until `stop` is set."""

    def cycle(n: int) -> None:
        enqueuer = Client(port, producer)
        claimer = Client(port, worker) if worker is not None else None
        try:
            while not stop.is_set():
                enqueuer.call("POST", "/jobs", job_body(n), expect=(201,))
                if claimer is not None and not _claim_and_complete(claimer):
                    continue
                with moved.get_lock():
                    moved.value += 1
        except Exception:  # counted; the parent fails the run
            with failed.get_lock():
                failed.value += 1
        finally:
            enqueuer.close()
            if claimer is not None:
                claimer.close()

    threads = [threading.Thread(target=cycle, args=(n,), daemon=True) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _claim_and_complete(client: Client) -> bool:
    status, job = client.call("POST", "/jobs/claim", {"types": [LOAD_TYPE]}, expect=(200, 204))
    if status != 200:
        return False
    client.call("POST", f"/jobs/{job['id']}/complete",
                {"lease_token": job["lease_token"], "result": RESULT}, expect=(200,))
    return True


class BackgroundLoad:
    """`clients` closed-loop clients enqueuing LOAD_TYPE jobs for as long as the `with` lasts;
    given a worker key, each also claims a LOAD_TYPE job after its enqueue and completes it."""

    def __init__(self, port: int, producer: str, worker: str | None, clients: int) -> None:
        context = multiprocessing.get_context("fork")
        self.stop = context.Event()
        self.moved = context.Value("q", 0)
        self.failed = context.Value("q", 0)
        self.process = context.Process(target=_load_process, daemon=True, args=(
            port, producer, worker, clients, self.stop, self.moved, self.failed))
        self.started_at, self.started_moved = 0.0, 0

    def __enter__(self) -> BackgroundLoad:
        self.process.start()
        time.sleep(WARM_UP_SECONDS)
        self.started_at, self.started_moved = time.perf_counter(), self.moved.value
        return self

    def jobs_per_second(self) -> float:
        """Jobs through the loop (enqueued, or enqueued, claimed and completed) per second
        since the warm-up."""
        moved: int = self.moved.value - self.started_moved
        return moved / (time.perf_counter() - self.started_at)

    def check(self) -> None:
        if self.failed.value or not self.process.is_alive():
            raise HttpError("the background load failed")

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
