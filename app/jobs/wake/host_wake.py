"""Waking the requests that wait in this host's other queuelog processes.

A change one gunicorn worker commits (a job enqueued or released, a job finished) wakes the
requests waiting in that process at once (app/jobs/wake/waiting.py's JobSignal), but the requests
waiting in its sibling workers only at their next peek, up to POLL_SECONDS later: with the
default of one worker per core, most wakes cross processes. So each process whose requests
wait binds a Unix datagram socket in a directory of the database's processes on this host,
and a process that commits such a change sends one byte, its kind, to every other socket
there. A socket stays bound while requests wait in its process and for LINGER_SECONDS after
the last, so that a worker polling in a loop keeps one socket.

A datagram carries nothing but a kind: it only makes the receiver's waiters look, as their
peek would. A lost, late or extra one costs a peek at most, and the peek stays the way
changes from other hosts (several servers on one PostgreSQL) are noticed. The directory is
the user's own (mode 0700, checked): nobody else can send into it. Where it cannot be used
(a directory someone else owns, or one too deep for a socket's path even under /tmp),
waiting falls back to the peek alone, with one log line saying why.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import itertools
import logging
import os
import select
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

# sun_path holds 108 bytes on Linux and 104 on macOS, its terminating NUL included.
_SOCKET_PATH_MAX = 100
_SHORT_TEMPORARY_DIRECTORY = "/tmp"  # noqa: S108 - checked as the user's own (0700) before use
# Many datagrams waiting are as good as one: the receiver drains them before it wakes anyone.
_DATAGRAM_BYTES = 16
# How long a process keeps its socket once no request waits in it.
LINGER_SECONDS = 5.0
# How often the receiver looks up from its socket to see whether it may close it.
_IDLE_CHECK_SECONDS = 1.0
# After a bind that failed for want of a resource (EMFILE, ENOSPC, ...), how long waiting
# requests only peek before a wait tries to bind again.
_BIND_RETRY_SECONDS = 60.0
# Each HostWake of a process binds a socket of its own name (a test may run two apps).
_instances = itertools.count(1)
# The directory's mtime says when a process came or went, but in the kernel's coarse ticks
# (4 ms at HZ=250): a socket bound in the tick of the last read leaves the mtime as it was.
# So the list is read again at every send until it was read this long after the last
# change, and in any case this often.
_MTIME_TICK_NS = 50_000_000
_PEERS_MAX_AGE_SECONDS = 1.0


class _NotOwnedAlone(OSError):
    """The wake directory is not this user's alone: another user could send into it."""


def _owned_alone(info: os.stat_result) -> bool:
    return (stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
            and not info.st_mode & 0o077)


def wake_directory(database: str) -> str:
    """The directory of the host's processes that serve `database` (a SQLite file's absolute
    path, or a PostgreSQL URL without its password): one per user and database, in the
    temporary directory, or in /tmp when the temporary directory is too deep for a socket's
    path (a TMPDIR of a test or a service manager's often is): every process of the database
    with that TMPDIR chooses alike."""
    name = f"queuelog-wake-{os.getuid()}-{hashlib.sha256(database.encode()).hexdigest()[:16]}"
    preferred = os.path.join(tempfile.gettempdir(), name)
    if _socket_paths_fit(preferred) or not os.path.isdir(_SHORT_TEMPORARY_DIRECTORY):
        return preferred
    return os.path.join(_SHORT_TEMPORARY_DIRECTORY, name)


def _socket_paths_fit(directory: str) -> bool:
    # The longest name a socket gets: a pid (at most 2**22 on Linux) and an instance.
    return len(os.path.join(directory, f"{2 ** 22}.{10 ** 6}")) <= _SOCKET_PATH_MAX


