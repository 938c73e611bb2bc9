"""Every setting queuelog reads, its QUEUELOG_ variable, its default and its parser.

Nothing here runs at import time: `load_settings` is called by the app factory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from app.core.limits import DELAY_SECONDS, LEASE_SECONDS, RETENTION_SECONDS, RETRY_IN_SECONDS
from app.core.origins import push_origin


class ConfigError(ValueError):
    """A QUEUELOG_ variable holds a value the service cannot run with."""


def _int_in(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}")
        return value

    return parse


def _float_in(low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = float(text)
        if not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}")
        return value

    return parse


def _flag(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError("must be 1/0, true/false, yes/no or on/off")


def _retention(text: str) -> int:
    """Seconds within RETENTION_SECONDS, or 0: kept until purged by hand."""
    value = int(text)
    if value != 0 and not RETENTION_SECONDS.min <= value <= RETENTION_SECONDS.max:
        raise ValueError(f"must be 0 (keep) or between {RETENTION_SECONDS.min} and "
                         f"{RETENTION_SECONDS.max}")
    return value


def _job_types(text: str) -> frozenset[str]:
    return frozenset(part.strip() for part in text.split(",") if part.strip())


def _push_origins(text: str) -> frozenset[str]:
    origins = set()
    for part in (part.strip() for part in text.split(",")):
        if not part:
            continue
        origin = push_origin(part)
        bare = part.rstrip("/")
        if origin is None or "@" in bare or "/" in bare.split("://", 1)[-1] or "?" in bare:
            raise ValueError(f"{part!r} is not an origin: give scheme://host[:port] (http or "
                             "https), comma-separated")
        origins.add(origin)
    if not origins:
        raise ValueError("lists no origin; unset it to allow any")
    return frozenset(origins)


def _check_url_prefixes(text: str) -> tuple[str, ...]:
    prefixes = []
    for part in (part.strip() for part in text.split(",")):
        if not part:
            continue
        if push_origin(part) is None or "@" in part or "?" in part or "#" in part:
            raise ValueError(f"{part!r} is not a url prefix: give scheme://host[:port][/path] "
                             "(http or https), comma-separated")
        prefixes.append(part)
    if not prefixes:
        raise ValueError("lists no prefix; unset it to allow no check url")
    return tuple(prefixes)


def _listen_database_url(text: str) -> str:
    """A PostgreSQL URL (the listening session's), checked here rather than at a worker's boot;
    never echoed, since it may hold a password."""
    try:
        url = make_url(text)
    except ArgumentError:
        raise ValueError("is not a database URL") from None
    if url.drivername != "postgresql+psycopg":
        raise ValueError("must be a postgresql+psycopg:// URL (the listening session is "
                         "PostgreSQL's)")
    return text


def _sqlite_synchronous(text: str) -> str:
    value = text.strip().upper()
    if value not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
        raise ValueError("must be OFF, NORMAL, FULL or EXTRA")
    return value


# The Database's own default too (app/storage/engine.py), for engines built outside the app factory.
DEFAULT_COUNTING_READS = 3


@dataclass(frozen=True)
class Setting:
    key: str
    default: Any
    parse: Callable[[str], Any]
    help: str

    @property
    def variable(self) -> str:
        return f"QUEUELOG_{self.key}"


SETTINGS: tuple[Setting, ...] = (
    Setting("DATABASE_URL", None, str,
            "SQLAlchemy URL; default: a SQLite file queuelog.sqlite3 in the instance folder"),
    Setting("JOB_TYPES", frozenset(), _job_types,
            "comma-separated job types producers may enqueue; none until set"),
    Setting("LEASE_SECONDS", LEASE_SECONDS.default, _int_in(LEASE_SECONDS.min, LEASE_SECONDS.max),
            "default lease of a claim"),
    Setting("MAX_PAYLOAD_BYTES", 65_536, _int_in(2, 16 * 1024 * 1024),
            "largest payload or result, as compact UTF-8 JSON"),
    Setting("EVENT_KEEP_SECONDS", 86_400, _int_in(60, 31_536_000),
            "how long a posted event is kept: its Idempotency-Key holds, and one that woke "
            "nobody resumes the first wait for it (docs/WAITS.md)"),
    Setting("MAX_CONTENT_LENGTH", 1024 * 1024, _int_in(1024, 256 * 1024 * 1024),
            "largest request body (413 above)"),
    # At most what a worker may ask for in retry_in_seconds.
    Setting("RETRY_BACKOFF_SECONDS", 1.0, _float_in(0, RETRY_IN_SECONDS.max),
            "base of the exponential retry backoff"),
    # No further ahead than a job may be scheduled.
    Setting("RETRY_BACKOFF_MAX_SECONDS", 3600.0, _float_in(0, DELAY_SECONDS.max),
            "ceiling of the retry backoff"),
    Setting("METRICS_PUBLIC", False, _flag, "serve /metrics without an admin key"),
    Setting("JOB_EVENTS", True, _flag,
            "write each job's timeline of events (GET /jobs/{id}/events); attempts are "
            "always kept"),
    Setting("STATS", True, _flag,
            "count jobs per type and minute for GET /stats and the dashboard's charts"),
    Setting("MAX_WAITING_CLAIMS", 8, _int_in(0, 10_000),
            "long-polling claims a process lets wait at once; keep it below GUNICORN_THREADS "
            "so that waiting claims never take every thread"),
    Setting("TYPE_COUNTS_MAX_AGE_SECONDS", 10.0, _float_in(0, 3600),
            "GET /types, the dashboard and /metrics may show pending, scheduled, completed, "
            "failed and cancelled counts this old (counted again in the background; running "
            "counts are always live); 0 counts on every request"),
    Setting("EXPLAIN_AHEAD_LIMIT", 1_000, _int_in(1, 10_000_000),
            "explain's jobs_ahead reads at most this many pending jobs ahead of a job; "
            "past it the count says count_capped: true (a lower bound)"),
    Setting("COUNTING_READS", DEFAULT_COUNTING_READS, _int_in(1, 200),
            "reads that count the backlog (explain, the counts of GET /types, the dashboard, "
            "/metrics) a process runs at once; past it they answer 503 with Retry-After "
            "within half a second. Keep it below DB_POOL_SIZE, so that enqueues, claims and "
            "health checks always find a pooled connection"),
    Setting("BULK_BATCH_SIZE", 500, _int_in(1, 10_000),
            "jobs that one write transaction of a bulk retry or cancel (and of `queuelog "
            "purge`) takes at most: each batch commits on its own, so other writers wait for "
            "one batch at most, never for the whole action"),
    Setting("RETENTION_COMPLETED_SECONDS", 7 * 86_400, _retention,
            "completed jobs are removed (with their history) this long after they ended, "
            "unless their type sets its own retention; 0: kept until purged"),
    Setting("RETENTION_FAILED_SECONDS", 30 * 86_400, _retention,
            "the same for failed jobs"),
    Setting("RETENTION_CANCELLED_SECONDS", 7 * 86_400, _retention,
            "the same for cancelled jobs"),
    Setting("MAX_WAITING_REQUESTS", 4, _int_in(0, 10_000),
            "GET /jobs/{id}?wait_seconds requests a process lets wait at once for a job to "
            "finish (a budget of their own); past it they answer at once. Keep it plus "
            "MAX_WAITING_CLAIMS below GUNICORN_THREADS"),
    Setting("NOTIFY", True, _flag,
            "PostgreSQL: the database tells every host of each change (LISTEN/NOTIFY), so "
            "idle hosts send it nearly nothing and waiting requests wake at once; 0 has "
            "them peek instead, and sends no notification"),
    Setting("LISTEN_DATABASE_URL", None, _listen_database_url,
            "PostgreSQL: the URL of the host's listening session, if not "
            "QUEUELOG_DATABASE_URL: the server itself where requests go through PgBouncer in "
            "transaction mode (LISTEN and the maintenance lead's lock need a session)"),
    Setting("DB_PREPARED_STATEMENTS", True, _flag,
            "PostgreSQL: let the driver prepare the statements a connection sends often "
            "(psycopg's default, from a statement's fifth run); 0 where requests go through "
            "PgBouncer in transaction mode before 1.21, which cannot keep a prepared statement "
            "for its client (the listening session, which connects to the server itself, "
            "prepares as usual)"),
    Setting("SCHEDULER", True, _flag,
            "fire due schedules from each served process (a ticker thread started by wsgi.py "
            "under gunicorn); 0 leaves firing to other processes or hosts"),
    Setting("SCHEDULE_GRACE_SECONDS", 60.0, _float_in(0.5, 86_400),
            "a due slot older than this counts as missed and follows its schedule's "
            "catch_up; a younger one is late and always enqueues"),
    Setting("SCHEDULE_SECONDS", False, _flag,
            "accept six-field cron expressions, seconds first (sub-minute schedules: meant "
            "for tests and demonstrations)"),
    Setting("SQLITE_SYNCHRONOUS", "FULL", _sqlite_synchronous,
            "SQLite synchronous pragma; FULL means a 201 is on disk"),
    Setting("SQLITE_BUSY_TIMEOUT_MS", 30_000, _int_in(0, 600_000),
            "how long a SQLite writer waits for the lock before giving up"),
    Setting("DB_POOL_SIZE", 5, _int_in(1, 200), "connections kept per process"),
    Setting("DB_POOL_TIMEOUT_SECONDS", 10, _int_in(1, 600),
            "how long a request waits for a pooled connection"),
    Setting("HORIZON_WARN_SECONDS", 300.0, _float_in(0.1, 604_800),
            "PostgreSQL: the maintenance leader logs a WARNING, once per holder, for each "
            "transaction, prepared transaction, replication slot or standby that has held "
            "the xmin horizon (the removal of dead rows) this long; GET /health/database and "
            "the dashboard's overview name them, and /readyz warns (staying ready) while a "
            "transaction holding a snapshot has been open this long"),
    # The former name of the /readyz half of HORIZON_WARN_SECONDS, kept so that a
    # configuration that sets it still starts: read when HORIZON_WARN_SECONDS is not set.
    Setting("LONG_TRANSACTION_WARNING_SECONDS", None, _float_in(0.1, 604_800),
            "the former name of QUEUELOG_HORIZON_WARN_SECONDS, read when that is not set"),
    Setting("DISPATCH", False, _flag,
            "run the push dispatcher (`queuelog dispatch`) beside gunicorn: the gunicorn "
            "master starts it, stops it with itself and restarts it if it dies"),
    Setting("PUSH_ALLOWED_ORIGINS", None, _push_origins,
            "comma-separated scheme://host[:port] a push url may name (PATCH /types answers "
            "422 for another; a type set before is refused delivery); unset: any"),
    Setting("CHECK_URL_ORIGINS", (), _check_url_prefixes,
            "comma-separated url prefixes (scheme://host[:port][/path]) a reservation's check "
            "url must start with (POST /jobs and `queuelog keys` answer 422 or refuse "
            "another); unset: no check url is allowed, and reservations left unanswered are "
            "released at their deadline"),
    Setting("DISPATCH_CONCURRENCY", 16, _int_in(1, 256),
            "deliveries the dispatcher makes at once (its --concurrency default)"),
    Setting("CHECK_CONCURRENCY", 64, _int_in(1, 256),
            "reservation checks the dispatcher asks at once (each on a thread of its own)"),
    Setting("CHECK_ORIGIN_CONCURRENCY", 16, _int_in(1, 256),
            "of those, the most at one origin (scheme://host:port): a check url that hangs "
            "holds no more threads than this, and the checks of other origins go on"),
    Setting("CHECK_TIMEOUT_SECONDS", 5.0, _float_in(0.5, 60),
            "how long a check may take, connecting to reading the whole answer; then it is "
            "asked again after the backoff"),
    Setting("DISPATCH_GRACE_SECONDS", 20.0, _float_in(0, 900),
            "on SIGTERM, how long deliveries in flight may take to finish before they are "
            "released (claimable again at once)"),
)


def load_settings(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Read every QUEUELOG_ variable into a Flask config mapping, defaults filled in."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        raw = environ.get(setting.variable)
        if raw is None:
            values[setting.key] = setting.default
            continue
        try:
            values[setting.key] = setting.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{setting.variable}: {exc}") from None
    if (values["LONG_TRANSACTION_WARNING_SECONDS"] is not None
            and "QUEUELOG_HORIZON_WARN_SECONDS" not in environ):
        values["HORIZON_WARN_SECONDS"] = values["LONG_TRANSACTION_WARNING_SECONDS"]
    return values


# Set by `queuelog serve` once it has said the configuration's warnings, so that the gunicorn
# workers it starts, which inherit its environment, do not each say them again.
CONFIGURATION_WARNED = "QUEUELOG_CONFIGURATION_WARNED"


def configuration_warnings(config: Mapping[str, Any]) -> list[str]:
    """What the service can run with but will not work well with: logged when the app is
    built and shown by /readyz."""
    warnings = []
    counting, pool = config.get("COUNTING_READS"), config.get("DB_POOL_SIZE")
    if isinstance(counting, int) and isinstance(pool, int) and counting >= pool:
        warnings.append(f"QUEUELOG_COUNTING_READS ({counting}) is not below "
                        f"QUEUELOG_DB_POOL_SIZE ({pool}): requests that count the backlog "
                        "may take every pooled connection from enqueues and claims.")
    if not config.get("JOB_TYPES"):
        warnings.append("QUEUELOG_JOB_TYPES is not set: every enqueue is refused (422) and "
                        "every claim naming a type too. Set it to the job types producers "
                        "may enqueue, comma-separated (QUEUELOG_JOB_TYPES=email,report), and "
                        "restart.")
    return warnings


def normalise(config: dict[str, Any]) -> None:
    """Accept friendly forms from test configs (a list of job types, say)."""
    origins = config.get("PUSH_ALLOWED_ORIGINS")
    if isinstance(origins, str):
        config["PUSH_ALLOWED_ORIGINS"] = _push_origins(origins)
    prefixes = config.get("CHECK_URL_ORIGINS")
    if isinstance(prefixes, str):
        config["CHECK_URL_ORIGINS"] = _check_url_prefixes(prefixes)
    job_types = config.get("JOB_TYPES")
    if isinstance(job_types, str):
        config["JOB_TYPES"] = _job_types(job_types)
    elif job_types is not None and not isinstance(job_types, frozenset):
        config["JOB_TYPES"] = frozenset(job_types)
