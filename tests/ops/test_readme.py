"""The operator's documentation names every setting, override and metric there is:
docs/CONFIGURATION.md every QUEUELOG_ and GUNICORN_ variable, docs/OPERATIONS.md every metric."""

from __future__ import annotations

import re

from app.config import SETTINGS
from app.jobs.domain.transitions import JOB_METRICS
from app.ops.metrics import QueueGauges, QueueMetrics
from tests.servers import REPO_ROOT

CONFIGURATION = (REPO_ROOT / "docs" / "CONFIGURATION.md").read_text()
OPERATIONS = (REPO_ROOT / "docs" / "OPERATIONS.md").read_text()


def test_every_queuelog_setting_is_documented() -> None:
    missing = [s.variable for s in SETTINGS if f"`{s.variable}`" not in CONFIGURATION]
    assert not missing


def test_every_gunicorn_override_is_documented() -> None:
    conf = (REPO_ROOT / "queuelog_gunicorn" / "conf.py").read_text()
    variables = set(re.findall(r"GUNICORN_[A-Z_]+", conf))
    assert variables
    assert not [v for v in sorted(variables) if f"`{v}`" not in CONFIGURATION]


def test_every_metric_is_documented() -> None:
    exposed = {family.name for family in QueueGauges._families()}
    exposed |= {f"queuelog_jobs_{metric.value}_total" for metric in JOB_METRICS}
    rendered = QueueMetrics().render(None)[0].decode()
    exposed |= set(re.findall(r"^# TYPE (queuelog_\w+?_seconds) histogram", rendered, re.M))
    assert "queuelog_http_request_duration_seconds" in exposed
    missing = {name for name in exposed if f"`{name}`" not in OPERATIONS}
    assert not missing
