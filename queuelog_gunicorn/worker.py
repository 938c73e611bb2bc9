"""A gthread worker that gives a thread a connection only once a whole request has arrived.

gunicorn's own gthread worker hands a new connection to a thread as soon as a byte arrives;
the thread then reads the rest of the request with blocking reads, for as long as the client
takes. A few dozen clients that send a request line and one header, then nothing, hold every
thread of every worker, and the service stops answering anyone (/healthz included). A read
timeout would only bound how long each of them holds its thread.

This worker reads requests in its event loop instead, as nginx and waitress do: every
connection's bytes go into a buffer of its own, and only when the buffer holds a whole
request (the head, and the body by Content-Length or chunked encoding; see framing.py) is the
connection handed to a thread, whose parser then reads that buffer and never the socket. A
request not whole within REQUEST_DEADLINE_SECONDS of its connection's opening (or, on a
kept-alive connection, of its first byte) is dropped, connection and all. What a connection
may hold is bounded: gunicorn's head limits, and the application's body cap (a body beyond it
is handed over cut, for the application's 413, and the connection then closes).

Everything else is gthread's: the thread pool, keep-alive in the poller, graceful shutdown,
max_requests. This class leans on gthread's internals (gunicorn/workers/gthread.py), so
setup.cfg pins the gunicorn releases it was written against.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import selectors
import socket
import time
from concurrent.futures import Future
from functools import partial
from typing import Any

from gunicorn.errors import ConfigError
from gunicorn.http.parser import RequestParser
from gunicorn.workers.gthread import STOP_KEEPALIVE_LINGER, TConn, ThreadWorker

from queuelog_gunicorn.framing import Limits, RequestProgress, Verdict

# The bound on a slow client (docs/OPERATIONS.md, Slow clients): a request not whole by
# then is dropped.
REQUEST_DEADLINE_SECONDS = 10.0
# QUEUELOG_MAX_CONTENT_LENGTH's default, as app/config.py has it (a test keeps them equal);
# this module must not import the app to read it.
DEFAULT_MAX_CONTENT_LENGTH = 1024 * 1024
RECEIVE_SIZE = 64 * 1024
# How long, and how many bytes, a closing connection is read for (gunicorn's own figures).
LINGER_SECONDS = 2.0
LINGER_BYTES = 64 * 1024
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def max_content_length(environ: Any = os.environ) -> int:
    raw = environ.get("QUEUELOG_MAX_CONTENT_LENGTH", "").strip()
    # A value the application refuses stops it at start, with its own message.
    return int(raw) if raw.isdigit() else DEFAULT_MAX_CONTENT_LENGTH


class ArrivedBytes:
    """What has arrived on a connection and gunicorn's parser has not read yet. The parser
    reads it through recv(), as it would a socket; when it is empty recv() answers b"", the
    end of the stream, so a parser that wants more than arrived stops instead of waiting."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.ran_dry = False  # the parser asked for more than had arrived

    def recv(self, size: int) -> bytes:
        if not self.data:
            self.ran_dry = True
            return b""
        piece = bytes(self.data[:size])
        del self.data[:size]
        return piece

    def unread(self, data: bytes) -> None:
        self.data[:0] = data


class ProblemAnswer:
    """The client's socket as gunicorn's handle_error writes to it: the HTML page gunicorn
    answers with when it refuses a request itself (a request line or headers too long, a
    malformed request, an error it caught) becomes an RFC 9457 problem with the same status,
    as every other answer of the API. Everything but the write goes to the socket itself."""

    def __init__(self, sock: socket.socket, cfg: Any) -> None:
        self._sock = sock
        self._cfg = cfg

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(problem_in_place_of(data, self._cfg))


