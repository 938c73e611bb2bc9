"""Optional OpenTelemetry export of queuelog's own spans (docs/TRACING.md): enqueue, claim and
report, each parented on the trace context its job carries, so they appear inside the
producer's trace beside the worker's spans. docs/TRACING.md describes them.

Off unless the `otel` extra is installed and the standard OTEL_* variables ask for export
(an OTLP endpoint is named and OTEL_SDK_DISABLED is not "true"). Off, this module imports
nothing of OpenTelemetry and registers nothing: a request costs what it did.

On, the SDK is built lazily, at a process's first request, never in the factory: gunicorn may
build the app in its master (--preload) and fork, and the BatchSpanProcessor's export thread
must belong to the process that serves. The SDK itself reads the rest of the OTEL_* variables
(OTEL_EXPORTER_OTLP_*, OTEL_BSP_*, OTEL_TRACES_SAMPLER, OTEL_RESOURCE_ATTRIBUTES, ...).

The spans are made from what a request said and answered (the route, the response's JSON),
after the fact, with the start time taken before the request ran: the handlers stay free of
tracing, and a span never carries a payload, a result, an error's text or a token.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flask import Flask, Response, g, request

from app.core.tracecontext import Trace, trace_from, trace_of_headers

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

log = logging.getLogger(__name__)

EXTENSION = "queuelog_tracing"
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
DEFAULT_SERVICE_NAME = "queuelog"
INSTRUMENTATION_NAME = "queuelog"

ENQUEUE_SPAN = "queuelog.enqueue"
CLAIM_SPAN = "queuelog.claim"
REPORT_SPAN = "queuelog.report"

_ENQUEUE = frozenset({"jobs.enqueue_job", "jobs.enqueue_batch"})
_CLAIM = frozenset({"jobs.claim_job", "jobs.claim_many_jobs"})
# Heartbeats are left out on purpose: a long job beats every few seconds, and a span for each
# would bury the trace's few meaningful spans.
_REPORT = {"jobs.complete_job": "complete", "jobs.fail_job": "fail",
           "jobs.complete_many_jobs": "complete"}
_TRACED = _ENQUEUE | _CLAIM | frozenset(_REPORT)

_STARTED = "queuelog_span_started_ns"


def export_wanted(environ: Mapping[str, str]) -> bool:
    """Whether the standard variables ask for span export: an OTLP endpoint named (for all
    signals or for traces), the SDK not disabled, the traces exporter not "none"."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def init_tracing(app: Flask, environ: Mapping[str, str] | None = None) -> None:
    """Register the span hooks on `app` when export is asked for and OpenTelemetry's SDK is
    installed; otherwise do nothing (and import nothing of it). The factory's one call."""
    if not export_wanted(os.environ if environ is None else environ):
        return
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        app.logger.warning("queuelog: OTEL_* variables ask for span export, but the `otel` "
                           "extra is not installed (pip install 'queuelog[otel]'); no spans")
        return
    tracing = Tracing()
    app.extensions[EXTENSION] = tracing
    app.before_request(_before)
    app.after_request(tracing.after)
    app.teardown_request(tracing.teardown)


def flush_tracing(app: Flask, timeout_millis: int = 30_000) -> bool:
    """Export the spans this process has ended and not yet sent; True if all went (or
    tracing is off)."""
    tracing: Tracing | None = app.extensions.get(EXTENSION)
    return True if tracing is None else tracing.flush(timeout_millis)


def shutdown_tracing(app: Flask) -> None:
    """Flush and stop this process's exporter (e.g. from gunicorn's worker_exit). The SDK
    also does this at interpreter exit."""
    tracing: Tracing | None = app.extensions.get(EXTENSION)
    if tracing is not None:
        tracing.shutdown()


@dataclass(frozen=True)
class _Span:
    name: str
    parent: Trace | None
    attributes: dict[str, Any]


