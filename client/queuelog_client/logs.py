"""Where the client's log lines go when the program running a Worker configured no logging.

A library leaves logging to its program; but `Worker(...).run()` is a program's whole main
loop, and a worker that says nothing (not even that it started, or that a job was cancelled
on request) looks hung. So while a worker runs in a program whose root logger has no
handler, the "queuelog_client" logger writes its INFO lines to stderr itself, in the form
`queuelog worker` (which configures logging) prints them. A program that configures
logging, before or while the worker runs, decides alone: nothing is printed twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

LOGGER = "queuelog_client"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_lock = threading.Lock()
_users = 0
_handler: logging.Handler | None = None
_level_before = logging.NOTSET


class _WhileUnconfigured(logging.Filter):
    """Passes records only while the program has configured no logging of its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not logging.getLogger().handlers


@contextmanager
def stderr_unless_configured() -> Iterator[None]:
    """While the block runs: the client's INFO lines on stderr, unless the program logs
    through handlers of its own (on the root logger, or on "queuelog_client"). Workers
    running at once in one process share one handler."""
    global _users, _handler, _level_before
    package = logging.getLogger(LOGGER)
    with _lock:
        if _users == 0 and not logging.getLogger().handlers and not package.handlers:
            _handler = logging.StreamHandler()
            _handler.setFormatter(logging.Formatter(FORMAT))
            _handler.addFilter(_WhileUnconfigured())
            package.addHandler(_handler)
            _level_before = package.level
            if package.level == logging.NOTSET:
                package.setLevel(logging.INFO)
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0 and _handler is not None:
                package.removeHandler(_handler)
                package.setLevel(_level_before)
                _handler = None
