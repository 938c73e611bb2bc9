"""Running queuelog in production: health and readiness probes, Prometheus metrics, the
JSON request log, and the optional OpenTelemetry spans."""

from __future__ import annotations

from flask import Flask

from app.ops.health import bp as health_bp
from app.ops.logging import init_request_log
from app.ops.metrics import QueueMetrics, init_metrics
from app.ops.tracing import init_tracing


def init_ops(app: Flask, metrics: QueueMetrics) -> None:
    """Wire the probes, /metrics and the request log into `app`.

    Called before any other blueprint registers request hooks: the request log's
    before_request then runs first and its after_request last, so it times and sees the
    whole request, error responses included. The spans' hooks (app/ops/tracing.py, only
    when the OTEL_* variables ask for them) come after it, inside its timing.
    """
    app.extensions["queuelog_metrics"] = metrics
    init_request_log(app, metrics)
    app.register_blueprint(health_bp)
    init_metrics(app, metrics)
    init_tracing(app)
