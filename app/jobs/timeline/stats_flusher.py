"""The thread that writes a process's stats counts (stats_buffer.py) once a second.

Started where the app is served (wsgi.py, and the push dispatcher's process), never by the
factory: tests and operator commands run no thread of their own, and what they counted is
written when the stats are read or when the app's services close (Services.close). A
database outage is logged once and the flush tried again each second; stop() writes what is
left (gunicorn's worker_exit hook, and at the interpreter's exit).
"""

from __future__ import annotations

import atexit
import logging
import threading

from sqlalchemy.exc import SQLAlchemyError

from app.jobs.timeline.stats_buffer import StatsBuffer

log = logging.getLogger(__name__)

FLUSH_SECONDS = 1.0
# How long stop() waits for a flush under way to end (its transaction commits or not).
STOP_TIMEOUT_SECONDS = 5.0


class StatsFlusher:
    def __init__(self, buffer: StatsBuffer, interval: float = FLUSH_SECONDS) -> None:
        self.buffer = buffer
        self.interval = interval
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def start(self) -> StatsFlusher:
        if self._thread is None:
            # A daemon, so that a process told to exit never waits on it; stop() (at exit,
            # by gunicorn's worker_exit hook, when the services close) writes what is left.
            self._thread = threading.Thread(target=self._run, name="queuelog-stats",
                                            daemon=True)
            self._thread.start()
            atexit.register(self.stop)
        return self

    def stop(self) -> None:
        """Stop the thread, letting a flush under way end, then write what is left (what
        cannot be written then is lost, and logged)."""
        self._stopping.set()
        thread = self._thread
        if thread is not None:
            atexit.unregister(self.stop)
            if thread is not threading.current_thread():
                thread.join(STOP_TIMEOUT_SECONDS)
        try:
            self.buffer.flush()
        except SQLAlchemyError as exc:
            log.warning("stats: the last counts of this process could not be written (%s)",
                        type(exc).__name__)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stopping.wait(self.interval):
            self.flush()

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
