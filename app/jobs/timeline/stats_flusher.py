"""The thread that writes a process's stats counts (stats_buffer.py) once a second.

Started where the app is served (wsgi.py, and the push dispatcher's process), never by the
factory: tests and operator commands run no thread of their own, and what they counted is
written when the stats are read or when the app's services close (Services.close). A
database outage is logged once and the flush tried again each second; stop() writes what is
left (gunicorn's worker_exit hook, and at the interpreter's exit).
"""

from __future__ import annotations

import logging

from sqlalchemy.exc import SQLAlchemyError

from app.core.periodic import PeriodicThread
from app.jobs.timeline.stats_buffer import StatsBuffer

log = logging.getLogger(__name__)

FLUSH_SECONDS = 1.0
# How long stop() waits for a flush under way to end (its transaction commits or not).
STOP_TIMEOUT_SECONDS = 5.0


class StatsFlusher:
    def __init__(self, buffer: StatsBuffer, interval: float = FLUSH_SECONDS) -> None:
        self.buffer = buffer
        self.interval = interval
        self._failing = False
        self._thread = PeriodicThread("queuelog-stats", self.flush, interval, wait_first=True,
                                      at_exit=self.stop, stop_timeout=STOP_TIMEOUT_SECONDS)

    def start(self) -> StatsFlusher:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, letting a flush under way end, then write what is left (what
        cannot be written then is lost, and logged)."""
        self._thread.stop()
        try:
            self.buffer.flush()
        except SQLAlchemyError as exc:
            log.warning("stats: the last counts of this process could not be written (%s)",
                        type(exc).__name__)

    @property
    def running(self) -> bool:
        return self._thread.running

    def flush(self) -> None:
        """One round: write what is kept; log once per outage (the counts wait for the
        next round)."""
        try:
            self.buffer.flush()
        except SQLAlchemyError as exc:
            if not self._failing:
                log.warning("stats: the database did not take this process's counts (%s); "
                            "retrying every %.1f s", type(exc).__name__, self.interval)
            self._failing = True
        except Exception:
            log.exception("stats: writing this process's counts failed; retrying")
        else:
            if self._failing:
                log.warning("stats: the database takes this process's counts again")
                self._failing = False
