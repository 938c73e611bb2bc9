"""Waking claims that wait for work (`wait_seconds`, like SQS long polling).

A job enqueued by this process wakes its waiting claims at once through a condition
variable. Jobs enqueued by other gunicorn workers or other hosts, and delayed jobs coming
due, are noticed by a cheap indexed peek every POLL_SECONDS, which works the same on SQLite
and PostgreSQL and needs no connection held while waiting.
"""

from __future__ import annotations

import threading

POLL_SECONDS = 0.05


class JobSignal:
    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._generation = 0

    @property
    def generation(self) -> int:
        return self._generation

    def notify(self) -> None:
        """A job may have become claimable in this process."""
        with self._condition:
            self._generation += 1
            self._condition.notify_all()

    def wait(self, seen_generation: int, timeout: float) -> bool:
        """Wait until notified after `seen_generation`, or the timeout. True when notified."""
        with self._condition:
            return self._condition.wait_for(lambda: self._generation != seen_generation,
                                            timeout=timeout)
