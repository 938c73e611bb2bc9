"""Prometheus metrics: counters of what happened to jobs (fed by the job service's event sink;
named, with their help, in app/jobs/domain/transitions.py's JobMetric),
a request-latency histogram, and gauges read from the database when /metrics is scraped.

Under gunicorn, several worker processes each count their own share. gunicorn.conf.py sets
PROMETHEUS_MULTIPROC_DIR before anything imports prometheus_client; the counters and the
histogram then live in per-process files, and a scrape, whichever worker answers it, merges
every file. The gauges come from the database at scrape time, so they need no per-process
state at all. Without that variable (the Flask test client, `flask run`) each app keeps its
metrics in its own registry, so that the many apps a test run builds never collide.
"""

from __future__ import annotations

import fcntl
import glob
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping

from flask import Blueprint, Flask, Response, current_app, request
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError

from app.core.callers import Role
from app.core.errors import Forbidden
from app.core.statuses import JobStatus
from app.jobs.domain.transitions import JOB_METRICS
from app.storage.activity import oldest_transaction_seconds
from app.storage.engine import Database
from app.types.service import TypeService
from app.web.auth import authenticate
from app.web.openapi import Reply, documented
from queuelog_gunicorn.multiprocess import COMPACTION_LOCK

log = logging.getLogger(__name__)

# Up to the 20 s a long-polling claim may wait, and a little beyond.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0)
# A slot is enqueued within about a tick (0.5 s) while a server runs; catch-up jobs after
# downtime are minutes or days late.
LATENESS_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 30.0, 60.0, 300.0, 3600.0,
                    86_400.0)
# Any other method is labelled OTHER: a label value taken from the request line as sent would
# let a client create time series without bound.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED_ROUTE = "<unmatched>"


class QueueMetrics:
    """The metric objects of one app, and how to render them for a scrape."""

    def __init__(self, multiprocess_dir: str | None = None) -> None:
        self.multiprocess_dir = multiprocess_dir
        self._registry = CollectorRegistry()
        # In multiprocess mode the values go to files and a scrape reads the files; registering
        # the objects as well would count everything twice.
        owner = None if multiprocess_dir else self._registry
        self._job_events = {
            metric.value: Counter(f"queuelog_jobs_{metric.value}", help_text, registry=owner)
            for metric, help_text in JOB_METRICS.items()
        }
        self._flow_skips = Counter(
            "queuelog_flow_skipped_claims",
            "Claims that passed over due jobs of a type (or of a concurrency key) held back "
            "by its flow control, by type and reason (paused, max_running, rate, "
            "max_running_per_key).",
            ("type", "reason"), registry=owner)
        # No per-schedule label: names come and go without bound (10,000 schedules, created
        # and deleted by scripts), and in multiprocess mode a series, once in a worker's
        # file, outlives its schedule until that file goes. Each schedule's own last_run_at
        # and last_job_id are in GET /schedules.
        self._schedule_firings = Counter(
            "queuelog_schedule_firings",
            "Jobs enqueued by schedules (each slot once, across processes).",
            registry=owner)
        self._schedule_skips = Counter(
            "queuelog_schedule_skipped_slots",
            "Due schedule slots that enqueued no job, by reason: missed (catch_up latest or "
            "none passed over it), unique (the job's unique key was held), invalid (the "
            "job template no longer loads or validates).",
            ("reason",), registry=owner)
        self._schedule_lateness = Histogram(
            "queuelog_schedule_lateness_seconds",
            "Seconds from a schedule's slot to the enqueue of its job (catch-up jobs "
            "included).", buckets=LATENESS_BUCKETS, registry=owner)
        self._request_duration = Histogram(
            "queuelog_http_request_duration_seconds",
            "Time the app took to answer a request, by method, route (the URL rule, not the "
            "path) and status.",
            ("method", "route", "status"), buckets=LATENCY_BUCKETS, registry=owner)
        # The chores are a few constants (app/jobs/usecases/maintenance.py): bounded label values.
        self._maintenance_failures = Counter(
            "queuelog_maintenance_failures",
            "Failures of maintenance (lease_rescue, expiry, dependency_cascade, "
            "reservation_release, retention), by chore: "
            "each is logged and retried with a backoff, and never fails a request; /readyz "
            "says which are failing now.",
            ("chore",), registry=owner)
        self._scrape_collectors: list[Collector] = []

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> QueueMetrics:
        """Multiprocess mode when PROMETHEUS_MULTIPROC_DIR is set (gunicorn.conf.py sets it)."""
        environ = os.environ if environ is None else environ
        return cls(environ.get("PROMETHEUS_MULTIPROC_DIR") or None)

    def count_job_event(self, name: str, count: int) -> None:
        """The job service's event sink: cheap, no database, never raises."""
        counter = self._job_events.get(name)
        # The request that reported the event has committed by now: an event name this module
        # does not know yet must not turn its answer into an error.
        if counter is not None and count > 0:
            counter.inc(count)

    def count_flow_skip(self, job_type: str, reason: str) -> None:
        """Flow control's skip sink. Types are the configured ones, reasons four constants:
        the label values are bounded."""
        self._flow_skips.labels(job_type, reason).inc()

    def count_schedule_firing(self, lateness_seconds: float) -> None:
        """The schedule service's firing sink: one job enqueued for a slot, this late."""
        self._schedule_firings.inc()
        self._schedule_lateness.observe(lateness_seconds)

    def count_schedule_skip(self, reason: str, count: int) -> None:
        """The schedule service's sink of skipped slots; reasons are three constants
        (app/schedules/service.py): the label values are bounded."""
        if count > 0:
            self._schedule_skips.labels(reason).inc(count)

    def count_maintenance_failure(self, chore: str) -> None:
        """MaintenanceHealth's failure sink."""
        self._maintenance_failures.labels(chore).inc()

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        if method not in KNOWN_METHODS:
            method = "OTHER"
        self._request_duration.labels(method, route, str(status)).observe(seconds)

    def add_scrape_collector(self, collector: Collector) -> None:
        """A collector that runs at scrape time (it must offer `describe`, so that registering
        it does not run it)."""
        self._scrape_collectors.append(collector)
        if self.multiprocess_dir is None:
            self._registry.register(collector)

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """The exposition for a scrape, in the format the scraper's Accept header prefers."""
        if self.multiprocess_dir is None:
            registry = self._registry
        else:
            registry = CollectorRegistry()
            registry.register(WorkerFilesCollector(self.multiprocess_dir))
            for collector in self._scrape_collectors:
                registry.register(collector)
        encoder, content_type = choose_encoder(accept or "")
        return encoder(registry), content_type


