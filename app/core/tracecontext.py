"""W3C Trace Context (https://www.w3.org/TR/trace-context/): the `traceparent` and `tracestate`
headers a request carries, kept with the jobs it enqueues and handed on unchanged (docs/TRACING.md).

Pure: no HTTP, no database. A header that is not valid W3C trace context is ignored, as the
recommendation asks of every participant ("vendors MUST ignore the traceparent when the
parent-id is invalid"), never refused: a producer's broken tracer must not lose its jobs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

# version "00"'s layout; a later version is read by its first four fields alone (the
# recommendation's forward compatibility), so it is kept only when exactly this long.
_TRACEPARENT = re.compile(r"\A([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})\Z")
TRACEPARENT_CHARS = 55
# The recommendation asks that at least 512 characters of tracestate be propagated; a longer
# one is dropped whole rather than cut (a cut list member would be a corrupt one).
TRACESTATE_CHARS = 512
_TRACESTATE = re.compile(r"\A[\x20-\x7e]*\Z")


@dataclass(frozen=True)
class Trace:
    """A job's trace context: `traceparent` as received (lower-case hex, 55 characters) and
    `tracestate` (None: none was sent, or it could not be kept)."""

    traceparent: str
    tracestate: str | None = None

    def as_json(self) -> dict[str, str | None]:
        return {"traceparent": self.traceparent, "tracestate": self.tracestate}

    def as_headers(self) -> dict[str, str]:
        headers = {"traceparent": self.traceparent}
        if self.tracestate:
            headers["tracestate"] = self.tracestate
        return headers

    @property
    def trace_id(self) -> str:
        return self.traceparent[3:35]

    @property
    def parent_id(self) -> str:
        return self.traceparent[36:52]


def trace_from(traceparent: str | None, tracestate: str | None = None) -> Trace | None:
    """The trace context these header values carry, or None when `traceparent` is absent or
    not valid (an all-zero trace or parent id, version ff, a wrong layout)."""
    if traceparent is None:
        return None
    value = traceparent.strip()
    match = _TRACEPARENT.match(value)
    if match is None:
        return None
    version, trace_id, parent_id, _flags = match.groups()
    if version == "ff" or trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    state = None
    if tracestate is not None:
        state = tracestate.strip()
        if not state or len(state) > TRACESTATE_CHARS or not _TRACESTATE.match(state):
            state = None
    return Trace(value, state)


class Headers(Protocol):
    """What is read of a request's headers: a case-insensitive look-up (Flask's Headers, a
    dict of lower-case names)."""

    def get(self, key: str, /) -> Any: ...


def trace_of_headers(headers: Headers) -> Trace | None:
    """The trace context of a request's headers (a case-insensitive mapping, as Flask's)."""
    return trace_from(headers.get("traceparent"), headers.get("tracestate"))
