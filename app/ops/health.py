"""GET /healthz (the process answers) and GET /readyz (the database answers, at the newest
migration): neither needs a key, orchestrators probe them without one. GET /health/database
(admins): who holds PostgreSQL's xmin horizon back."""

from __future__ import annotations

import functools
import logging
from datetime import UTC, datetime
from typing import Any

from flask import Blueprint, Response, current_app, jsonify
from sqlalchemy.exc import SQLAlchemyError

from app.config import configuration_warnings
from app.core.callers import Role
from app.core.errors import ServiceUnavailable
from app.jobs.usecases.maintenance import MaintenanceHealth
from app.ops.schemas import DatabaseHealthSchema, represent_database_health
from app.storage.activity import oldest_transaction_seconds
from app.storage.migrations import current_revision, head_revision
from app.web.auth import require_roles
from app.web.openapi import Reply, documented

log = logging.getLogger(__name__)

bp = Blueprint("health", __name__)


@functools.cache
def newest_revision() -> str | None:
    """The newest Alembic revision this release ships. Read from the scripts once per process:
    they cannot change under a running release."""
    return head_revision()


@bp.get("/healthz")
@documented("Liveness: the process answers (the database is not touched).",
            replies=[Reply(200, "The process is alive.")])
def healthz() -> Response:
    # Liveness only: touching the database here would get a healthy process restarted
    # whenever the database is slow, which only adds to the trouble.
    return jsonify(status="ok")


@bp.get("/readyz")
@documented("Readiness: the database answers and its schema is at the newest migration.",
            replies=[Reply(200, "Ready to serve; `warnings`, when present, says what will be "
                                 "refused until the operator fixes a setting, or what slows "
                                 "the service down (a long transaction on PostgreSQL, "
                                 "failing maintenance); `maintenance` shows the cascades "
                                 "under way, this process's failing chores, and whether "
                                 "this process leads the database's maintenance.")],
            errors=[503])
def readyz() -> Response:
    newest = newest_revision()
    services = current_app.extensions["queuelog"]
    try:
        with services.db.read() as conn:
            current = current_revision(conn)
            oldest_transaction = oldest_transaction_seconds(conn)
        cascades = services.jobs.cascades.under_way() if current == newest else (0, 0.0)
    except SQLAlchemyError as exc:
        # The class name only: a driver's message can carry the host, the user or the SQL.
        log.warning("readiness: the database did not answer: %s", type(exc).__name__)
        raise ServiceUnavailable("The database is not answering.",
                                 retry_after_seconds=5) from None
    if current != newest:
        raise ServiceUnavailable(
            f"The database schema is at revision {current or 'none'}, this release needs "
            f"{newest}; run 'queuelog db upgrade'.", retry_after_seconds=5)
    ready: dict[str, Any] = {"status": "ready", "revision": current}
    # Ready still: reads, claims and reports work, and a misconfigured release should be
    # told, not taken out of service. The warning says what does not work.
    warnings = configuration_warnings(current_app.config)
    limit = current_app.config["HORIZON_WARN_SECONDS"]
    if oldest_transaction is not None and oldest_transaction > limit:
        # Ready still: every request works, only slower, and taking the service out of the
        # load balancer would not end the transaction, which is someone else's session.
        warnings.append(
            f"A transaction has been open on the database server for {oldest_transaction:.0f} "
            f"s (over QUEUELOG_HORIZON_WARN_SECONDS, {limit:g}): it holds back "
            "the removal of dead rows, so claims slow down the longer it lasts. Find it in "
            "GET /health/database, which names it (or pg_stat_activity, the oldest "
            "xact_start), and end it.")
    ready["maintenance"] = maintenance_detail(services.jobs.maintenance, *cascades,
                                              leading=services.maintenance.leading)
    for chore, failure in ready["maintenance"]["failing"].items():
        # Ready still: requests never wait for maintenance, and another process (or this
        # one, after the backoff) may well get through.
        warnings.append(
            f"Maintenance ({chore}) has failed {failure['failures']} time(s) in a row in this "
            f"process ({failure['error']}); it is retried with a backoff. The log says more.")
    if warnings:
        ready["warnings"] = warnings
    return jsonify(ready)


@bp.get("/health/database")
@documented("Who holds PostgreSQL's xmin horizon back: the sessions, prepared transactions, "
            "replication slots and standbys that keep VACUUM from removing dead rows, "
            "oldest first.",
            replies=[Reply(200, "The engine, the oldest transaction's age, the threshold and "
                                "the holders (none on SQLite, which has no such horizon).",
                           DatabaseHealthSchema)])
@require_roles(Role.ADMIN)
def database_health() -> Response:
    # A database that does not answer is a 503 problem, as on every keyed route.
    report = current_app.extensions["queuelog"].horizon.report()
    return jsonify(represent_database_health(report))


def maintenance_detail(health: MaintenanceHealth, cascades: int,
                       oldest_cascade_seconds: float, *, leading: bool) -> dict[str, Any]:
    """/readyz's `maintenance`: whether this process leads the database's maintenance (one
    process does at a time), the cascades under way (every process's, from the database)
    and this process's failing chores."""
    return {
        "leader": leading,
        "cascades": {"under_way": cascades,
                     "oldest_seconds": round(oldest_cascade_seconds, 3)},
        "failing": {chore: {"since": datetime.fromtimestamp(failure.since, UTC)
                            .isoformat().replace("+00:00", "Z"),
                            "failures": failure.failures, "error": failure.error,
                            "held_back_jobs": failure.held_back}
                    for chore, failure in sorted(health.failing().items())},
    }
