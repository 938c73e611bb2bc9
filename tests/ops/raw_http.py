"""HTTP/1.1 spoken by hand on a socket, for tests that need to control each byte a server
receives (half-open requests, trickled bodies, pipelining, 100 Continue)."""

from __future__ import annotations

import json
import select
import socket
from dataclasses import dataclass
from typing import Any

HOST = "127.0.0.1"


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class RawConnection:
    """One client connection; what it reads beyond a response stays for the next."""

    def __init__(self, port: int, timeout: float = 30) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.pending = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed by the server after {self.pending!r}")
        self.pending += chunk

    def read_head(self) -> bytes:
        """The next head (status line and fields) the server sent, a 1xx one included."""
        while b"\r\n\r\n" not in self.pending:
            self._fill()
        head, _, self.pending = self.pending.partition(b"\r\n\r\n")
        return head

    def read_response(self) -> RawResponse:
        head = self.read_head()
        lines = head.split(b"\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower().decode()] = value.strip().decode()
        length = int(headers.get("content-length", "0"))
        while len(self.pending) < length:
            self._fill()
        body, self.pending = self.pending[:length], self.pending[length:]
        return RawResponse(int(lines[0].split(b" ", 2)[1]), headers, body)

    def closed_by_server(self, within: float) -> bool:
        """True once the server has closed the connection (end of stream or reset), false if
        it is still open after `within` seconds; fails on any bytes it sends instead."""
        readable, _, _ = select.select([self.sock], [], [], within)
        if not readable:
            return False
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            return True
        assert data == b"", f"the server answered instead of closing: {data[:200]!r}"
        return True

    def close(self) -> None:
        self.sock.close()


def request_bytes(method: str, path: str, *, token: str | None = None, body: Any = None,
                  chunked: bool = False, extra: str = "") -> bytes:
    """A whole request, its body as JSON (chunked in pieces of 8 bytes when asked)."""
    head = f"{method} {path} HTTP/1.1\r\nHost: {HOST}\r\n{extra}"
    if token is not None:
        head += f"Authorization: Bearer {token}\r\n"
    if body is None:
        return (head + "\r\n").encode()
    data = json.dumps(body).encode()
    head += "Content-Type: application/json\r\n"
    if not chunked:
        return (head + f"Content-Length: {len(data)}\r\n\r\n").encode() + data
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(data[i:i + 8]), data[i:i + 8])
                      for i in range(0, len(data), 8))
    return (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + chunks + b"0\r\n\r\n"
