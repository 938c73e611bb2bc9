"""The dispatcher's metrics: deliveries by outcome, their latency, those in flight, and the
deliveries each push origin is let run at once.

Under the container's gunicorn (QUEUELOG_DISPATCH=1) the dispatcher is the master's child
and inherits PROMETHEUS_MULTIPROC_DIR: its series go to files in the same directory as the
workers', and GET /metrics (whichever worker answers) shows them with the rest. Run on its
own without that directory, `queuelog dispatch --metrics-port N` serves them itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from app.dispatch.outcome import Kind

# From a receiver answering at once to the longest timeout (900 s).
DELIVERY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 300.0, 900.0)


class DispatchMetrics:
    def __init__(self, multiprocess_dir: str | None = None) -> None:
        self.multiprocess_dir = multiprocess_dir
        self.registry = CollectorRegistry()
        owner = None if multiprocess_dir else self.registry
        self._deliveries = Counter(
            "queuelog_push_deliveries",
            "Push deliveries by type and outcome (completed, retry_after, http_error, "
            "timeout, connection_error, released, refused).",
            ("type", "outcome"), registry=owner)
        self._latency = Histogram(
            "queuelog_push_delivery_duration_seconds",
            "Time from sending a delivery to its answer (or its failure), by type.",
            ("type",), buckets=DELIVERY_BUCKETS, registry=owner)
        # livesum: the dispatchers alive now, added up; a stopped one's count goes with it.
        self._in_flight = Gauge(
            "queuelog_push_deliveries_in_flight", "Deliveries sent and not yet answered.",
            registry=owner, multiprocess_mode="livesum")
        # livesum: several dispatchers each adapt on their own, and an origin may receive
        # what all of them let run.
        self._concurrency = Gauge(
            "queuelog_push_concurrency",
            "Deliveries the dispatcher lets run at once to each push origin now (its limit: "
            "halved on a 429, a 503 or a timeout, grown back to the cap by successes).",
            ("origin",), registry=owner, multiprocess_mode="livesum")

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> DispatchMetrics:
        environ = os.environ if environ is None else environ
        return cls(environ.get("PROMETHEUS_MULTIPROC_DIR") or None)

    def serve(self, port: int, host: str) -> None:
        """Serve this process's metrics on host:port (a dispatcher outside gunicorn)."""
        start_http_server(port, addr=host, registry=self.registry)

    def started(self) -> None:
        self._in_flight.inc()

    def finished(self, job_type: str, kind: Kind, seconds: float) -> None:
        """A delivery started() has its outcome, after `seconds`."""
        self._in_flight.dec()
        self.count(job_type, kind)
        self._latency.labels(job_type).observe(seconds)

    def concurrency(self, origin: str, limit: int) -> None:
        self._concurrency.labels(origin).set(limit)

    def count(self, job_type: str, kind: Kind) -> None:
        self._deliveries.labels(job_type, kind.value).inc()

    def close(self) -> None:
        """At a clean exit: this process's live gauge goes (its counters stay, summed)."""
        if self.multiprocess_dir:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(os.getpid(), self.multiprocess_dir)
