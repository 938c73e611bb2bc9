"""gunicorn's production settings for queuelog, read whenever gunicorn starts in this directory.

Every value has an environment override (below), so that a container, a test or a benchmark
can size the server without editing this file; gunicorn's own command-line flags and
GUNICORN_CMD_ARGS override both.

This file must stay free of `app` imports: the master process would then hold the
application's modules, every worker would inherit them, and a HUP would no longer load new
code. For the same reason the app is not preloaded (see preload_app).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import shutil
import tempfile
import time
from collections import defaultdict
from typing import Any


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return default if raw is None or not raw.strip() else int(raw)


def _default_bind() -> str:
    if os.environ.get("QUEUELOG_BIND"):
        return os.environ["QUEUELOG_BIND"]
    if os.environ.get("PORT"):
        # Platforms that hand out a PORT route to the container from outside: listen on all.
        return f"0.0.0.0:{int(os.environ['PORT'])}"
    # Nothing said: stay on loopback. The container image sets QUEUELOG_BIND=0.0.0.0:8000.
    return "127.0.0.1:8000"


bind = [address.strip() for address in _default_bind().split(",") if address.strip()]

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
# After SIGTERM, how long in-flight requests may take to finish: longer than the longest
# long poll (20 s). Give the container runtime a longer stop timeout than this (e.g.
# `docker stop -t 40`), or it kills the process before the requests are done.
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


# -- metrics across workers ------------------------------------------------------------------
#
# prometheus_client decides at import time whether metrics go to per-process files, by
# PROMETHEUS_MULTIPROC_DIR; so the variable is set here, while the configuration loads and
# before anything imports prometheus_client (a --preload would import the app before
# on_starting runs). Each master gets a fresh, empty directory: counts left from an earlier
# run would be added to this one's.

_METRICS_DIR = "PROMETHEUS_MULTIPROC_DIR"
_METRICS_DIR_OWNER = "QUEUELOG_METRICS_DIR_OWNER"
# Also named in app/ops/metrics.py (COMPACTION_LOCK): scrapes take it shared.
_COMPACTION_LOCK = "compaction.lock"
# Only these kinds add up across processes; queuelog keeps no gauges in worker memory.
_SUMMED_KINDS = ("counter", "histogram")


def _prepare_metrics_dir() -> str:
    if (os.environ.get(_METRICS_DIR_OWNER) == str(os.getpid())
            and os.path.isdir(os.environ.get(_METRICS_DIR, ""))):
        # The configuration is read again on HUP: the live workers' files stay.
        return os.environ[_METRICS_DIR]
    path = tempfile.mkdtemp(prefix="queuelog-metrics-")
    os.environ[_METRICS_DIR] = path
    os.environ[_METRICS_DIR_OWNER] = str(os.getpid())
    return path


_prepare_metrics_dir()


@contextlib.contextmanager
def _compaction_lock(path: str, wait_seconds: float = 1.0) -> Any:
    """Yields True once the lock is held, False when scrapes held it for `wait_seconds`: the
    master never blocks on a worker for long."""
    with open(os.path.join(path, _COMPACTION_LOCK), "a+b") as lock:
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    yield False
                    return
                time.sleep(0.01)
                continue
            yield True
            return


def compact_dead_workers(path: str, live_pids: set[int]) -> int:
    """Fold the counter and histogram files of processes no longer alive into one archive file
    per kind, and delete theirs. Returns how many files were folded.

    Without this, every recycled worker (max_requests) would leave its files behind, and
    every scrape would read all of them: a scrape's cost would grow for as long as the master
    lives.
    """
    from prometheus_client.mmap_dict import MmapedDict

    folded = 0
    with _compaction_lock(path) as locked:
        if not locked:
            return 0  # the next worker exit folds these too
        for kind in _SUMMED_KINDS:
            dead = []
            for name in glob.glob(os.path.join(path, f"{kind}_*.db")):
                pid = os.path.basename(name)[len(kind) + 1:-3]
                if pid.isdigit() and int(pid) not in live_pids:
                    dead.append(name)
            if not dead:
                continue
            archive = os.path.join(path, f"{kind}_archive.db")
            totals: dict[str, float] = defaultdict(float)
            for name in [archive, *dead] if os.path.exists(archive) else dead:
                for key, value, _timestamp, _pos in MmapedDict.read_all_values_from_file(name):
                    # A counter's or a histogram bucket's value in one process adds to the
                    # others' (buckets are stored per bucket, not cumulatively).
                    totals[key] += value
            fresh = os.path.join(path, f"{kind}_archive.tmp")
            with contextlib.suppress(FileNotFoundError):
                os.remove(fresh)
            merged = MmapedDict(fresh)
            try:
                for key, value in totals.items():
                    merged.write_value(key, value, 0.0)
            finally:
                merged.close()
            os.replace(fresh, archive)
            for name in dead:
                os.remove(name)
            folded += len(dead)
    return folded


def post_fork(server: Any, worker: Any) -> None:
    # Only reached with --preload: the app, and its engine, were built in the master. Drop the
    # pooled connections the child inherited without closing them (they are the parent's).
    application = getattr(server.app, "callable", None)
    services = getattr(application, "extensions", {}).get("queuelog")
    if services is not None:
        services.db.engine.dispose(close=False)


def child_exit(server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess

    path = os.environ[_METRICS_DIR]
    multiprocess.mark_process_dead(worker.pid, path)
    live = set(server.WORKERS) | {os.getpid()}
    try:
        compact_dead_workers(path, live)
    except Exception:  # the master must outlive a damaged metrics file
        server.log.exception("could not fold worker %s's metrics files", worker.pid)


def on_exit(server: Any) -> None:
    if os.environ.get(_METRICS_DIR_OWNER) == str(os.getpid()):
        shutil.rmtree(os.environ[_METRICS_DIR], ignore_errors=True)