class Tracing:
    """This app's span export: the provider of the process serving it, built at its first
    traced request (again in a forked child)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._provider: TracerProvider | None = None
        self._tracer: Tracer | None = None

    def tracer(self) -> Tracer:
        with self._lock:
            if self._tracer is None or self._pid != os.getpid():
                self._provider = _make_provider()
                self._tracer = self._provider.get_tracer(INSTRUMENTATION_NAME)
                self._pid = os.getpid()
            return self._tracer

    def flush(self, timeout_millis: int) -> bool:
        with self._lock:
            provider = self._provider if self._pid == os.getpid() else None
        return True if provider is None else provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        with self._lock:
            provider = self._provider if self._pid == os.getpid() else None
            self._provider, self._tracer, self._pid = None, None, None
        if provider is not None:
            provider.shutdown()

    # -- request hooks --------------------------------------------------------------------

    def after(self, response: Response) -> Response:
        started = g.pop(_STARTED, None)
        if started is not None:
            try:
                self._record(started, response.status_code, _json_of(response))
            except Exception:
                # Tracing must never cost a request its answer.
                log.exception("queuelog: could not record the request's spans")
        return response

    def teardown(self, exc: BaseException | None) -> None:
        # Reached without after_request having run (an error past the error handlers): the
        # request's span still ends, as a server error.
        started = g.pop(_STARTED, None)
        if started is not None and request.endpoint not in _CLAIM:
            try:
                self._record(started, 500, None)
            except Exception:
                log.exception("queuelog: could not record the request's spans")

    def _record(self, started_ns: int, status: int, body: Any) -> None:
        spans = list(_spans_of(request.endpoint or "", status, body))
        if not spans:
            return
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        tracer = self.tracer()
        ended_ns = time.time_ns()
        # W3C trace context alone, whatever OTEL_PROPAGATORS says: it is what jobs keep.
        propagator = TraceContextTextMapPropagator()
        common: dict[str, Any] = {"http.request.method": request.method,
                                  "http.route": (request.url_rule.rule
                                                 if request.url_rule else ""),
                                  "http.response.status_code": status}
        for span in spans:
            context = (propagator.extract(span.parent.as_headers())
                       if span.parent is not None else None)
            made = tracer.start_span(span.name, context=context, kind=SpanKind.SERVER,
                                     start_time=started_ns,
                                     attributes={**common, **span.attributes})
            if status >= 500:
                made.set_status(Status(StatusCode.ERROR))
            made.end(end_time=ended_ns)


def _before() -> None:
    if request.endpoint in _TRACED:
        g.setdefault(_STARTED, time.time_ns())


def _json_of(response: Response) -> Any:
    if response.is_streamed or not response.is_json:
        return None
    return response.get_json(silent=True)


def _spans_of(endpoint: str, status: int, body: Any) -> Iterator[_Span]:
    """The spans one request makes: enqueue, one request, one span (a batch's, its jobs
    listed); claim, one span per job taken, each parented on its job's trace (nothing taken,
    no span: an idle worker's polls would each start a trace); report, one span per job
    reported on, parented on the job's trace as the answer shows it, else on the request's
    own traceparent (queuelog's runner sends its job's)."""
    own = trace_of_headers(request.headers)
    if endpoint in _ENQUEUE:
        jobs = _jobs_in(body)
        attributes: dict[str, Any] = {}
        if endpoint == "jobs.enqueue_job" and jobs:
            attributes = _job_attributes(jobs[0])
        elif jobs:
            attributes = {"queuelog.job.count": len(jobs),
                          "queuelog.job.ids": [job["id"] for job in jobs
                                               if isinstance(job.get("id"), int)],
                          "queuelog.job.types": sorted({str(job.get("type")) for job in jobs})}
        yield _Span(ENQUEUE_SPAN, own, attributes)
    elif endpoint in _CLAIM:
        if status != 200:
            return
        for job in _jobs_in(body):
            yield _Span(CLAIM_SPAN, _trace_in(job), _job_attributes(job))
    elif endpoint in _REPORT:
        kind = _REPORT[endpoint]
        jobs = _jobs_in(body)
        if not jobs:
            # Refused (404, 409, 422): the span still says which job was reported on.
            job_id = (request.view_args or {}).get("job_id")
            yield _Span(REPORT_SPAN, own, {"queuelog.report": kind}
                        | ({"queuelog.job.id": job_id} if isinstance(job_id, int) else {}))
        for job in jobs:
            yield _Span(REPORT_SPAN, _trace_in(job) or own,
                        {"queuelog.report": kind} | _job_attributes(job))


def _jobs_in(body: Any) -> list[dict[str, Any]]:
    """The job objects of an answer: a job, {"jobs": [...]}, or complete-many's results."""
    if not isinstance(body, dict):
        return []
    if isinstance(body.get("jobs"), list):
        return [job for job in body["jobs"] if isinstance(job, dict)]
    if isinstance(body.get("results"), list):
        return [item["job"] for item in body["results"]
                if isinstance(item, dict) and isinstance(item.get("job"), dict)]
    return [body] if isinstance(body.get("id"), int) else []


def _job_attributes(job: Mapping[str, Any]) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    if isinstance(job.get("id"), int):
        attributes["queuelog.job.id"] = job["id"]
    if isinstance(job.get("type"), str):
        attributes["queuelog.job.type"] = job["type"]
    return attributes


def _trace_in(job: Mapping[str, Any]) -> Trace | None:
    shown = job.get("trace")
    if not isinstance(shown, dict):
        return None
    return trace_from(shown.get("traceparent"), shown.get("tracestate"))


def _make_provider() -> TracerProvider:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; only when neither
    # names the service is it queuelog (rather than the SDK's "unknown_service").
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider
