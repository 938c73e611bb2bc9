"""Long polls end when a gunicorn worker is told to stop.

A claim may wait up to 20 s for work, and a read up to 60 s for its job to finish. gunicorn
stops a worker gracefully on SIGTERM (letting its requests finish, up to graceful_timeout)
and quickly on SIGINT and SIGQUIT (whose exit still waits for the threads serving them):
either way the worker, and the port it listens on, would stay until its long polls ran out.
So each stop signal first tells the app to end its waits (its "queuelog_end_waits"
extension, app/jobs/wake/waiting.py): the waiting requests answer at once with what there is (204
for a claim, the job as it is for a read), and the worker exits as soon as gunicorn lets it.

Done through the post_worker_init hook, which runs after the worker installed its own
handlers: each is kept and called after the app was told, so gunicorn's stop is unchanged.
No app import: the app is reached through the worker's loaded application.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
EXTENSION = "queuelog_end_waits"


def end_waits_on_stop(worker: Any) -> None:
    """Make the worker's stop signals end the app's waits before gunicorn's own handling."""
    end_waits: Callable[[], None] | None = getattr(
        getattr(worker, "wsgi", None), "extensions", {}).get(EXTENSION)
    if end_waits is None:
        return
    for signum in STOP_SIGNALS:
        _chain(signum, end_waits)


def _chain(signum: int, end_waits: Callable[[], None]) -> None:
    previous = signal.getsignal(signum)

    def on_stop(received: int, frame: FrameType | None) -> None:
        # A signal handler runs in the main thread between two bytecodes, maybe while it
        # holds a lock the waits' condition variables need: a thread of its own tells them.
        threading.Thread(target=end_waits, name="queuelog-end-waits", daemon=True).start()
        if callable(previous):
            previous(received, frame)

    signal.signal(signum, on_stop)
