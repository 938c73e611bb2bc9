"""One JSON line per request on stdout, the X-Request-ID header, and the latency histogram.

A line holds when the request started, its method, route (the URL rule), path, status,
duration, request id and the name of the key that made it. Never a token, a body, a query
string or an error's text: those can carry secrets and customer data.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any, TextIO

from flask import Flask, Response, g, request

from app.ops.metrics import UNMATCHED_ROUTE, QueueMetrics

REQUEST_LOGGER = "queuelog.request"
REQUEST_ID_HEADER = "X-Request-ID"
MAX_REQUEST_ID_LENGTH = 128
MAX_LOGGED_PATH_LENGTH = 256
# What may pass from a caller's X-Request-ID into our logs and headers: the characters of
# UUIDs, trace ids and the usual "svc:host/123" forms. Anything else is dropped.
_REQUEST_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._:/+=@-]")


def request_id_from(header: str | None) -> str:
    """The caller's request id, sanitised and bounded, or a new one when none is usable."""
    if header:
        cleaned = _REQUEST_ID_UNSAFE.sub("", header)[:MAX_REQUEST_ID_LENGTH]
        if cleaned:
            return cleaned
    return uuid.uuid4().hex


def rfc3339(seconds: float) -> str:
    # isoformat of the naive UTC time: strftime's format, several times cheaper per line.
    moment = datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)
    return moment.isoformat(timespec="microseconds") + "Z"


class JsonLineFormatter(logging.Formatter):
    """A record as one compact JSON object: the request's fields when it carries them."""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "request_fields", None)
        if fields is None:
            fields = {"time": rfc3339(record.created), "message": record.getMessage()}
        line = {"level": record.levelname.lower(), "logger": record.name, **fields}
        # ASCII only: a path with control or odd characters stays one readable line.
        return json.dumps(line, separators=(",", ":"), ensure_ascii=True, default=str)


class StdoutHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stdout is when a line is written, not when the handler was made
    (test runners swap sys.stdout per test)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> TextIO:
        return sys.stdout

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def request_logger() -> logging.Logger:
    """The request logger, given its stdout handler once per process."""
    logger = logging.getLogger(REQUEST_LOGGER)
    if not any(isinstance(handler, StdoutHandler) for handler in logger.handlers):
        handler = StdoutHandler()
        handler.setFormatter(JsonLineFormatter())
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        # Its own stream only: the root logger (gunicorn's error log) does not repeat it.
        logger.propagate = False
    return logger


def init_request_log(app: Flask, metrics: QueueMetrics) -> None:
    logger = request_logger()

    @app.before_request
    def start_request() -> None:
        g.request_started = time.perf_counter()
        g.request_started_at = time.time()
        g.request_id = request_id_from(request.headers.get(REQUEST_ID_HEADER))

    @app.after_request
    def finish_request(response: Response) -> Response:
        started = g.get("request_started")
        duration = 0.0 if started is None else time.perf_counter() - started
        request_id = g.get("request_id") or request_id_from(None)
        response.headers[REQUEST_ID_HEADER] = request_id
        rule = request.url_rule
        route = None if rule is None else rule.rule
        metrics.observe_request(request.method, route or UNMATCHED_ROUTE,
                                response.status_code, duration)
        caller = g.get("caller")
        if logger.isEnabledFor(logging.INFO):
            logger.info("request", extra={"request_fields": {
                "time": rfc3339(g.get("request_started_at") or time.time()),
                "request_id": request_id,
                "method": request.method[:16],
                "route": route,
                "path": request.path[:MAX_LOGGED_PATH_LENGTH],
                "status": response.status_code,
                "duration_ms": round(duration * 1000, 3),
                "key_name": None if caller is None else caller.name,
            }})
        return response
