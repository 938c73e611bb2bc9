"""gunicorn's production settings for queuelog: what `queuelog serve` runs gunicorn with
(`-c` this file's path), and what a `gunicorn wsgi:app` in the checkout reads through the
one-line gunicorn.conf.py there. It is inside the package so that a real install carries it.

Every value has an environment override (below), so that a container, a test or a benchmark
can size the server without editing this file; gunicorn's own command-line flags (after
`queuelog serve`) and GUNICORN_CMD_ARGS override both.

This file must stay free of `app` imports: the master process would then hold the
application's modules, every worker would inherit them, and a HUP would no longer load new
code. For the same reason the app is not preloaded (see preload_app). What the master needs
besides settings (the worker class, the metrics files' housekeeping, the addresses) lives in
queuelog_gunicorn, which imports nothing of the app.
"""

from __future__ import annotations

import gc
import os
from typing import Any

from queuelog_gunicorn import dispatch, multiprocess, shutdown
from queuelog_gunicorn.binding import configured_binds


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return default if raw is None or not raw.strip() else int(raw)


# QUEUELOG_BIND (several comma-separated), else 0.0.0.0:$PORT, else 127.0.0.1:8000: see
# queuelog_gunicorn/binding.py, which `queuelog serve` also asks before it starts gunicorn.
bind = configured_binds()

# Threads in each worker, not only processes. A request spends most of its time waiting:
# for SQLite's write lock and its fsync (synchronous=FULL), for PostgreSQL, and, once claims
# may long-poll, up to 20 s for a job to arrive. Threads wait cheaply; a waiting claim holds
# one thread, never a whole process, so the others keep answering. gthread also parks idle
# keep-alive connections in a poller instead of a thread.
# Our subclass of gthread's worker reads each request whole in that poller before a thread
# sees it, and drops one not whole within 10 s: gthread's own worker gives a thread to every
# connection that has sent a byte, so a few dozen clients that stop half-way through their
# headers would hold every thread and the service would answer no one.
worker_class = "queuelog_gunicorn.worker.BufferingThreadWorker"
# Processes give CPU parallelism (JSON, validation, hashing) past the GIL. More of them do
# not help SQLite, which admits one writer at a time: each extra process only adds waiters
# for its lock. Default: one per core, at most 4; raise it for PostgreSQL.
workers = _env_int("GUNICORN_WORKERS", min(os.cpu_count() or 1, 4))
# Enough for long-polling claims (up to 20 s each) plus the ordinary traffic beside them.
# Each thread holds a pooled database connection only while it talks to the database, so
# QUEUELOG_DB_POOL_SIZE (5, plus as many in overflow) need not match this number.
threads = _env_int("GUNICORN_THREADS", 16)

# How long the master lets a worker's main loop go silent before killing it. With gthread
# the main loop keeps reporting while requests run in threads, so a long poll never trips
# it: this catches a wedged process, not a slow request.
timeout = _env_int("GUNICORN_TIMEOUT", 30)
# After SIGTERM, how long in-flight requests may take to finish. Long polls do not count:
# a stop signal answers them at once (queuelog_gunicorn/shutdown.py). Give the container
# runtime a longer stop timeout than this (e.g. `docker stop -t 40`), or it may kill the
# process before a slow request is done.
graceful_timeout = _env_int("GUNICORN_GRACEFUL_TIMEOUT", 30)
# Producers and workers reuse connections; a few seconds covers a client's next call without
# keeping idle sockets around. Behind a load balancer, set it above the balancer's idle
# timeout so that the balancer, not gunicorn, closes idle connections.
keepalive = _env_int("GUNICORN_KEEPALIVE", 5)

# Recycle each worker after this many requests, so slow leaks (fragmentation, a cache that
# grows) cannot grow for ever; the jitter keeps all workers from restarting at the same time.
max_requests = _env_int("GUNICORN_MAX_REQUESTS", 10_000)
max_requests_jitter = _env_int("GUNICORN_MAX_REQUESTS_JITTER", 1_000)

# The longest legitimate request line is GET /jobs with four short query parameters; the
# headers are a bearer token, an idempotency key and what proxies add. Anything far larger is
# an attack or a mistake and is refused before the app sees it.
limit_request_line = _env_int("GUNICORN_LIMIT_REQUEST_LINE", 2048)
limit_request_fields = _env_int("GUNICORN_LIMIT_REQUEST_FIELDS", 50)
limit_request_field_size = _env_int("GUNICORN_LIMIT_REQUEST_FIELD_SIZE", 4096)

