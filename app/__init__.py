"""queuelog: a persistent background-job queue served over HTTP."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flask import Flask

from app.config import CONFIGURATION_WARNED, configuration_warnings, load_settings, normalise
from app.core.clock import Clock
from app.history.failures import FailureGroups
from app.history.service import HistoryService
from app.jobs.domain.ids import JobIdConverter
from app.jobs.domain.intake import IntakeRules
from app.jobs.domain.models import Backoff
from app.jobs.domain.settings import QueueSettings
from app.jobs.sql.counts import BacklogCounts
from app.jobs.timeline.recorder import HistoryRecorder
from app.jobs.timeline.stats_buffer import StatsBuffer
from app.jobs.timeline.stats_flusher import StatsFlusher
from app.jobs.tx.uow import CLAIMABLE, FINISHED, bind_jobs
from app.jobs.usecases.horizon_watch import HorizonWatch
from app.jobs.usecases.maintenance_loop import MaintenanceLoop
from app.jobs.usecases.retention import RetentionWindows
from app.jobs.usecases.service import JobService
from app.jobs.wake.host_wake import HostWake, wake_directory
from app.jobs.wake.waiting import JobSignal
from app.keys.service import KeyService
from app.ops import init_ops
from app.ops.metrics import QueueMetrics
from app.schedules.service import FiringSink, ScheduleService, ScheduleSettings
from app.stats.service import StatsService
from app.storage.engine import Database, database_identity, make_engine
from app.storage.leadership import leadership_of
from app.storage.uow import EventSink, UnitOfWork
from app.types.flow import FlowControl, SkipSink
from app.types.protection.retry_budget import RetryBudgets
from app.types.protection.tallies import Protection
from app.types.repository import key_modes_of
from app.types.service import TypeService
from app.types.settings_copy import TypeSettingsCopy
from app.web.auth import init_auth
from app.web.problems import register_error_handlers
from app.workflows.service import WorkflowService


@dataclass(frozen=True)
class Services:
    """What the factory builds once per process and the handlers and commands use."""

    db: Database
    clock: Clock
    jobs: JobService
    keys: KeyService
    counts: BacklogCounts
    types: TypeService
    history: HistoryService
    schedules: ScheduleService
    workflows: WorkflowService
    failures: FailureGroups
    stats: StatsService
    maintenance: MaintenanceLoop
    # Writes this process's stats counts once a second once started (start_stats_flusher).
    stats_flusher: StatsFlusher
    # The protected types' tallies and circuit moves (app/types/protection/tallies.py).
    protection: Protection
    type_settings: TypeSettingsCopy  # this process's copy of the job types' settings
    # This host's other processes of the database: their waiting requests' wakes.
    host: HostWake
    # Who holds PostgreSQL's xmin horizon: GET /health/database, the dashboard, a chore.
    horizon: HorizonWatch

    def close(self) -> None:
        """Stop the maintenance loop (giving its lead up), write the stats counts still
        kept, then close the database's connections (the end of a test; a served process's
        are stopped by gunicorn's worker_exit hook instead)."""
        self.maintenance.stop()
        self.stats_flusher.stop()
        self.protection.stop()
        self.db.engine.dispose()


def create_app(test_config: Mapping[str, Any] | None = None) -> Flask:
    """Build the app. `test_config` replaces settings read from QUEUELOG_ variables; it may
    also carry a CLOCK to read time from (tests move it by hand)."""
    # No static folder: Flask would otherwise route /static/<path:filename>, which is no
    # part of this API.
    app = Flask(__name__, instance_relative_config=True, static_folder=None)
    app.json.sort_keys = False  # type: ignore[attr-defined]
    # UTF-8 as it is: escaping every non-ASCII character as \uXXXX (12 bytes for one outside
    # the BMP) would triple a listing of non-Latin text.
    app.json.ensure_ascii = False  # type: ignore[attr-defined]
    app.url_map.converters["id"] = JobIdConverter
    # Werkzeug would answer these itself, outside the error handlers, in HTML: `/jobs//1`
    # with a redirect to `/jobs/1`, OPTIONS with an empty text/html 200. This API has no
    # such routes: they are 404 and 405 problems like every other unknown path or method.
    app.url_map.merge_slashes = False
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    app.config.update(load_settings())
    if test_config is not None:
        app.config.update(test_config)
    normalise(app.config)
    if not app.config.get("DATABASE_URL"):
        os.makedirs(app.instance_path, exist_ok=True)
        path = os.path.join(app.instance_path, "queuelog.sqlite3")
        app.config["DATABASE_URL"] = f"sqlite:///{path}"

    metrics = QueueMetrics.from_environment()
    app.extensions["queuelog"] = _build_services(app.config, on_event=metrics.count_job_event,
                                                 on_skip=metrics.count_flow_skip,
                                                 on_fired=metrics)
    init_ops(app, metrics)  # first: its request hooks wrap every other
    # What gunicorn's stop signals call to answer the long polls at once
    # (queuelog_gunicorn/shutdown.py, which imports nothing of the app).
    app.extensions["queuelog_end_waits"] = app.extensions["queuelog"].jobs.end_waits
    # What gunicorn's worker_exit hook stops, writing the worker's last counts.
    app.extensions["queuelog_stats_flusher"] = app.extensions["queuelog"].stats_flusher

    register_error_handlers(app)
    init_auth(app)
    from app.jobs.web.routes import bp as jobs_bp

    app.register_blueprint(jobs_bp)
    from app.jobs.web.wait_routes import bp as waits_bp

    app.register_blueprint(waits_bp)
    from app.types.routes import bp as types_bp

    app.register_blueprint(types_bp)
    from app.history.routes import bp as history_bp

    app.register_blueprint(history_bp)
    from app.history.failure_routes import bp as failures_bp

    app.register_blueprint(failures_bp)
    from app.stats.routes import bp as stats_bp

    app.register_blueprint(stats_bp)
    from app.schedules.routes import bp as schedules_bp

    app.register_blueprint(schedules_bp)
    from app.workflows.routes import bp as workflows_bp

    app.register_blueprint(workflows_bp)
    from app.ui import init_ui

    init_ui(app)
    from app.web.openapi import bp as openapi_bp

    app.register_blueprint(openapi_bp)
    from app.cli import register_commands

    register_commands(app)
    return app


