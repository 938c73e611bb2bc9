"""What the database server itself says of its sessions: read by /metrics and /readyz, never
on a request's path to the jobs, whose latency must not depend on the server's
bookkeeping."""

from __future__ import annotations

from sqlalchemy import Connection, text

from app.storage.dialects import is_sqlite

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
