"""W3C trace context for the client and the runner (docs/TRACING.md), with OpenTelemetry when the
process has it and without it otherwise.

A producer's enqueue sends `traceparent`/`tracestate` headers: those given, else (OpenTelemetry
installed) the current span's. The server keeps them with the job and hands them to the worker
in the claim. The runner then runs the handler inside a span "queuelog.run <type>" whose parent
is the job's trace, so the handler's own spans join the producer's trace; its reports carry the
job's traceparent, so the server's report span joins it too.

OpenTelemetry is optional: the client stays on the standard library, and this module imports
`opentelemetry` only when first asked for a header or a span, and never fails without it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping
from typing import Any

from queuelog_client._version import __version__

TRACE_HEADERS = ("traceparent", "tracestate")
INSTRUMENTATION_NAME = "queuelog_client"


def trace_headers(traceparent: str | None = None,
                  tracestate: str | None = None) -> dict[str, str]:
    """The trace headers of a request that enqueues: `traceparent` (and `tracestate`) when
    given, else the current OpenTelemetry context's (none without OpenTelemetry, or outside
    any span). The server ignores a traceparent that is not valid W3C trace context."""
    if traceparent:
        headers = {"traceparent": traceparent}
        if tracestate:
            headers["tracestate"] = tracestate
        return headers
    otel = _opentelemetry()
    if otel is None:
        return {}
    carrier: dict[str, str] = {}
    otel.propagate.inject(carrier)
    # Only the trace context travels with a job (the server keeps nothing else: no baggage).
    return {name: carrier[name] for name in TRACE_HEADERS if carrier.get(name)}


def job_trace_headers(job: Mapping[str, Any]) -> dict[str, str]:
    """A job's trace context (its `"trace"` as the claim shows it) as headers; {} when none."""
    trace = job.get("trace")
    if not isinstance(trace, Mapping) or not trace.get("traceparent"):
        return {}
    return trace_headers(str(trace["traceparent"]),
                         None if trace.get("tracestate") is None else str(trace["tracestate"]))


@contextlib.contextmanager
def run_span(job: Mapping[str, Any]) -> Iterator[None]:
    """Around a handler's run: a current span "queuelog.run <type>" parented on the job's
    trace (a new trace for a job without one), recording an exception raised through it.
    Without OpenTelemetry, nothing."""
    otel = _opentelemetry()
    if otel is None:
        yield
        return
    parent = otel.propagate.extract(job_trace_headers(job))
    attributes: dict[str, Any] = {}
    if isinstance(job.get("id"), int):
        attributes["queuelog.job.id"] = job["id"]
    if isinstance(job.get("type"), str):
        attributes["queuelog.job.type"] = job["type"]
    if isinstance(job.get("retry_count"), int):
        attributes["queuelog.job.attempt"] = job["retry_count"] + 1
    tracer = otel.trace.get_tracer(INSTRUMENTATION_NAME, __version__)
    with tracer.start_as_current_span(f"queuelog.run {job.get('type')}", context=parent,
                                      kind=otel.trace.SpanKind.CONSUMER,
                                      attributes=attributes):
        yield


class _OpenTelemetry:
    def __init__(self, propagate: Any, trace: Any) -> None:
        self.propagate = propagate
        self.trace = trace


@functools.cache
def _opentelemetry() -> _OpenTelemetry | None:
    """OpenTelemetry's API, imported on first use; None when it is not installed."""
    try:
        from opentelemetry import propagate, trace
    except ImportError:
        return None
    return _OpenTelemetry(propagate, trace)
