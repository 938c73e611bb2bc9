"""Handlers the worker tests run, importable as tests.client.handlers:NAME."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from queuelog_client import RetryLater

Job = dict[str, Any]


def succeed(job: Job) -> dict[str, Any]:
    return {"handled": job["id"], "payload": job["payload"]}


def explode(job: Job) -> dict[str, Any]:
    raise ValueError(f"cannot handle {job['payload'].get('what', 'this job')}")


def retry_once(job: Job) -> dict[str, Any]:
    """Asks for a retry on its first attempt, succeeds on the next."""
    if job["retry_count"] == 0:
        raise RetryLater(0, "the mail server said 421, try again")
    return {"attempt": job["retry_count"] + 1}


def return_a_list(job: Job) -> Any:
    return [job["id"]]


def pause(job: Job) -> dict[str, Any]:
    time.sleep(job["payload"].get("seconds", 0.1))
    return {"handled": job["id"]}


def slow_first_attempt(job: Job) -> dict[str, Any]:
    """The first attempt outlives any short lease; later attempts return at once."""
    if job["retry_count"] == 0:
        time.sleep(job["payload"]["seconds"])
    return {"attempt": job["retry_count"] + 1}


def announce_then_sleep(job: Job) -> dict[str, Any]:
    """Creates the file named by payload["started"] (the test's cue), then sleeps."""
    Path(job["payload"]["started"]).touch()
    time.sleep(job["payload"]["seconds"])
    return {"slept": job["payload"]["seconds"]}


def rendezvous(parties: int, timeout: float = 20.0) -> Any:
    """A handler that returns only once `parties` jobs are inside it at the same time:
    proof that they run concurrently, with no clock involved."""
    barrier = threading.Barrier(parties, timeout=timeout)

    def meet(job: Job) -> dict[str, Any]:
        barrier.wait()
        return {"met": parties}

    return meet