class WorkerFilesCollector(Collector):
    """The counters and histograms of every worker, live or dead, merged from their files."""

    def __init__(self, path: str) -> None:
        self.path = path

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        # Shared: the master folds dead workers' files under the exclusive lock.
        with open(os.path.join(self.path, COMPACTION_LOCK), "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_SH)
            files = glob.glob(os.path.join(self.path, "*.db"))
            return list(MultiProcessCollector.merge(files, accumulate=True))


# queuelog_circuit_state's values.
CIRCUIT_GAUGE = {"closed": 0, "half_open": 1, "open": 2}


class QueueGauges(Collector):
    """Gauges read at scrape time: the per-type counts GET /types shows (TypeService.stats:
    the running jobs live, in one read of their partial index, which also says whether the
    database answers; the rest from the backlog counts, at most
    QUEUELOG_TYPE_COUNTS_MAX_AGE_SECONDS old: counting a million stored jobs on every scrape
    cost a second).

    A scrape that cannot reach the database still answers, with the counters and
    queuelog_database_up 0, so that the outage itself is visible on the dashboards.

    On PostgreSQL, queuelog_database_oldest_transaction_seconds too (absent on SQLite): the
    age of the server's oldest transaction holding a snapshot, which slows claims down the
    longer it stays open (app/storage/activity.py).
    """

    def __init__(self, types: TypeService, job_types: Iterable[str], db: Database,
                 cascades: Callable[[], tuple[int, float]] | None = None) -> None:
        self.types = types
        self.job_types = frozenset(job_types)
        self.db = db
        self.cascades = cascades

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    @staticmethod
    def _families() -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("queuelog_database_up",
                                "1 when the scrape could read the jobs table, else 0.")
        yield GaugeMetricFamily("queuelog_jobs", "Jobs stored, by status and type.",
                                labels=("status", "type"))
        yield GaugeMetricFamily(
            "queuelog_oldest_claimable_job_age_seconds",
            "How long the oldest claimable job (pending, run_at reached) has been claimable; "
            "0 when none is.")
        yield GaugeMetricFamily("queuelog_type_pending_jobs",
                                "Pending jobs of each configured type (scheduled included).",
                                labels=("type",))
        yield GaugeMetricFamily("queuelog_type_running_jobs",
                                "Running jobs of each configured type.", labels=("type",))
        yield GaugeMetricFamily(
            "queuelog_type_oldest_claimable_age_seconds",
            "How long each type's oldest claimable job has been claimable; 0 when none is.",
            labels=("type",))
        yield GaugeMetricFamily(
            "queuelog_type_blocked_keys",
            "Ordered keys of each configured type that a failed job blocks (on_failure "
            "block): nothing more of such a key runs until the job is retried or cancelled.",
            labels=("type",))
        yield GaugeMetricFamily(
            "queuelog_circuit_state",
            "Where each type's circuit breaker stands: 0 closed, 1 half-open, 2 open (the "
            "types with a breaker alone; docs/FLOW-CONTROL.md).", labels=("type",))
        yield GaugeMetricFamily(
            "queuelog_dependency_cascades",
            "Finished jobs whose end is still being applied to the jobs waiting on them, in "
            "bounded steps (docs/WORKFLOWS.md); 0 nearly always.")
        yield GaugeMetricFamily(
            "queuelog_dependency_cascade_oldest_seconds",
            "How long the oldest cascade under way has been (0 when none is): growing, "
            "maintenance is not keeping up or is failing (see /readyz).")
        yield GaugeMetricFamily(
            "queuelog_database_oldest_transaction_seconds",
            "PostgreSQL: how long the server's oldest open transaction holding a snapshot "
            "has run (any database; 0 when none): dead rows it holds back slow claims down.")

    def collect(self) -> Iterable[Metric]:
        (up, jobs, oldest_age, type_pending, type_running, type_oldest,
         type_blocked, circuits, cascades, cascade_age, oldest_transaction) = self._families()
        try:
            stats = self.types.stats()
        except SQLAlchemyError as exc:
            log.warning("metrics: the database did not answer: %s", type(exc).__name__)
            up.add_metric([], 0)
            return [up]
        up.add_metric([], 1)
        # Every status of every configured type is reported, zeros included: a series that
        # vanishes when its count reaches zero would leave alerts on it undefined.
        for status in JobStatus:
            for job_type in sorted(self.job_types | stats.types()):
                jobs.add_metric([status.value, job_type],
                                stats.counts_of(job_type).of_status(status))
        oldest_age.add_metric([], stats.oldest_claimable_age_seconds() or 0.0)
        for job_type in sorted(self.job_types):
            counts = stats.counts_of(job_type)
            type_pending.add_metric([job_type], counts.pending)
            type_running.add_metric([job_type], counts.running)
            type_oldest.add_metric([job_type],
                                   stats.oldest_claimable_age_seconds(job_type) or 0.0)
            type_blocked.add_metric([job_type], stats.blocked_keys.get(job_type, 0))
        families = [up, jobs, oldest_age, type_pending, type_running, type_oldest, type_blocked]
        try:
            for job_type, state in self.types.circuit_states().items():
                circuits.add_metric([job_type], CIRCUIT_GAUGE[state])
            families.append(circuits)
        except SQLAlchemyError as exc:
            log.warning("metrics: the database did not answer: %s", type(exc).__name__)
        if self.cascades is not None:
            try:
                under_way, cascade_seconds = self.cascades()
            except SQLAlchemyError as exc:
                log.warning("metrics: the database did not answer: %s", type(exc).__name__)
                return families
            cascades.add_metric([], under_way)
            cascade_age.add_metric([], cascade_seconds)
            families += [cascades, cascade_age]
        try:
            with self.db.read() as conn:
                age = oldest_transaction_seconds(conn)
        except SQLAlchemyError as exc:
            log.warning("metrics: the database did not answer: %s", type(exc).__name__)
            return families
        if age is not None:
            oldest_transaction.add_metric([], age)
            families.append(oldest_transaction)
        return families


bp = Blueprint("metrics", __name__)


def metrics_of(app: Flask) -> QueueMetrics:
    metrics: QueueMetrics = app.extensions["queuelog_metrics"]
    return metrics


@bp.get("/metrics")
@documented("Prometheus metrics, in its text format (admin key unless "
            "QUEUELOG_METRICS_PUBLIC=1).",
            replies=[Reply(200, "The metrics.", text_media_types=(
                "text/plain", "application/openmetrics-text"))])
def scrape() -> Response:
    if not current_app.config["METRICS_PUBLIC"]:
        caller = authenticate()
        if caller.role is not Role.ADMIN:
            raise Forbidden(f"A {caller.role.value} key may not read metrics.")
    body, content_type = metrics_of(current_app).render(request.headers.get("Accept"))
    return Response(body, content_type=content_type)


# What /openapi.json says of who may scrape: an admin key (unless the operator made it public).
scrape.allowed_roles = frozenset({Role.ADMIN})  # type: ignore[attr-defined]


def init_metrics(app: Flask, metrics: QueueMetrics) -> None:
    services = app.extensions["queuelog"]
    metrics.add_scrape_collector(QueueGauges(services.types, app.config["JOB_TYPES"],
                                             services.db, services.jobs.cascades.under_way))
    services.jobs.maintenance.on_failure.append(metrics.count_maintenance_failure)
    app.register_blueprint(bp)