class HostWake:
    """Sends wakes to this host's other processes of one database, and receives theirs.

    `on_wake(kind, notify)` says what a received kind does here; `send(kind)` tells the other
    processes. Nothing is bound but `watching()` (while a request may wait), so a process
    whose requests never wait costs the senders nothing.
    """

    def __init__(self, directory: str | None) -> None:
        self.directory = directory
        self._handlers: dict[bytes, Callable[[], None]] = {}
        self._lock = threading.Lock()
        # This process's socket's path while it is bound (in `_listening_pid`), and how many
        # requests wait on it.
        self._listening_pid = 0
        self._own_path: str | None = None
        self._watchers = 0
        self._idle_since = 0.0
        self._exit_registered = False
        self._sender: socket.socket | None = None
        self._sender_pid = 0
        # The other processes' sockets, read again whenever the directory changes.
        self._peers: tuple[str, ...] = ()
        self._peers_version = -1
        self._peers_read_at = 0.0
        self._peers_read_ns = 0
        # Why this process neither sends nor receives (said once, at the first wait), if so:
        # no directory, or one no socket's path fits in, or one this user does not own alone.
        self._refused: str | None = None
        if directory is not None and not _socket_paths_fit(directory):
            self._refused = (f"the path of {directory} is too long for a socket's: set "
                             "TMPDIR to a shorter directory")
        self._refusal_said = False
        # A bind that failed for want of a resource stops receiving, not sending, for a while.
        self._bind_again_at = 0.0

    @property
    def listener_lock_path(self) -> str | None:
        """The file whose flock makes one process of this host the database's listener
        (app/storage/listener.py): beside the directory, which the last process out removes,
        and named apart from it."""
        if self.directory is None:
            return None
        parent, name = os.path.split(self.directory)
        return os.path.join(parent, name.replace("queuelog-wake-", "queuelog-listener-") + ".lock")

    def on_wake(self, kind: str, notify: Callable[[], None]) -> None:
        self._handlers[kind.encode()] = notify

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """While a request may wait: this process's socket bound, receiving the others' wakes."""
        with self._lock:
            self._watchers += 1
            self._listen()
        try:
            yield
        finally:
            with self._lock:
                self._watchers -= 1
                self._idle_since = time.monotonic()

    def keep_listening(self) -> None:
        """Bind this process's socket for good (while the process lives): for a process the
        host's database listener tells (app/jobs/wake/database_wake.py), whose background
        work waits for wakes too."""
        with self._lock:
            self._watchers += 1
            self._listen()

    def _listen(self) -> None:
        """Bind this process's socket and start its receiver, unless bound already."""
        if self.directory is None or self._listening_pid == os.getpid():
            return
        if self._refused is not None:
            self._say_refusal()
            return
        if time.monotonic() < self._bind_again_at:
            return
        try:
            try:
                receiver = self._bind()
            except FileNotFoundError:  # the last process out removed the directory meanwhile
                receiver = self._bind()
        except _NotOwnedAlone as refusal:
            self._refused = str(refusal)
            self._say_refusal()
            return
        except OSError as error:
            self._bind_again_at = time.monotonic() + _BIND_RETRY_SECONDS
            log.warning("waiting requests will notice other processes' changes by polling "
                        "for %.0f s: %s", _BIND_RETRY_SECONDS, error)
            return
        self._listening_pid = os.getpid()
        threading.Thread(target=self._receive, args=(receiver,), daemon=True,
                         name="queuelog-host-wake").start()

    def _say_refusal(self) -> None:
        if not self._refusal_said:
            self._refusal_said = True
            log.warning("waiting requests will notice other processes' changes by polling "
                        "only: %s", self._refused)

    def send(self, kind: str) -> None:
        """Tell the other processes' waiting requests that `kind` happened."""
        if self.directory is None or self._refused is not None:
            return
        try:
            info = os.lstat(self.directory)
        except FileNotFoundError:
            return  # no process has listened yet
        if not _owned_alone(info):
            self._refused = f"{self.directory} is not a directory of this user's alone"
            return  # a process that waits says it
        version = info.st_mtime_ns
        if (version != self._peers_version
                or self._peers_read_ns - version < _MTIME_TICK_NS
                or time.monotonic() - self._peers_read_at > _PEERS_MAX_AGE_SECONDS):
            self._read_peers(version)
        sender = self._sending_socket()
        message = kind.encode()
        for path in self._peers:
            try:
                sender.sendto(message, path)
            except BlockingIOError:
                pass  # its queue is full: it has wakes to read already
            except ConnectionRefusedError:
                self._forget(path)  # left by a process that died without removing it
            except OSError:
                pass  # gone meanwhile; the next change re-reads the directory

    def _bind(self) -> socket.socket:
        assert self.directory is not None
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        if not _owned_alone(os.lstat(self.directory)):
            raise _NotOwnedAlone(f"{self.directory} is not a directory of this user's alone")
        path = os.path.join(self.directory, f"{os.getpid()}.{next(_instances)}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a dead process's, whose pid this one now has
        receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            receiver.bind(path)
        except OSError:
            receiver.close()
            raise
        if not self._exit_registered:
            atexit.register(self._leave_at_exit)
            self._exit_registered = True
        self._own_path = path
        return receiver

    def _receive(self, receiver: socket.socket) -> None:
        readable = select.poll()
        readable.register(receiver, select.POLLIN)
        while True:
            if not readable.poll(_IDLE_CHECK_SECONDS * 1000):
                if self._closed_when_idle(receiver):
                    return
                continue
            kinds = set()
            while True:  # all that is queued, so that one wake answers them all
                try:
                    kinds.add(receiver.recv(_DATAGRAM_BYTES, socket.MSG_DONTWAIT))
                except BlockingIOError:
                    break
                except OSError as error:
                    log.warning("stopped receiving other processes' wakes: %s", error)
                    return
            for kind in kinds:
                handler = self._handlers.get(kind)
                if handler is not None:
                    handler()

    def _closed_when_idle(self, receiver: socket.socket) -> bool:
        """Close the socket if no request has waited for LINGER_SECONDS."""
        with self._lock:
            if self._watchers or time.monotonic() - self._idle_since < LINGER_SECONDS:
                return False
            self._listening_pid = 0
            path, self._own_path = self._own_path, None
        receiver.close()
        if path is not None:
            self._leave(path)
        return True

    def _read_peers(self, version: int) -> None:
        assert self.directory is not None
        read_ns = time.time_ns()  # before the listing: a change after it is not in it
        try:
            names = os.listdir(self.directory)
        except OSError:
            names = []
        own = self._own_path if self._listening_pid == os.getpid() else None
        self._peers = tuple(path for name in names
                            if (path := os.path.join(self.directory, name)) != own)
        self._peers_version = version
        self._peers_read_at = time.monotonic()
        self._peers_read_ns = read_ns

    def _forget(self, path: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(path)
        self._peers = tuple(peer for peer in self._peers if peer != path)

    def _sending_socket(self) -> socket.socket:
        if self._sender is None or self._sender_pid != os.getpid():
            sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sender.setblocking(False)
            self._sender, self._sender_pid = sender, os.getpid()
        return self._sender

    def _leave_at_exit(self) -> None:
        if self._own_path is not None:
            self._leave(self._own_path)

    def _leave(self, path: str) -> None:
        """Remove this process's socket (at exit, or once idle), and the directory with it
        if it was the last; a forked child's exit leaves its parent's socket alone."""
        if not path.startswith(os.path.join(self.directory or "", f"{os.getpid()}.")):
            return
        with contextlib.suppress(OSError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(self.directory or "")
