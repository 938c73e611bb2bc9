"""Thin handler of GET /stats (docs/OPERATIONS.md, The queue over time): admins only."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify

from app.core.callers import Role
from app.stats.models import Step
from app.stats.schemas import StatsQuerySchema, StatsSchema, represent_series
from app.stats.service import StatsService
from app.web.auth import require_roles
from app.web.http import load_query
from app.web.openapi import Reply, documented

bp = Blueprint("stats", __name__)

_query_schema = StatsQuerySchema()


@bp.get("/stats")
@documented("Per type and minute (or hour), the jobs enqueued, the attempts started and "
            "failed, the jobs completed, and the pending depth; kept 14 days.",
            query=StatsQuerySchema,
            replies=[Reply(200, "The buckets, oldest first.", StatsSchema)])
@require_roles(Role.ADMIN)
def get_stats() -> Response:
    query = load_query(_query_schema)
    stats: StatsService = current_app.extensions["queuelog"].stats
    series = stats.series(query.get("type"), start_us=query.get("from_"),
                          end_us=query.get("to"), step=Step(query["step"]))
    return jsonify(represent_series(series))
