"""The per-type gauges and the flow-control skip counter on /metrics."""

from __future__ import annotations

from typing import Any

import pytest

from tests.ops.test_metrics import scrape


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    # The gauges share GET /types' counts, which the PATCHes below count first: counted on
    # every request here, so that the scrape sees what the test just did.
    return {**app_config, "TYPE_COUNTS_MAX_AGE_SECONDS": 0}


def test_per_type_gauges_and_skips_counted_only_when_due_work_was_held_back(
        api: Any, client: Any, clock: Any, producer: Any, worker: Any, admin: Any) -> None:
    client.patch("/types/pdf", json={"paused": True}, headers=admin.headers)
    client.patch("/types/sync", json={"max_running_per_key": 1}, headers=admin.headers)
    assert api.claim(worker).status_code == 204  # pdf paused but holds nothing: no skip
    api.enqueue(producer, type="pdf")
    for _ in range(2):
        api.enqueue(producer, type="sync", concurrency_key="k")
    api.enqueue(producer, type="email", delay_seconds=60)
    clock.advance(3)

    assert api.claim(worker).json["type"] == "sync"
    assert api.claim(worker).status_code == 204  # pdf paused, key k full

    metrics = scrape(client, admin)
    assert metrics.value("queuelog_type_pending_jobs", type="pdf") == 1
    assert metrics.value("queuelog_type_pending_jobs", type="sync") == 1
    assert metrics.value("queuelog_type_pending_jobs", type="email") == 1  # scheduled
    assert metrics.value("queuelog_type_running_jobs", type="sync") == 1
    assert metrics.value("queuelog_type_oldest_claimable_age_seconds", type="pdf") == 3
    assert metrics.value("queuelog_type_oldest_claimable_age_seconds", type="email") == 0
    assert metrics.value("queuelog_flow_skipped_claims_total", type="pdf",
                         reason="paused") == 2
    assert metrics.value("queuelog_flow_skipped_claims_total", type="sync",
                         reason="max_running_per_key") == 1