def warn_about_configuration(app: Flask) -> None:
    """Log, on stderr (Flask's default handler, beside gunicorn's own messages), what the
    service will refuse because of its settings. Called where the app is served (wsgi.py,
    once per gunicorn worker), not by the factory: an operator's command run in a shell
    without the service's settings would only be told something untrue of the service.
    Under `queuelog serve`, which said them once before it started gunicorn, nothing."""
    if os.environ.get(CONFIGURATION_WARNED):
        return
    for warning in configuration_warnings(app.config):
        app.logger.warning("queuelog: %s", warning)


def start_scheduler(app: Flask) -> None:
    """Start this process's schedule ticker (app/schedules/ticker.py) unless
    QUEUELOG_SCHEDULER is off. Called where the app is served (wsgi.py, once per gunicorn
    worker), not by the factory: tests and operator commands fire nothing on their own."""
    if not app.config["SCHEDULER"] or "queuelog_ticker" in app.extensions:
        return
    from app.schedules.ticker import Ticker

    services = app.extensions["queuelog"]
    app.extensions["queuelog_ticker"] = Ticker(
        services.schedules, chores=[services.stats.chore()]).start()


def start_type_settings_refresh(app: Flask) -> None:
    """Keep this process's copy of the job types' settings fresh in a background thread
    (app/types/settings_copy.py). Called where the app is served (wsgi.py, the dispatcher),
    not by the factory: elsewhere the copy is read again on use once a second old."""
    app.extensions["queuelog"].type_settings.start()


def stop_scheduler(app: Flask) -> None:
    """Stop the ticker, letting a firing under way end (gunicorn's worker_exit hook)."""
    ticker = app.extensions.get("queuelog_ticker")
    if ticker is not None:
        ticker.stop()


def start_stats_flusher(app: Flask) -> None:
    """Start this process's stats flusher (app/jobs/timeline/stats_flusher.py) and the
    protected types' thread (app/types/protection/tallies.py) unless QUEUELOG_STATS is off.
    Called where the app is served (wsgi.py, once per gunicorn worker) and by the push
    dispatcher, not by the factory: tests and operator commands write what they counted when
    the stats are read or their services close."""
    if app.config["STATS"]:
        app.extensions["queuelog"].stats_flusher.start()
        app.extensions["queuelog"].protection.start()


def start_maintenance(app: Flask) -> None:
    """Start this process's maintenance loop (app/jobs/usecases/maintenance_loop.py), whatever
    QUEUELOG_SCHEDULER says: one process per database leads it, and without a leader no
    lease would be rescued. Called where the app is served (wsgi.py), not by the factory:
    operator commands run no maintenance. (An app on a ManualClock runs a round each time
    the clock is moved, and starts no thread.)"""
    app.extensions["queuelog"].maintenance.start()


def stop_maintenance(app: Flask) -> None:
    """Stop the maintenance loop and give its lead up, letting a round under way end
    (gunicorn's worker_exit hook): another process takes the lead at its next try. A
    listening session ends too, and another process of the host listens in its place."""
    app.extensions["queuelog"].maintenance.stop()
    listener = app.extensions.get("queuelog_listener")
    if listener is not None:
        listener.stop()