# Logs go to the process's own streams for the container runtime to collect; nothing is
# written to files inside the container. The app writes one JSON line per request to stdout
# (app/ops/logging.py), so gunicorn's access log would only repeat it, with the query string
# besides. gunicorn's own messages (boot, signals, worker deaths) go to stderr ("-").
accesslog = None
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOG_LEVEL", "info")

# The factory opens the database engine; loading the app in the master and forking would hand
# every worker copies of the same pooled connections. Each worker builds its own app instead
# (and a HUP loads new code). post_fork below still guards a --preload from the command line.
preload_app = False
# The heartbeat files gunicorn touches: on a container's overlay filesystem a write can stall
# and get a healthy worker killed; /dev/shm is memory. (gunicorn makes them with mkstemp.)
_SHARED_MEMORY = "/dev/shm"  # noqa: S108
if os.path.isdir(_SHARED_MEMORY):
    worker_tmp_dir = _SHARED_MEMORY
# gunicorn >= 25.1 opens a control socket by default under $HOME or $XDG_RUNTIME_DIR. Nothing
# here uses it, and two servers on one host would fight over the same path. (Older gunicorns
# ignore settings they do not know.)
control_socket_disable = True
proc_name = "queuelog"


# -- hooks ------------------------------------------------------------------------------------

# Metrics across workers: prometheus_client reads PROMETHEUS_MULTIPROC_DIR when it is imported,
# so the directory is named now, while this file loads, before any worker (or a --preload)
# imports it. Each master gets a fresh one.
multiprocess.prepare_directory()


def post_fork(server: Any, worker: Any) -> None:
    # Only reached with --preload: the app, and its engine, were built in the master. Drop the
    # pooled connections the child inherited without closing them (they are the parent's).
    application = getattr(server.app, "callable", None)
    services = getattr(application, "extensions", {}).get("queuelog")
    if services is not None:
        services.db.engine.dispose(close=False)


def post_worker_init(worker: Any) -> None:
    # The app is loaded: what it built on the way (modules, SQLAlchemy's and marshmallow's
    # structures) lives as long as the worker. Frozen, it is left out of the cyclic garbage
    # collector's full collections, which a batch request's allocations set off and which
    # otherwise walk all of it each time (a 1,000-job POST /jobs/batch: 68 → 55 ms in one
    # process; see bench/PROFILE.md). What is garbage now is collected first.
    gc.collect()
    gc.freeze()
    # A stop signal ends the app's long polls at once (queuelog_gunicorn/shutdown.py).
    shutdown.end_waits_on_stop(worker)


def worker_exit(server: Any, worker: Any) -> None:
    # The worker's schedule ticker lets a firing under way end before the process does, and
    # its maintenance loop a round, then gives the lead up at once rather than at its death;
    # last, its stats flusher writes the counts it still keeps (what those counted included).
    # (Reached through the loaded app: this file imports nothing of it.)
    extensions = getattr(getattr(worker, "wsgi", None), "extensions", {})
    ticker = extensions.get("queuelog_ticker")
    if ticker is not None:
        ticker.stop()
    services = extensions.get("queuelog")
    if services is not None:
        services.maintenance.stop()
    flusher = extensions.get("queuelog_stats_flusher")
    if flusher is not None:
        flusher.stop()


def when_ready(server: Any) -> None:
    # QUEUELOG_DISPATCH=1: the push dispatcher runs as this master's child (see
    # queuelog_gunicorn/dispatch.py for why here and how it stops).
    dispatch.start(server)


def child_exit(server: Any, worker: Any) -> None:
    dispatch.shutting_down(server)
    try:
        # The dispatcher's metrics files are live too: never folded while it runs.
        multiprocess.worker_exited(worker.pid, set(server.WORKERS) | {os.getpid()}
                                   | dispatch.live_pid())
    except Exception:  # the master must outlive a damaged metrics file
        server.log.exception("could not fold worker %s's metrics files", worker.pid)


def on_exit(server: Any) -> None:
    dispatch.stop()
    multiprocess.remove_directory()
