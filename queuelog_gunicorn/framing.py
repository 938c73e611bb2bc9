"""How much of one HTTP/1.1 request has arrived: enough to tell, from the bytes alone, when
its head and its body (by Content-Length or chunked encoding) are whole.

This is not a parser: gunicorn's parser still reads every request, and refuses what is
malformed or too large. This only decides when the bytes may be handed to it. Whenever the
framing is doubtful (a malformed head, a head past gunicorn's limits, a bad chunk size) the
request is handed over at once, so that gunicorn answers its 4xx from the bytes already here.
And when the two ever disagree, the parser that asks for more than was handed over meets
the end of the stream and the connection closes: a disagreement can cost a connection,
never a thread waiting on a client.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

# Bytes of chunk-size lines and CRLFs a chunked body may carry beyond its decoded size before
# the connection is closed: a few bytes per chunk, so this allows thousands of chunks, yet
# bounds what one-byte chunks can make a connection hold.
FRAMING_ALLOWANCE = 64 * 1024

_HEX = re.compile(rb"[0-9A-Fa-f]+")
_DIGITS = re.compile(rb"[0-9]+")


def _bare_lf(data: bytes | bytearray, start: int, end: int) -> bool:
    """Whether a LF between `start` and `end` lacks its CR."""
    at = data.find(b"\n", start, end)
    while at >= 0:
        if at == 0 or data[at - 1] != 0x0D:
            return True
        at = data.find(b"\n", at + 1, end)
    return False


class Verdict(enum.Enum):
    INCOMPLETE = "wait for more bytes"
    READY = "hand the bytes to a thread"
    REFUSE = "close the connection"


@dataclass(frozen=True)
class Limits:
    """How many bytes of a request are worth holding."""

    head: int  # request line and header fields, terminators included
    body: int  # the application's request-size cap (it answers 413 above it)
    chunk_line: int  # one chunk-size line
    trailers: int  # the trailer section of a chunked body

    @classmethod
    def of_gunicorn(cls, cfg: object, body: int) -> Limits:
        """The limits gunicorn's parser applies under `cfg` (gunicorn/http/message.py): a head
        or chunk line past them is refused by it, so holding more would be pointless."""
        line = getattr(cfg, "limit_request_line", 0)
        line = 8190 if line <= 0 or line > 8190 else line
        fields = getattr(cfg, "limit_request_fields", 0)
        fields = 32768 if fields <= 0 or fields > 32768 else fields
        field_size = getattr(cfg, "limit_request_field_size", 0)
        field_size = 8190 if field_size <= 0 else field_size
        headers = fields * (field_size + 2) + 4
        # One empty line may precede the request line (RFC 9112 section 2.2).
        return cls(head=2 + line + 2 + headers, body=body, chunk_line=field_size,
                   trailers=headers)


class _Stage(enum.Enum):
    HEAD = 1
    CHUNK_SIZE = 2
    CHUNK_DATA = 3
    CHUNK_END = 4
    TRAILERS = 5
    FIXED_BODY = 6


class RequestProgress:
    """Follows one request through a buffer that holds it from its first byte and grows as
    bytes arrive; `check()` says whether to wait, hand it over, or close.

    `cut` says a request is handed over before its body is whole, because the body is larger
    than the application accepts: it answers 413 from what is here, and the connection then
    closes, since the rest of the body is still on its way.
    """

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.cut = False
        self.wants_continue = False  # the client waits for "100 Continue" before its body
        self._stage = _Stage.HEAD
        self._scanned = 0  # how far the head (later the trailers) has been searched
        self._body_start = 0
        self._position = 0  # the next unread byte of a chunked body
        self._chunk_left = 0
        self._decoded = 0
        self._end = 0  # the end of a Content-Length body

    def check(self, data: bytes | bytearray) -> Verdict:
        if self._stage is _Stage.HEAD:
            verdict = self._check_head(data)
            if verdict is not None:
                return verdict
        if self._stage is _Stage.FIXED_BODY:
            return Verdict.READY if len(data) >= self._end else Verdict.INCOMPLETE
        return self._check_chunks(data)

    # -- the head ---------------------------------------------------------------------------

    def _check_head(self, data: bytes | bytearray) -> Verdict | None:
        end = data.find(b"\r\n\r\n", max(0, self._scanned - 3))
        # gunicorn refuses a head longer than its limits, or with a bare LF, from what is
        # here: no need to wait for the rest.
        if _bare_lf(data, self._scanned, end if end >= 0 else len(data)):
            return Verdict.READY
        if end < 0:
            self._scanned = len(data)
            return Verdict.READY if len(data) > self.limits.head else Verdict.INCOMPLETE
        lines = bytes(data[:end]).split(b"\r\n")
        if lines[0] == b"":
            lines.pop(0)
        request_line, fields = lines[0], lines[1:]
        headers: dict[bytes, list[bytes]] = {}
        for field in fields:
            name, colon, value = field.partition(b":")
            if not colon:
                return Verdict.READY  # malformed: gunicorn answers 400
            headers.setdefault(name.strip().lower(), []).append(value.strip(b" \t"))
        self._body_start = end + 4
        lengths = headers.get(b"content-length", [])
        codings = headers.get(b"transfer-encoding", [])
        if codings:
            last = b",".join(codings).split(b",")[-1].strip(b" \t").lower()
            if last != b"chunked" or lengths:
                return Verdict.READY  # gunicorn answers 400 or 501
            self._stage = _Stage.CHUNK_SIZE
            self._position = self._body_start
        elif lengths:
            if len(lengths) > 1 or not _DIGITS.fullmatch(lengths[0]):
                return Verdict.READY  # gunicorn answers 400
            length = int(lengths[0])
            if length > self.limits.body:
                self.cut = True  # the application answers 413 from the head alone
                return Verdict.READY
            self._stage = _Stage.FIXED_BODY
            self._end = self._body_start + length
        else:
            return Verdict.READY  # no body
        self.wants_continue = (
            request_line.endswith(b" HTTP/1.1")
            and b"100-continue" in (value.lower() for value in headers.get(b"expect", [])))
        return None

    # -- a chunked body ---------------------------------------------------------------------

    def _check_chunks(self, data: bytes | bytearray) -> Verdict:
        while True:
            if self._stage is _Stage.CHUNK_SIZE:
                line_end = data.find(b"\r\n", self._position)
                if line_end < 0:
                    if len(data) - self._position > self.limits.chunk_line:
                        return Verdict.READY  # gunicorn refuses the line
                    return self._incomplete(data)
                size = bytes(data[self._position:line_end]).split(b";", 1)[0].rstrip(b" \t")
                if not _HEX.fullmatch(size):
                    return Verdict.READY  # gunicorn answers 400
                self._chunk_left = int(size, 16)
                self._position = line_end + 2
                self._stage = _Stage.CHUNK_DATA if self._chunk_left else _Stage.TRAILERS
            elif self._stage is _Stage.CHUNK_DATA:
                arrived = min(self._chunk_left, len(data) - self._position)
                self._position += arrived
                self._chunk_left -= arrived
                self._decoded += arrived
                if self._decoded > self.limits.body:
                    # The application reads one byte past its cap, finds it, and answers 413.
                    self.cut = True
                    return Verdict.READY
                if self._chunk_left:
                    return self._incomplete(data)
                self._stage = _Stage.CHUNK_END
            elif self._stage is _Stage.CHUNK_END:
                if len(data) - self._position < 2:
                    return self._incomplete(data)
                if data[self._position:self._position + 2] != b"\r\n":
                    return Verdict.READY  # gunicorn answers 400
                self._position += 2
                self._stage = _Stage.CHUNK_SIZE
            else:  # trailers: none (an empty line), or fields up to an empty line
                if len(data) - self._position < 2:
                    return self._incomplete(data)
                if data[self._position:self._position + 2] == b"\r\n":
                    return Verdict.READY
                self._scanned = max(self._scanned, self._position)
                if data.find(b"\r\n\r\n", max(self._position, self._scanned - 3)) >= 0:
                    return Verdict.READY
                self._scanned = len(data)
                if len(data) - self._position > self.limits.trailers:
                    return Verdict.READY  # gunicorn refuses the trailers
                return self._incomplete(data)

    def _incomplete(self, data: bytes | bytearray) -> Verdict:
        if len(data) - self._body_start > self.limits.body + FRAMING_ALLOWANCE:
            return Verdict.REFUSE  # more framing than data: nothing a client needs
        return Verdict.INCOMPLETE