def problem_in_place_of(page: bytes, cfg: Any) -> bytes:
    """The whole answer (status line, headers, problem body) for gunicorn's error page."""
    # Imported here, in a worker, which has loaded the app anyway: the master, which loads
    # this module, must not (see queuelog_gunicorn/__init__.py). The problems' titles and
    # types are app/web/problems.py's.
    from app.web.problems import PROBLEM_CONTENT_TYPE, problem_type_for_status

    status_line = page.split(b"\r\n", 1)[0].decode("latin-1")
    _, code, reason = [*status_line.split(" ", 2), "", ""][:3]
    status = int(code) if code.isdigit() else 400
    kind = problem_type_for_status(status, reason or "Error")
    details = {
        414: f"The request line is longer than {cfg.limit_request_line} bytes.",
        431: (f"The request has more than {cfg.limit_request_fields} header fields, or one "
              f"longer than {cfg.limit_request_field_size} bytes."),
        500: "The server failed to answer this request.",
    }
    # gunicorn's own message may quote the request back: it is logged, not answered.
    detail = details.get(status, "The request is not HTTP/1.1 this server accepts.")
    body = json.dumps({"type": kind.uri, "title": kind.title, "status": status,
                       "detail": detail}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
            f"Content-Type: {PROBLEM_CONTENT_TYPE}\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode("latin-1") + body


class BufferedConn(TConn):  # type: ignore[misc]
    """A gthread connection whose parser reads what the event loop buffered."""

    def __init__(self, cfg: Any, sock: socket.socket, client: Any, server: Any) -> None:
        super().__init__(cfg, sock, client, server)
        self.arrived = ArrivedBytes()
        self.parser = RequestParser(cfg, self.arrived, client)
        self.initialized = True  # gthread's init() would set up TLS or HTTP/2: refused below
        self.data_ready = True  # gthread's handle() must not wait for the socket
        self.progress: RequestProgress | None = None
        self.cut = False
        self.discarded = 0  # bytes read and dropped while closing


class BufferingThreadWorker(ThreadWorker):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = Limits.of_gunicorn(self.cfg, max_content_length())
        # Connections whose request is arriving, with their deadlines, oldest first (every
        # deadline is its insertion time plus the same delay).
        self.arriving: dict[BufferedConn, float] = {}
        # Connections closing after their last response, likewise.
        self.lingering: dict[BufferedConn, float] = {}

    @classmethod
    def check_config(cls, cfg: Any, log: Any) -> None:
        super().check_config(cfg, log)
        # The buffer holds the bytes of the wire: TLS records or HTTP/2 frames would need
        # their own framing. TLS ends at the proxy in front.
        if cfg.is_ssl or cfg.http2_cleartext != "off" or cfg.protocol != "http":
            raise ConfigError(f"{cls.__name__} serves plain HTTP/1.x only: no certfile, "
                              "http2_cleartext or protocol settings")

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        # gunicorn's own mapping of errors to statuses, and its log lines; the answer a
        # problem (ProblemAnswer).
        super().handle_error(req, ProblemAnswer(client, self.cfg), addr, exc)

    # -- the event loop: read until a request is whole ----------------------------------------

    def accept(self, listener: socket.socket) -> None:
        try:
            sock, client = listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        conn = BufferedConn(self.cfg, sock, client, listener.getsockname())
        self._await_request(conn)

    def on_client_socket_readable(self, conn: BufferedConn, client: socket.socket) -> None:
        """A kept-alive connection's next request begins: its deadline starts now."""
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        self._await_request(conn, readable=True)

    def _await_request(self, conn: BufferedConn, readable: bool = False) -> None:
        conn.progress = RequestProgress(self.limits)
        conn.cut = False
        self.arriving[conn] = time.monotonic() + REQUEST_DEADLINE_SECONDS
        # Whole already (pipelined, or in the bytes that made the socket readable): no need to
        # watch the socket at all.
        if conn.arrived.data and self._judge(conn):
            return
        if readable and self._receive(conn):
            return
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn))

    def _on_readable(self, conn: BufferedConn, _sock: Any) -> None:
        if self._receive(conn):
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.poller.unregister(conn.sock)

    def _receive(self, conn: BufferedConn) -> bool:
        """Read what has arrived; True once the connection is handed over or closed."""
        while True:
            try:
                data = conn.sock.recv(RECEIVE_SIZE)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                data = b""
            if not data:
                self._drop(conn)  # closed before its request was whole
                return True
            conn.arrived.data += data
            if self._judge(conn):
                return True
            if len(data) < RECEIVE_SIZE:
                return False  # the socket is drained: wait for the poller

    def _judge(self, conn: BufferedConn) -> bool:
        """Hand the request over, close, or wait; True unless waiting."""
        assert conn.progress is not None
        verdict = conn.progress.check(conn.arrived.data)
        if verdict is Verdict.INCOMPLETE:
            if conn.progress.wants_continue:
                conn.progress.wants_continue = False
                if not self._invite_body(conn):
                    self._drop(conn)
                    return True
            return False
        del self.arriving[conn]
        if verdict is Verdict.REFUSE:
            self._drop(conn)
        else:
            conn.cut = conn.progress.cut
            conn.progress = None
            self.enqueue_req(conn)
        return True

    def _invite_body(self, conn: BufferedConn) -> bool:
        """Answer "100 Continue" to a client that waits for it before sending its body (the
        thread would, once the application reads the body: too late here). False when the
        socket cannot take those few bytes at once."""
        sock: socket.socket = conn.sock
        try:
            return sock.send(CONTINUE) == len(CONTINUE)
        except OSError:
            return False

    def _drop(self, conn: BufferedConn) -> None:
        self.arriving.pop(conn, None)
        self.lingering.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(conn.sock)
        self.nr_conns -= 1
        conn.close()

    def murder_pending(self) -> None:
        """Also close the connections whose request missed its deadline, and those whose
        lingering close is over (gthread's run loop calls this at least once a second, during
        graceful shutdown too)."""
        super().murder_pending()
        now = time.monotonic()
        for waiting in (self.arriving, self.lingering):
            while waiting:
                conn, deadline = next(iter(waiting.items()))
                if deadline > now:
                    break
                self._drop(conn)

    # -- closing after a response -------------------------------------------------------------

    def _close_after_response(self, conn: BufferedConn) -> None:
        """Send FIN, then read and discard what the client still sends until it closes too,
        for LINGER_SECONDS at most: closing a socket with unread bytes would make the kernel
        send a reset, which can destroy the response on its way (e.g. a 413 while the client
        is still sending the body). gthread does this with blocking reads in the event loop,
        where a client that neither sends nor closes would stall every connection."""
        try:
            conn.sock.setblocking(False)
            conn.sock.shutdown(socket.SHUT_WR)
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._discard, conn))
        except (OSError, ValueError, KeyError):
            self._drop(conn)
            return
        self.lingering[conn] = time.monotonic() + LINGER_SECONDS

    def _discard(self, conn: BufferedConn, _sock: Any = None) -> None:
        try:
            data = conn.sock.recv(RECEIVE_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        conn.discarded += len(data)
        if not data or conn.discarded > LINGER_BYTES:
            self._drop(conn)

    # -- a thread serves the request, then the connection comes back ---------------------------

    def handle_request(self, req: Any, conn: BufferedConn) -> bool:
        # The body is here already (or refused): a "100 Continue" would come too late.
        req._expected_100_continue = False
        if conn.cut:
            req.force_close()  # the rest of the refused body is still on its way
        return bool(super().handle_request(req, conn))

    def finish_request(self, conn: BufferedConn, fs: Future[Any]) -> None:
        try:
            keep = not fs.cancelled() and fs.result() is True
        except Exception:
            keep = False
        # A parser that ran dry met a request it refused or a body cut short: where the next
        # request starts is unknown.
        if not keep or conn.arrived.ran_dry:
            self._close_after_response(conn)
            return
        try:
            conn.sock.setblocking(False)
            # What the parser read ahead is the start of the next request.
            conn.arrived.unread(conn.parser.unreader.take_buffered())
            if conn.arrived.data:
                self._await_request(conn)
                return
            conn.set_timeout()
            if not self.alive:
                conn.timeout = min(conn.timeout, time.monotonic() + STOP_KEEPALIVE_LINGER)
            self.keepalived_conns.append(conn)
            self.poller.register(conn.sock, selectors.EVENT_READ,
                                 partial(self.on_client_socket_readable, conn))
        except Exception:
            self._drop(conn)