def _build_services(config: Mapping[str, Any], on_event: EventSink,
                    on_skip: SkipSink, on_fired: FiringSink) -> Services:
    engine = make_engine(
        config["DATABASE_URL"],
        pool_size=config["DB_POOL_SIZE"],
        pool_timeout=config["DB_POOL_TIMEOUT_SECONDS"],
        sqlite_synchronous=config["SQLITE_SYNCHRONOUS"],
        sqlite_busy_timeout_ms=config["SQLITE_BUSY_TIMEOUT_MS"],
        notify=config["NOTIFY"],
        prepared_statements=config["DB_PREPARED_STATEMENTS"],
    )
    db = Database(engine, counting_reads=config["COUNTING_READS"])
    clock = config.get("CLOCK") or Clock()
    settings = QueueSettings(
        job_types=config["JOB_TYPES"],
        lease_seconds=config["LEASE_SECONDS"],
        max_payload_bytes=config["MAX_PAYLOAD_BYTES"],
        backoff=Backoff(config["RETRY_BACKOFF_SECONDS"], config["RETRY_BACKOFF_MAX_SECONDS"]),
        bulk_batch_size=config["BULK_BATCH_SIZE"],
        max_waiting_claims=config["MAX_WAITING_CLAIMS"],
        max_waiting_requests=config["MAX_WAITING_REQUESTS"],
        check_url_prefixes=config["CHECK_URL_ORIGINS"],
        event_keep_seconds=config["EVENT_KEEP_SECONDS"],
    )
    keys = KeyService(db, clock, check_url_prefixes=config["CHECK_URL_ORIGINS"])
    counts = BacklogCounts(db, clock, config["TYPE_COUNTS_MAX_AGE_SECONDS"])
    type_settings = TypeSettingsCopy(db, clock)
    flow = FlowControl(db, clock, on_skip=on_skip, settings_copy=type_settings)
    # The sibling processes on this host (gunicorn's other workers) wake each other's
    # waiting requests; other hosts' changes are noticed by the waiters' peeks.
    host = HostWake(wake_directory(database_identity(config["DATABASE_URL"])))
    # Told when a job may have finished: the reads waiting for one wake.
    finished = JobSignal(host, FINISHED)
    recorder = HistoryRecorder(events=config["JOB_EVENTS"], stats=config["STATS"])
    # Each committed job transaction's counts, written by the process once a second.
    stats_buffer = StatsBuffer(db)
    # The protected types' tallies and circuits, fed by the same counts.
    protection = Protection(db, clock, stats_buffer.slot, type_settings.snapshot,
                            type_settings.refresh)
    stats_buffer.watch(protection.observe)
    uow = UnitOfWork(db, bind_jobs(recorder, keys.confirm_live, clock, key_modes_of,
                                   type_settings.without_key_modes, stats=stats_buffer),
                     on_event=on_event, signals={FINISHED: finished.notify})
    jobs = JobService(uow, clock, settings, flow=flow, finished=finished,
                      claimable=JobSignal(host, CLAIMABLE),
                      retry_policy=RetryBudgets(type_settings.snapshot,
                                                protection.unflushed_firsts))
    # Jobs released by their last dependency's end wake the waiting claims, as an enqueue
    # does.
    uow.signals[CLAIMABLE] = jobs.signal.notify
    types = TypeService(db, clock, settings.job_types, counts,
                        push_origins=config["PUSH_ALLOWED_ORIGINS"],
                        retention_defaults=RetentionWindows(
                            config["RETENTION_COMPLETED_SECONDS"] or None,
                            config["RETENTION_FAILED_SECONDS"] or None,
                            config["RETENTION_CANCELLED_SECONDS"] or None))
    horizon = HorizonWatch(db, clock, config["HORIZON_WARN_SECONDS"])
    return Services(
        db=db,
        clock=clock,
        jobs=jobs,
        keys=keys,
        counts=counts,
        types=TypeService(db, clock, settings.job_types, counts,
                          push_origins=config["PUSH_ALLOWED_ORIGINS"],
                          retention_defaults=RetentionWindows(
                              config["RETENTION_COMPLETED_SECONDS"] or None,
                              config["RETENTION_FAILED_SECONDS"] or None,
                              config["RETENTION_CANCELLED_SECONDS"] or None),
                          settings_copy=type_settings),
        history=HistoryService(db, clock, jobs, keys, ahead_limit=config["EXPLAIN_AHEAD_LIMIT"],
                               told_events=config["JOB_EVENTS"]),
        schedules=ScheduleService(
            db, clock, jobs, IntakeRules(settings.job_types, settings.max_payload_bytes,
                        settings.check_url_prefixes),
            ScheduleSettings(allow_seconds=config["SCHEDULE_SECONDS"],
                             grace_seconds=config["SCHEDULE_GRACE_SECONDS"]),
            on_fired=on_fired),
        workflows=WorkflowService(jobs, clock),
        failures=FailureGroups(db, clock),
        stats=StatsService(db, clock, counts, settings.job_types, stats_buffer),
        stats_flusher=StatsFlusher(stats_buffer),
        protection=protection,
        maintenance=MaintenanceLoop(leadership_of(engine),
                                    [*jobs.maintenance_chores(types.retention_windows),
                                     horizon.chore()], clock),
        type_settings=type_settings,
        host=host,
        horizon=horizon,
    )
