"""What the database server itself says of its sessions: read by /metrics and /readyz, never
on a request's path to the jobs, whose latency must not depend on the server's
bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, func, select, text

from app.core.clock import EPOCH
from app.storage.dialects import is_sqlite
from app.storage.listener import CHANNEL

# The oldest transaction holding a snapshot, in any database of the server: its xmin is the
# horizon below which VACUUM removes no dead row version, and the dead versions that updates
# and deletes of jobs leave behind pile up for the claim's scans to step over. The horizon of
# the jobs tables is set by their own database's sessions, but a cluster serves several
# databases and the operator's question is "which session holds it": any database is shown.
# Client backends only: an autovacuum worker's xmin holds back no other VACUUM. Our own
# session is left out (this very read holds a snapshot). A role without pg_read_all_stats
# sees other roles' sessions with a NULL xact_start, which max() passes over.
_OLDEST_TRANSACTION = text(
    "SELECT coalesce(extract(epoch FROM max(statement_timestamp() - xact_start)), 0) "
    "FROM pg_stat_activity "
    "WHERE backend_xmin IS NOT NULL AND backend_type = 'client backend' "
    "AND pid <> pg_backend_pid()")


def oldest_transaction_seconds(conn: Connection) -> float | None:
    """How long the oldest open transaction holding a snapshot has run, in seconds (0.0 when
    none does); None on SQLite, whose readers hold back nothing of the kind."""
    if is_sqlite(conn):
        return None
    return max(0.0, float(conn.execute(_OLDEST_TRANSACTION).scalar_one()))


@dataclass(frozen=True)
class HorizonHolder:
    """A session, prepared transaction, replication slot or standby that holds the xmin
    horizon back. Any field but `kind` may be None: a role without pg_read_all_stats reads
    other roles' sessions with most columns NULL, and a slot has no pid, user or time."""

    kind: str  # TRANSACTION, PREPARED, SLOT or STANDBY
    pid: int | None
    name: str | None  # a slot's name, a prepared transaction's gid
    database: str | None
    user: str | None
    application_name: str | None
    client_addr: str | None
    state: str | None
    since_us: int | None  # when what holds it began (xact_start, prepared); None if unknown
    seconds: float | None  # how long since then, by the server's clock
    xmin_age: int | None  # how many transactions the horizon is held behind
    xmin: str | None  # the transaction id it holds (a slot's: xmin/catalog_xmin)


TRANSACTION = "transaction"
PREPARED = "prepared transaction"
SLOT = "replication slot"
STANDBY = "standby"

# Every holder in one statement over the server's statistics views, each a few rows: cheap
# enough for a request or a chore every 30 s, never on a claim's path.
# - Client backends whose snapshot (backend_xmin) or own transaction id (backend_xid) is set;
#   our own session is left out (this read holds a snapshot), and so are walsenders (shown as
#   standbys below) and autovacuum workers (VACUUM passes over their xmin).
# - Prepared transactions (PREPARE TRANSACTION left unresolved) hold it until committed or
#   rolled back, with no session to see in pg_stat_activity.
# - Replication slots hold it at their xmin (a physical slot's standby with
#   hot_standby_feedback) or catalog_xmin (logical decoding: the catalogs only). A slot has
#   no start time; `state` says whether a walsender uses it (an inactive slot is forgotten).
# - Standbys with hot_standby_feedback but no slot: the walsender's backend_xmin. The primary
#   does not see when the standby's query began, so no time is given.
# A column a role may not read comes back NULL; NULL times and ages sort last.
_HORIZON_HOLDERS = text(
    "SELECT kind, pid, name, database, username, application_name, client_addr, state, "
    "since, seconds, xmin_age, xmin FROM ("
    "  SELECT 'transaction' AS kind, pid, NULL::text AS name, datname::text AS database, "
    "    usename::text AS username, application_name, host(client_addr) AS client_addr, "
    "    state, xact_start AS since, "
    "    extract(epoch FROM statement_timestamp() - xact_start)::float8 AS seconds, "
    "    age(coalesce(backend_xmin, backend_xid))::bigint AS xmin_age, "
    "    coalesce(backend_xmin, backend_xid)::text AS xmin "
    "  FROM pg_stat_activity "
    "  WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) "
    "    AND backend_type = 'client backend' AND pid <> pg_backend_pid() "
    "  UNION ALL "
    "  SELECT 'prepared transaction', NULL, gid, database::text, owner::text, NULL, NULL, "
    "    NULL, prepared, extract(epoch FROM statement_timestamp() - prepared)::float8, "
    "    age(transaction)::bigint, transaction::text "
    "  FROM pg_prepared_xacts "
    "  UNION ALL "
    "  SELECT 'replication slot', active_pid, slot_name::text, database::text, NULL, NULL, "
    "    NULL, CASE WHEN active THEN 'active' ELSE 'inactive' END, NULL, NULL, "
    "    greatest(age(xmin), age(catalog_xmin))::bigint, "
    "    concat(xmin::text, '/', catalog_xmin::text) "
    "  FROM pg_replication_slots WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL "
    "  UNION ALL "
    "  SELECT 'standby', pid, NULL, NULL, usename::text, application_name, "
    "    host(client_addr), state, NULL, NULL, age(backend_xmin)::bigint, "
    "    backend_xmin::text "
    "  FROM pg_stat_replication WHERE backend_xmin IS NOT NULL"
    ") AS holders ORDER BY since NULLS LAST, xmin_age DESC NULLS LAST, pid NULLS LAST, name")

# Whether this role reads every session's columns (a superuser, or a member of
# pg_read_all_stats): without it other roles' transactions are invisible to the query above.
_SEES_EVERY_SESSION = text(
    "SELECT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')")


def horizon_holders(conn: Connection) -> list[HorizonHolder]:
    """Whatever holds PostgreSQL's xmin horizon back, oldest first (those without a time
    last, the furthest behind first); an empty list on SQLite, which has no such horizon."""
    if is_sqlite(conn):
        return []
    return [HorizonHolder(
        kind=row.kind, pid=row.pid, name=row.name, database=row.database, user=row.username,
        application_name=row.application_name or None, client_addr=row.client_addr,
        state=row.state,
        since_us=None if row.since is None else _micros(row.since),
        seconds=None if row.seconds is None else max(0.0, float(row.seconds)),
        xmin_age=row.xmin_age, xmin=row.xmin) for row in conn.execute(_HORIZON_HOLDERS)]


def sees_every_session(conn: Connection) -> bool | None:
    """Whether horizon_holders sees other roles' sessions; None on SQLite."""
    if is_sqlite(conn):
        return None
    return bool(conn.execute(_SEES_EVERY_SESSION).scalar_one())


def _micros(moment: datetime) -> int:
    return (moment - EPOCH) // timedelta(microseconds=1)


# The notice (on the listeners' channel) that a holder has held the horizon for a while: each
# listening process's claims then read from positions (app/jobs/domain/claim_positions.py).
# Not sent where this session sends no notices (QUEUELOG_NOTIFY off: nobody listens).
HORIZON_HELD = "horizon"
_TELL_HORIZON_HELD = select(func.pg_notify(CHANNEL, HORIZON_HELD)).where(
    func.coalesce(func.current_setting("queuelog.notify", True), "on") != "off")


def tell_horizon_held(conn: Connection) -> None:
    """Tell every listening host that the horizon is held (nothing on SQLite)."""
    if not is_sqlite(conn):
        conn.execute(_TELL_HORIZON_HELD)
