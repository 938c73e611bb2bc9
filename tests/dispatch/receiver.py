"""A real receiving endpoint on loopback for push tests and the benchmark: a threaded HTTP
server that records each delivery (a POST) or reservation check (a GET) and answers as its
`answer` function says."""

from __future__ import annotations

import http.server
import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from queuelog_client import verify_signature


@dataclass
class Received:
    job_id: int
    attempt: int
    body: dict[str, Any]
    headers: dict[str, str]
    verified: bool
    at: float  # time.monotonic()
    method: str = "POST"
    query: str = ""  # a check's raw query string (what its signature covers)


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


Answer = Callable[[Received], Reply]


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    # The standard library's backlog of 5 resets connections when a dispatcher opens its
    # 16 at once; a production server's is far larger.
    request_queue_size = 256

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A dispatcher that timed out hangs up before the answer is written (the timeout
        # tests make it do so). Its handler thread may outlive the receiver and the test, and
        # the standard library would print the traceback on whatever sys.stderr is then,
        # inside a later test's captured output.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class Receiver:
    def __init__(self, secret: str = "", answer: Answer | None = None,
                 record: bool = True) -> None:
        self.secret = secret
        self.answer: Answer = answer or (lambda _r: Reply())
        self.record = record
        self.received: list[Received] = []
        self.lock = threading.Lock()
        self.running = 0  # requests being answered now
        self.max_running = 0
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                receiver._handle(self, raw)

            def do_GET(self) -> None:
                receiver._handle(self, b"", query=self.path.partition("?")[2])

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def _handle(self, handler: http.server.BaseHTTPRequestHandler, raw: bytes,
                query: str | None = None) -> None:
        headers = {name: value for name, value in handler.headers.items()}
        # A check signs its query as a delivery signs its body.
        signed = raw if query is None else query.encode("ascii")
        verified = bool(self.secret) and verify_signature(
            self.secret, headers.get("Queuelog-Signature"), signed,
            job_id=headers.get("Queuelog-Job-Id", ""),
            attempt=headers.get("Queuelog-Attempt", ""))
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        received = Received(int(headers.get("Queuelog-Job-Id") or 0),
                            int(headers.get("Queuelog-Attempt") or 0), body, headers, verified,
                            time.monotonic(), "POST" if query is None else "GET", query or "")
        with self.lock:
            if self.record:
                self.received.append(received)
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        try:
            reply = self.answer(received)
            if reply.delay:
                time.sleep(reply.delay)
        finally:
            with self.lock:
                self.running -= 1
        handler.send_response(reply.status)
        for name, value in reply.headers.items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(reply.body)))
        handler.end_headers()
        handler.wfile.write(reply.body)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def of_job(self, job_id: int) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.job_id == job_id]


class Trickler:
    """A receiver that reads each request and answers 200 with its `answer` bytes (status
    line, headers and body) sent `chunk` bytes at a time, `every` seconds apart: from the
    first byte (`headers_too`) or after the headers (a 45-byte body trickled). Each
    connection it served is counted in `connections`, and `finished` those whose whole
    answer it managed to send."""

    def __init__(self, *, headers_too: bool, every: float = 1.0, chunk: int = 1) -> None:
        body = b'{"ok": true, "note": "sent one byte a second"}'[:45]
        head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        self.quick, self.slow = (b"", head + body) if headers_too else (head, body)
        self.every, self.chunk = every, chunk
        self.connections = 0
        self.finished = 0
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                _read_request(conn)
                conn.sendall(self.quick)
                for at in range(0, len(self.slow), self.chunk):
                    if self.stopping.wait(self.every):
                        return
                    conn.sendall(self.slow[at:at + self.chunk])
            except OSError:
                return  # the dispatcher gave up on it: what the tests want
            with self.lock:
                self.finished += 1

    def __enter__(self) -> Trickler:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stopping.set()
        self.listener.close()


def _read_request(conn: socket.socket) -> bytes:
    """One HTTP request: its headers, then Content-Length bytes of body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            raise OSError("closed before the request's end")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            raise OSError("closed before the request's end")
        body += chunk
    return head + b"\r\n\r\n" + body
