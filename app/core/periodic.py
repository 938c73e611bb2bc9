"""A daemon thread that runs one round of work, waits, and runs it again until stopped: the
one loop behind every background chore of a served process (the maintenance loop, the
schedules' ticker, the stats flusher, the type settings' refresh).

A daemon, so that a process told to exit never waits on it. Its owner's `stop` is
registered to run at the interpreter's exit, and gunicorn's worker_exit hook calls it too:
it lets a round under way end (within `stop_timeout`), then does the owner's last work
(write what is left, give a lock up). A process forked after `start` (gunicorn --preload)
has no thread of its parent's: `start` in the child starts its own.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable


class PeriodicThread:
    """Calls `work` (one round) in a thread of its own, `interval` seconds apart, until `stop`.

    `work` may return how long to wait before the next one (a leader's pace and a
    follower's differ); None keeps `interval`. It must not raise: each round logs and
    carries on past its own failures, so a bad round never ends the thread. With
    `wait_first`, the first round comes after a wait rather than at once.
    """

    def __init__(self, name: str, work: Callable[[], float | None], interval: float, *,
                 wait_first: bool = False, at_exit: Callable[[], object] | None = None,
                 stop_timeout: float = 5.0) -> None:
        self.name = name
        self.interval = interval
        self._work = work
        self._wait_first = wait_first
        self._at_exit = at_exit
        self._stop_timeout = stop_timeout
        self._stopping = threading.Event()
        # Set by wake() (and stop()): the wait between rounds ends early.
        self._nudged = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._start_lock = threading.Lock()

    @property
    def running(self) -> bool:
        """Whether this process's thread runs."""
        thread = self._thread
        return thread is not None and self._pid == os.getpid() and thread.is_alive()

    @property
    def started(self) -> bool:
        """Whether `start` was called in this process (the thread may have ended since)."""
        return self._thread is not None and self._pid == os.getpid()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def start(self) -> None:
        """Start the thread, unless this process started it already."""
        with self._start_lock:
            if self.started:
                return
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
            if self._at_exit is not None:
                atexit.register(self._at_exit)

    def wake(self) -> None:
        """Run the next round now rather than at the end of the wait (or, during a round, as
        soon as it ends)."""
        self._nudged.set()

    def stop(self) -> None:
        """Stop the thread, letting a round under way end (up to `stop_timeout`)."""
        self._stopping.set()
        self._nudged.set()
        if self._at_exit is not None:
            atexit.unregister(self._at_exit)
        thread = self._thread
        if (thread is not None and self._pid == os.getpid()
                and thread is not threading.current_thread()):
            thread.join(self._stop_timeout)

    def _pause(self, seconds: float) -> bool:
        """Wait `seconds` or until woken; True when the thread is to stop."""
        if self._nudged.wait(seconds):
            self._nudged.clear()  # a wake after this runs one more round: none is lost
        return self._stopping.is_set()

    def _run(self) -> None:
        if self._wait_first and self._pause(self.interval):
            return
        while not self._stopping.is_set():
            wait = self._work()
            if self._pause(self.interval if wait is None else wait):
                return
