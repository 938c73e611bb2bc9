"""The job record's rules without a database (the state machine's: test_transition_table.py)."""

from __future__ import annotations

import random

import pytest

from app.core.priorities import Priority
from app.core.statuses import claim_order_key
from app.jobs.domain.models import Backoff, Job
from app.storage.schema import jobs as jobs_table


def make_job(**changes) -> Job:
    fields = dict(
        id=1, type="email", payload="{}", priority=10, status="running", retry_count=0,
        max_retries=3, producer="p", idempotency_key=None, request_fingerprint=None,
        run_at=0, claimed_at=0, worker_id="w", lease_expires_at=100, lease_token="t",
        result=None, error=None, created_at=0, updated_at=0, unique_key=None,
        unique_scope=None, unique_while=None)
    return Job(**(fields | changes))


def test_job_fields_are_the_table_columns_in_order():
    # Rows are turned into Jobs positionally: the two must never drift apart. The table's
    # later columns (a cancel request and progress, docs/JOBS.md; a fair job's round among
    # its producer's keys, which only the claim's order reads) are not the record's.
    names = [c.name for c in jobs_table.columns]
    assert list(Job.__dataclass_fields__) == names[:len(Job.__dataclass_fields__)]
    assert names[len(Job.__dataclass_fields__):] == [
        "cancel_requested_at", "cancel_requested_by", "progress_done", "progress_total",
        "progress_message", "progress_at", "fair_key_round"]


@pytest.mark.parametrize("retry_count,expected", [(0, (0.5, 1)), (1, (1, 2)), (3, (4, 8)),
                                                  (12, (1800, 3600)), (200, (1800, 3600))])
def test_backoff_doubles_per_retry_within_half_to_full_and_stops_at_the_ceiling(
        retry_count, expected):
    backoff = Backoff(base_seconds=1, max_seconds=3600)
    rng = random.Random(7)
    draws = [backoff.delay_us(retry_count, rng) / 1e6 for _ in range(200)]
    assert expected[0] <= min(draws) and max(draws) <= expected[1]
    assert max(draws) - min(draws) > (expected[1] - expected[0]) / 4  # jitter spreads them


def test_is_held_by_needs_the_worker_a_live_lease_and_the_right_token():
    job = make_job()
    assert job.is_held_by("w", now_us=99, lease_token=None)
    assert job.is_held_by("w", now_us=99, lease_token="t")
    assert not job.is_held_by("w", now_us=100, lease_token=None)  # expired at 100
    assert not job.is_held_by("x", now_us=99, lease_token=None)
    assert not job.is_held_by("w", now_us=99, lease_token="old")
    assert not make_job(status="completed").is_held_by("w", now_us=99, lease_token=None)


@pytest.mark.parametrize("label,value", [("low", 0), ("MEDIUM", 10), (" high ", 20),
                                         ("Critical", 30)])
def test_priority_labels_map_to_spaced_integers(label, value):
    assert Priority.from_label(label) == value


def test_unknown_priority_label_is_refused():
    with pytest.raises(ValueError):
        Priority.from_label("urgent")


def test_claim_order_is_priority_then_age_then_id():
    rows = [make_job(id=3, priority=10, created_at=5), make_job(id=2, priority=20, created_at=9),
            make_job(id=1, priority=10, created_at=5), make_job(id=4, priority=10, created_at=1)]
    assert [job.id for job in sorted(rows, key=claim_order_key)] == [2, 4, 1, 3]
