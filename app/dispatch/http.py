"""The dispatcher's HTTP client: one pooled urllib3 PoolManager for every delivery.

Why urllib3 (httpx was the other candidate; docs/PUSH.md, "The HTTP client"): its PoolManager keeps
connections alive per host and is safe to share between the delivery threads, with
`maxsize` connections per host and `block=True`, so a dispatcher never opens more than its
concurrency to one receiver; `Timeout(connect, read)` bounds each socket operation (the one
deadline over all of them is ours: _Deadlines); with `retries=False` it neither retries nor
follows a redirect (a 3xx comes back as the answer).
It is already installed beside queuelog (requests and schemathesis build on it), where
httpx would bring five packages of its own for the same three properties.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import HTTPError, NewConnectionError
from urllib3.exceptions import TimeoutError as OperationTimedOut
from urllib3.util import parse_url

from app.core.redaction import display_url

# Connecting is quick or it is not happening: at most this long (within the timeout).
MAX_CONNECT_SECONDS = 10.0
_CHUNK = 16_384


@dataclass(frozen=True)
class Answer:
    """A receiver's answer: its status, the first bytes of its body (at most the read
    limit; `truncated` when there was more), and its Retry-After header."""

    status: int
    body: bytes
    truncated: bool
    retry_after: str | None


class DeliveryFailed(Exception):
    """No answer: the connection failed, or the time ran out (`timed_out`)."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


@dataclass(frozen=True)
class Endpoint:
    """A push url made ready to send to: credentials taken out into a Basic header."""

    url: str
    authorization: str | None

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parsed = parse_url(url)
        authorization = None
        if parsed.auth is not None:
            user, _, password = parsed.auth.partition(":")
            pair = f"{unquote(user)}:{unquote(password)}".encode()
            authorization = "Basic " + base64.b64encode(pair).decode("ascii")
        bare = parsed._replace(auth=None).url
        return cls(bare, authorization)


