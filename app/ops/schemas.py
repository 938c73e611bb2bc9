"""What GET /health/database answers, as marshmallow schemas for /openapi.json, and the
function that renders it."""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, fields, validate

from app.core.clock import to_rfc3339
from app.jobs.usecases.horizon_watch import HorizonReport
from app.storage.activity import PREPARED, SLOT, STANDBY, TRANSACTION, HorizonHolder

_DATE_TIME = {"format": "date-time"}
NO_HORIZON = ("SQLite has no xmin horizon: its readers hold back no removal of dead rows, so "
              "nothing is listed.")


class HorizonHolderSchema(Schema):
    kind = fields.String(required=True, validate=validate.OneOf(
        [TRANSACTION, PREPARED, SLOT, STANDBY]), metadata={
        "description": "What holds the horizon: a session's transaction (its snapshot or "
                       "transaction id), a prepared transaction, a replication slot, or a "
                       "standby with hot_standby_feedback."})
    pid = fields.Integer(required=True, allow_none=True, metadata={
        "description": "The server process: pg_terminate_backend(pid) ends it. A slot's: the "
                       "walsender using it; null when none does, or for a prepared "
                       "transaction."})
    name = fields.String(required=True, allow_none=True, metadata={
        "description": "A replication slot's name, a prepared transaction's gid; else null."})
    database = fields.String(required=True, allow_none=True)
    user = fields.String(required=True, allow_none=True)
    application_name = fields.String(required=True, allow_none=True)
    client_addr = fields.String(required=True, allow_none=True, metadata={
        "description": "The client's address; null over a Unix socket."})
    state = fields.String(required=True, allow_none=True, metadata={
        "description": "A session's state (`idle in transaction`, `active`, …); a slot's "
                       "`active` or `inactive`; a standby's replication state."})
    since = fields.String(required=True, allow_none=True, metadata={
        **_DATE_TIME, "description": "When the transaction began (or was prepared); null "
                                     "for a slot or a standby, whose time the primary "
                                     "does not know."})
    seconds = fields.Float(required=True, allow_none=True, metadata={
        "description": "How long since `since`, by the database server's clock."})
    xmin_age = fields.Integer(required=True, allow_none=True, metadata={
        "description": "How many transactions the horizon is held behind by this holder."})


class DatabaseHealthSchema(Schema):
    engine = fields.String(required=True, validate=validate.OneOf(["sqlite", "postgresql"]))
    horizon = fields.Boolean(required=True, metadata={
        "description": "Whether the engine has an xmin horizon (PostgreSQL); false on "
                       "SQLite, whose holders are always none."})
    detail = fields.String(metadata={"description": "Present when `horizon` is false: why."})
    oldest_transaction_seconds = fields.Float(required=True, allow_none=True, metadata={
        "description": "How long the oldest transaction holding a snapshot has run, in any "
                       "session of the server (0 when none); null on SQLite."})
    threshold_seconds = fields.Float(required=True, metadata={
        "description": "QUEUELOG_HORIZON_WARN_SECONDS: past it a holder is logged and shown "
                       "on the dashboard."})
    sees_every_session = fields.Boolean(required=True, allow_none=True, metadata={
        "description": "Whether the service's role reads every role's sessions "
                       "(pg_read_all_stats); false: other roles' transactions and standbys "
                       "are missing from `holders`. Null on SQLite."})
    holders = fields.List(fields.Nested(HorizonHolderSchema), required=True, metadata={
        "description": "Oldest first; those without a time last, the furthest behind "
                       "first."})


def represent_holder(holder: HorizonHolder) -> dict[str, Any]:
    return {"kind": holder.kind, "pid": holder.pid, "name": holder.name,
            "database": holder.database, "user": holder.user,
            "application_name": holder.application_name, "client_addr": holder.client_addr,
            "state": holder.state, "since": to_rfc3339(holder.since_us),
            "seconds": None if holder.seconds is None else round(holder.seconds, 3),
            "xmin_age": holder.xmin_age}


def represent_database_health(report: HorizonReport) -> dict[str, Any]:
    shown: dict[str, Any] = {"engine": report.engine, "horizon": report.has_horizon}
    if not report.has_horizon:
        shown["detail"] = NO_HORIZON
    oldest = report.oldest_transaction_seconds
    shown.update({
        "oldest_transaction_seconds": None if oldest is None else round(oldest, 3),
        "threshold_seconds": report.threshold_seconds,
        "sees_every_session": report.sees_every_session,
        "holders": [represent_holder(holder) for holder in report.holders]})
    return shown
