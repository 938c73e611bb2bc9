"""A TCP forwarder on loopback that a test can cut and restore, standing for a database
server that goes away and comes back, or that loses one answer on its way back."""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._lose_marker: bytes | None = None
        self.answers_lost = 0

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        """Refuse new connections and cut every open one."""
        with self._lock:
            if self._listener is not None:
                # shutdown wakes the thread blocked in accept(); close alone would not.
                with contextlib.suppress(OSError):
                    self._listener.shutdown(socket.SHUT_RDWR)
                self._listener.close()
                self._listener = None
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()

    def lose_answer_to(self, marker: bytes) -> None:
        """The next request whose first bytes hold `marker` reaches the server; its answer is
        dropped, and the connection cut, as soon as the answer starts coming back."""
        with self._lock:
            self._lose_marker = marker

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            lose = threading.Event()  # set when this connection's next answer is to be lost
            threading.Thread(target=self._pipe, args=(client, upstream, lose, False),
                             daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, lose, True),
                             daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, lose: threading.Event,
              answers: bool) -> None:
        try:
            while data := source.recv(65536):
                if answers and lose.is_set():
                    self._cut(source, sink)
                    return
                if not answers:
                    self._mark_if_to_be_lost(data, lose)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

    def _mark_if_to_be_lost(self, request: bytes, lose: threading.Event) -> None:
        with self._lock:
            if self._lose_marker is not None and self._lose_marker in request:
                self._lose_marker = None
                lose.set()

    def _cut(self, upstream: socket.socket, client: socket.socket) -> None:
        with self._lock:
            self.answers_lost += 1
        for sock in (client, upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