class _Deadlines:
    """One thread that cuts off connections whose delivery ran past its deadline.

    urllib3's timeouts bound each socket operation, not their sum: a receiver that sends
    its headers or body a byte at a time, each within the read timeout, holds a delivery
    (and its thread) for as long as it likes. The watcher shuts the connection's socket
    down at the deadline, which wakes whatever send or recv waits on it, whichever phase
    that is; connecting is bounded by the connect timeout, set to the time left.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._watched: dict[int, _Watch] = {}
        self._thread: threading.Thread | None = None

    def watch(self, watch: _Watch) -> None:
        with self._lock:
            self._watched[id(watch)] = watch
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="queuelog-push-deadlines")
                self._thread.start()
            self._lock.notify()

    def unwatch(self, watch: _Watch) -> bool:
        """Stop watching; True when the deadline had already cut the connection."""
        with self._lock:
            self._watched.pop(id(watch), None)
            return watch.expired

    def _run(self) -> None:
        with self._lock:
            while True:
                now = time.monotonic()
                for key, watch in list(self._watched.items()):
                    if watch.deadline <= now:
                        del self._watched[key]
                        watch.expire()
                soonest = min((w.deadline for w in self._watched.values()), default=None)
                self._lock.wait(None if soonest is None else max(0.0, soonest - now))


class _Watch:
    """One delivery under its deadline: the connection it is sending on, once known."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.expired = False
        self.connection: HTTPConnection | None = None

    def expire(self) -> None:
        self.expired = True
        sock = getattr(self.connection, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


# The delivery this thread is sending: how a connection taken from the pool (new or kept
# alive) tells the watcher which socket to cut.
_current = threading.local()


class _WatchedHTTPConnection(HTTPConnection):
    def request(self, *args: Any, **kwargs: Any) -> None:
        _attach(self)
        super().request(*args, **kwargs)


class _WatchedHTTPSConnection(HTTPSConnection):
    def request(self, *args: Any, **kwargs: Any) -> None:
        _attach(self)
        super().request(*args, **kwargs)


def _attach(connection: HTTPConnection) -> None:
    watch: _Watch | None = getattr(_current, "watch", None)
    if watch is not None:
        watch.connection = connection
        if watch.expired:  # the deadline passed while the pool was handing it out
            watch.expire()


class _WatchedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


class _RequestTargetMasking(logging.Filter):
    """urllib3 logs each request's target (path and query) at DEBUG: a push url's query may
    be a signature, so the target is logged in the display form (app/core/redaction.py)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                display_url(f"http://host{arg}")[len("http://host"):]
                if isinstance(arg, str) and arg.startswith("/") else arg
                for arg in record.args)
        return True


_MASKING = _RequestTargetMasking()


class PushClient:
    """POSTs deliveries (and GETs reservations' checks) through one pool; thread-safe."""

    def __init__(self, max_connections_per_host: int) -> None:
        urllib3_log = logging.getLogger("urllib3.connectionpool")
        if _MASKING not in urllib3_log.filters:
            urllib3_log.addFilter(_MASKING)
        self.pool = urllib3.PoolManager(
            num_pools=64, maxsize=max_connections_per_host, block=True, retries=False)
        self.pool.pool_classes_by_scheme = {"http": _WatchedHTTPPool,
                                            "https": _WatchedHTTPSPool}
        self._deadlines = _Deadlines()

    def post(self, endpoint: Endpoint, body: bytes, headers: dict[str, str],
             timeout_seconds: float, max_body_bytes: int) -> Answer:
        """POST `body`; the answer, its body read up to `max_body_bytes` (+1 to tell it was
        longer). Raises DeliveryFailed when no whole answer came within `timeout_seconds`,
        counted once from the start of connecting to the end of reading the body (however
        slowly the receiver sends), or the connection failed."""
        return self._send("POST", endpoint, body, headers, timeout_seconds, max_body_bytes)

    def get(self, endpoint: Endpoint, headers: dict[str, str], timeout_seconds: float,
            max_body_bytes: int) -> Answer:
        """GET, under the same rules as post (a reservation's check, app/dispatch/checks.py)."""
        return self._send("GET", endpoint, None, headers, timeout_seconds, max_body_bytes)

    def _send(self, method: str, endpoint: Endpoint, body: bytes | None,
              headers: dict[str, str], timeout_seconds: float, max_body_bytes: int) -> Answer:
        if endpoint.authorization is not None:
            headers = {**headers, "Authorization": endpoint.authorization}
        watch = _Watch(time.monotonic() + timeout_seconds)
        timeout = urllib3.Timeout(connect=min(MAX_CONNECT_SECONDS, timeout_seconds),
                                  read=timeout_seconds)
        timed_out = DeliveryFailed(f"timed out after {timeout_seconds:g} s waiting for the "
                                   "receiver's whole answer", timed_out=True)
        _current.watch = watch
        self._deadlines.watch(watch)
        response: urllib3.BaseHTTPResponse | None = None
        try:
            try:
                response = self.pool.request(method, endpoint.url, body=body,
                                             headers=headers, timeout=timeout,
                                             preload_content=False, redirect=False,
                                             retries=False)
                data, truncated = self._read(response, watch, max_body_bytes)
            except NewConnectionError as exc:
                # Before TimeoutError: urllib3 makes a refused connection a
                # ConnectTimeoutError too, for compatibility.
                raise DeliveryFailed(f"connection failed: {_reason(exc)}") from None
            except (HTTPError, OSError) as exc:
                # A cut connection surfaces as whatever its phase raises (a reset, an
                # incomplete read, a protocol error): the deadline is what happened.
                if watch.expired or isinstance(exc, OperationTimedOut):
                    raise timed_out from None
                raise DeliveryFailed(f"connection failed: {_reason(exc)}") from None
        finally:
            _current.watch = None
            cut = self._deadlines.unwatch(watch)
            if response is not None:
                if cut:
                    response.close()  # its socket is shut: never back into the pool
                response.release_conn()
        return Answer(response.status, data, truncated, response.headers.get("Retry-After"))

    @staticmethod
    def _read(response: urllib3.BaseHTTPResponse, watch: _Watch,
              limit: int) -> tuple[bytes, bool]:
        """Read up to limit + 1 bytes (the watcher ends a read that runs past the
        deadline)."""
        parts: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = response.read(min(_CHUNK, limit + 1 - size))
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
        if watch.expired:
            raise OperationTimedOut("the deadline cut the answer short")
        data = b"".join(parts)
        if len(data) > limit:
            # The rest is not wanted: the connection cannot be reused with it unread.
            response.close()
            return data[:limit], True
        return data, False


def _reason(exc: BaseException) -> str:
    # urllib3 wraps the cause (refused, reset, name not known); its innermost text says it
    # best. The dispatcher redacts whatever is stored or logged.
    cause = getattr(exc, "reason", None) or exc.__cause__ or exc
    return f"{type(cause).__name__}: {cause}"
