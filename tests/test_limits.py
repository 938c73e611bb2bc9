"""Each limit of app/core/limits.py, enforced where the API publishes it: a real app refuses
one past the maximum with a 422 naming the field, and takes the maximum itself (an answer
that may still refuse the request for another reason, but not with that refusal).

A limit added to the table fails here until it has a probe, or a reason it has none."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from app.core import limits
from app.core.clock import parse_rfc3339, to_rfc3339
from app.core.limits import LIMITS, Limit

Body = dict[str, Any]


@dataclass(frozen=True)
class Probe:
    """Where a limit is published: the request that carries `value`, and the field the 422
    names (as the problem's `errors` keys it)."""

    role: str
    method: str
    path: str
    field: str
    body: Callable[[Any], Body] | None = None
    query: Callable[[Any], Body] | None = None
    # Jobs enqueued first, so that a claim that passes its checks answers at once.
    pending_jobs: int = 0


def _text(n: int, letter: str = "x") -> str:
    return letter * n


_LEASE = {"lease_token": "t" * 64}
_SCHEDULE_JOB = {"type": "email"}
_WORKFLOW_JOB = {"ref": "only", "type": "email"}

PROBES: dict[str, Probe] = {
    "JOB_ID": Probe("worker", "POST", "/jobs/complete-many", "items.0.id",
                    body=lambda n: {"items": [{"id": n, **_LEASE}]}),
    "TYPE_CHARS": Probe("admin", "GET", "/jobs", "type", query=lambda n: {"type": _text(n)}),
    "NAME_CHARS": Probe("admin", "POST", "/schedules", "name", body=lambda n: {
        "name": _text(n), "cron": "0 3 * * *", "job": _SCHEDULE_JOB}),
    "KEY_CHARS": Probe("producer", "POST", "/jobs", "idempotency_key",
                       body=lambda n: {"type": "email", "idempotency_key": _text(n)}),
    "LEASE_TOKEN_CHARS": Probe("worker", "POST", "/jobs/1/heartbeat", "lease_token",
                               body=lambda n: {"lease_token": _text(n)}),
    "CURSOR_CHARS": Probe("admin", "GET", "/jobs", "cursor",
                          query=lambda n: {"cursor": _text(n)}),
    "ERROR_CHARS": Probe("worker", "POST", "/jobs/1/fail", "error",
                         body=lambda n: {**_LEASE, "error": _text(n)}),
    "CRON_CHARS": Probe("admin", "POST", "/schedules", "cron", body=lambda n: {
        "name": "nightly", "cron": "0" + " " * (n - 8) + "3 * * *", "job": _SCHEDULE_JOB}),
    "TIMEZONE_CHARS": Probe("admin", "POST", "/schedules", "timezone", body=lambda n: {
        "name": "nightly", "cron": "0 3 * * *", "timezone": _text(n), "job": _SCHEDULE_JOB}),
    "PUSH_URL_CHARS": Probe("admin", "PATCH", "/types/email", "push.url", body=lambda n: {
        "push": {"url": "http://push.example/" + _text(n - len("http://push.example/"))}}),
    "REF_CHARS": Probe("producer", "POST", "/workflows", "jobs.0.ref", body=lambda n: {
        "jobs": [{**_WORKFLOW_JOB, "ref": _text(n)}]}),
    "WORKFLOW_NAME_CHARS": Probe("producer", "POST", "/workflows", "name", body=lambda n: {
        "name": _text(n), "jobs": [_WORKFLOW_JOB]}),
    "TAGS": Probe("producer", "POST", "/jobs", "tags",
                  body=lambda n: {"type": "email", "tags": [f"tag-{i}" for i in range(n)]}),
    "TAG_CHARS": Probe("producer", "POST", "/jobs", "tags.0",
                       body=lambda n: {"type": "email", "tags": [_text(n)]}),
    "RETRIES": Probe("producer", "POST", "/jobs", "max_retries",
                     body=lambda n: {"type": "email", "max_retries": n}),
    "BATCH_JOBS": Probe("producer", "POST", "/jobs/batch", "jobs",
                        body=lambda n: {"jobs": [{"type": "email"}] * n}),
    "WORKFLOW_JOBS": Probe("producer", "POST", "/workflows", "jobs", body=lambda n: {
        "jobs": [{"ref": f"job-{i}", "type": "email"} for i in range(n)]}),
    # Jobs 1..100 exist (an admin may name any job): the maximum is stored, waiting.
    "DEPENDENCIES": Probe("admin", "POST", "/jobs", "depends_on", body=lambda n: {
        "type": "email", "depends_on": list(range(1, n + 1))}, pending_jobs=100),
    "CLAIM_JOBS": Probe("worker", "POST", "/jobs/claim-many", "max_jobs",
                        body=lambda n: {"max_jobs": n}),
    "INSTANCE_CHARS": Probe("worker", "POST", "/jobs/claim", "instance",
                            body=lambda n: {"instance": _text(n)}),
    "CLAIM_TYPES": Probe("worker", "POST", "/jobs/claim", "types",
                         body=lambda n: {"types": ["email"] * n}),
    "COMPLETE_ITEMS": Probe("worker", "POST", "/jobs/complete-many", "items", body=lambda n: {
        "items": [{"id": i + 1, **_LEASE} for i in range(n)]}),
    "BULK_JOBS": Probe("admin", "POST", "/jobs/cancel-many", "limit",
                       body=lambda n: {"type": "email", "limit": n}),
    "PAGE_ITEMS": Probe("admin", "GET", "/jobs", "limit", query=lambda n: {"limit": str(n)}),
    "TYPE_LIMIT": Probe("admin", "PATCH", "/types/email", "max_running",
                        body=lambda n: {"max_running": n}),
    "RATE": Probe("admin", "PATCH", "/types/email", "rate_per_second",
                  body=lambda n: {"rate_per_second": n}),
    "LEASE_SECONDS": Probe("worker", "POST", "/jobs/claim", "lease_seconds",
                           body=lambda n: {"lease_seconds": n}),
    "DELAY_SECONDS": Probe("producer", "POST", "/jobs", "delay_seconds",
                           body=lambda n: {"type": "email", "delay_seconds": n}),
    "UNIQUE_PERIOD_SECONDS": Probe("producer", "POST", "/jobs", "unique.period_seconds",
                                   body=lambda n: {"type": "email",
                                                   "unique": {"period_seconds": n}}),
    "RETRY_IN_SECONDS": Probe("worker", "POST", "/jobs/1/fail", "retry_in_seconds",
                              body=lambda n: {**_LEASE, "error": "x", "retry_in_seconds": n}),
    "CLAIM_WAIT_SECONDS": Probe("worker", "POST", "/jobs/claim", "wait_seconds",
                                body=lambda n: {"wait_seconds": n}, pending_jobs=1),
    "RESULT_WAIT_SECONDS": Probe("admin", "GET", "/jobs/1", "wait_seconds",
                                 query=lambda n: {"wait_seconds": f"{n:g}"}),
    "CONFIRM_WITHIN_SECONDS": Probe("producer", "POST", "/jobs", "reserve.confirm_within_seconds",
                                    body=lambda n: {"type": "email",
                                                    "reserve": {"confirm_within_seconds": n}}),
    "TIMEOUT_SECONDS": Probe("producer", "POST", "/jobs", "timeout_seconds",
                             body=lambda n: {"type": "email", "timeout_seconds": n}),
    "EXPIRES_IN_SECONDS": Probe("producer", "POST", "/jobs", "expires_in_seconds",
                                body=lambda n: {"type": "email", "expires_in_seconds": n}),
    # The worker holds no job 1: the maximum passes the schema and meets the 409 (or 404).
    "PROGRESS_MESSAGE_CHARS": Probe("worker", "POST", "/jobs/1/heartbeat", "message",
                                    body=lambda n: {**_LEASE, "message": _text(n)}),
    "PROGRESS_COUNT": Probe("worker", "POST", "/jobs/1/heartbeat", "progress.total",
                            body=lambda n: {**_LEASE, "progress": {"done": 0, "total": n}}),
    "RETENTION_SECONDS": Probe("admin", "PATCH", "/types/email", "retention.completed_seconds",
                               body=lambda n: {"retention": {"completed_seconds": n}}),
    # n minutes from a minute's start: n buckets of a minute.
    "STATS_BUCKETS": Probe("admin", "GET", "/stats", "from", query=lambda n: {
        "from": "2027-01-15T08:00:00Z",
        "to": to_rfc3339(parse_rfc3339("2027-01-15T08:00:00Z") + n * 60_000_000)}),
    "EVENT_NAME_CHARS": Probe("producer", "POST", "/events", "name",
                              body=lambda n: {"name": _text(n)}),
    "EVENT_KEY_CHARS": Probe("producer", "POST", "/events", "key",
                             body=lambda n: {"name": "order.paid", "key": _text(n)}),
    # The worker holds no job 1: the maximum passes the schema and meets the 404.
    "WAIT_SECONDS": Probe("worker", "POST", "/jobs/1/suspend", "seconds",
                          body=lambda n: {**_LEASE, "seconds": n}),
    "CIRCUIT_FAILURE_RATIO": Probe("admin", "PATCH", "/types/email", "circuit.failure_ratio",
                                   body=lambda n: {"circuit": {"failure_ratio": n}}),
    "CIRCUIT_MIN_ATTEMPTS": Probe("admin", "PATCH", "/types/email", "circuit.min_attempts",
                                  body=lambda n: {"circuit": {"min_attempts": n}}),
    "CIRCUIT_WINDOW_SECONDS": Probe("admin", "PATCH", "/types/email", "circuit.window_seconds",
                                    body=lambda n: {"circuit": {"window_seconds": n}}),
    "CIRCUIT_COOLDOWN_SECONDS": Probe("admin", "PATCH", "/types/email",
                                      "circuit.cooldown_seconds",
                                      body=lambda n: {"circuit": {"cooldown_seconds": n}}),
    "RETRY_BUDGET_RATIO": Probe("admin", "PATCH", "/types/email", "retry_budget.ratio",
                                body=lambda n: {"retry_budget": {"ratio": n}}),
    "RETRY_BUDGET_WINDOW_SECONDS": Probe("admin", "PATCH", "/types/email",
                                         "retry_budget.window_seconds",
                                         body=lambda n: {"retry_budget": {"window_seconds": n}}),
    "RETRY_BUDGET_MINIMUM": Probe("admin", "PATCH", "/types/email", "retry_budget.minimum",
                                  body=lambda n: {"retry_budget": {"minimum": n}}),
    "AGING_SECONDS": Probe("admin", "PATCH", "/types/email", "aging_seconds",
                           body=lambda n: {"aging_seconds": n}),
    "PUSH_TIMEOUT_SECONDS": Probe("admin", "PATCH", "/types/email", "push.timeout_seconds",
                                  body=lambda n: {"push": {"url": "http://push.example/",
                                                           "timeout_seconds": n}}),
}

# Limits no request field carries, and where each is held to instead (a limit of the CLI
# alone is in CLI_PROBES, below).
NOT_A_FIELD = {
    # An Authorization header: a longer token is refused as any token not ours, 401
    # (tests/test_hostile_input.py); the dashboard's sign-in field says it as maxlength.
    "TOKEN_CHARS",
    # The size of an answer, not of a request (tests/test_hostile_clients.py).
    "PAGE_BYTES",
    # How many slots one firing enqueues (tests/schedules).
    "CATCH_UP",
    # Not a refusal but a cut of what is stored (tests/test_redaction.py; the client's
    # worker sends no more: tests/client/test_wire_constants.py).
    "STORED_ERROR_CHARS",
    # A cut of what a failure group keeps of its newest error (tests/jobs/
    # test_failure_groups.py), not a refusal.
    "FAILURE_SAMPLE_CHARS",
}


def test_the_table_lists_each_limit_of_the_module_once_under_its_own_name():
    records = {name: value for name, value in vars(limits).items() if isinstance(value, Limit)}
    assert {limit.name: limit for limit in LIMITS} == records
    for limit in LIMITS:
        assert limit.min < limit.max, limit.name
        if limit.default is not None:
            assert limit.min <= limit.default <= limit.max, limit.name


def test_every_limit_has_a_probe_or_is_said_to_bound_no_field():
    names = [limit.name for limit in LIMITS]
    assert len(names) == len(set(names))
    assert set(names) == set(PROBES) | set(CLI_PROBES) | NOT_A_FIELD
    assert not (set(PROBES) | set(CLI_PROBES)) & NOT_A_FIELD


@pytest.mark.parametrize("limit", [limit for limit in LIMITS if limit.name in PROBES],
                         ids=lambda limit: limit.name)
def test_a_limit_refuses_one_past_its_maximum_and_takes_its_maximum(
        client, api, make_key, limit: Limit[Any]):
    probe = PROBES[limit.name]
    key = make_key(f"{probe.role}-limits", probe.role)
    if probe.pending_jobs:
        producer = make_key("producer-limits", "producer")
        for _ in range(probe.pending_jobs):
            assert api.enqueue(producer).status_code == 201

    def send(value: Any) -> Any:
        return client.open(probe.path, method=probe.method, headers=key.headers,
                           json=probe.body(value) if probe.body else None,
                           query_string=probe.query(value) if probe.query else None)

    over = send(limit.max + 1)
    assert over.status_code == 422, over.json
    refusal = over.json["errors"].get(probe.field)
    assert refusal and any(f"{limit.max}" in message for message in refusal), over.json

    at_most = send(limit.max)
    assert at_most.status_code < 500
    if at_most.status_code == 422:
        assert at_most.json["errors"].get(probe.field) != refusal


# Limits the CLI holds to (click ranges built from the table), each with a command that
# takes it; a type's limits are PATCH /types's too, and both refuse the same values.
CLI_PROBES: dict[str, list[str]] = {
    "TYPE_LIMIT": ["types", "set", "email", "--max-running"],
    "RATE": ["types", "set", "email", "--rate"],
    "BATCH_ROWS": ["purge", "--older-than", "30d", "--batch-size"],
}
API_FIELDS = {"TYPE_LIMIT": "max_running", "RATE": "rate_per_second"}


def _one_past(limit: Limit[Any]) -> list[Any]:
    below = limit.min - 1 if isinstance(limit.min, int) else limit.min / 2
    return [below, limit.max + 1]


@pytest.mark.parametrize("name", sorted(CLI_PROBES))
def test_the_cli_refuses_what_the_table_refuses_and_takes_its_bounds(runner, client, admin,
                                                                     name):
    limit = next(limit for limit in LIMITS if limit.name == name)
    for value in _one_past(limit):
        refused = runner.invoke(args=[*CLI_PROBES[name], f"{value}"])
        assert refused.exit_code == 2, refused.output
        assert f"{limit.max}" in refused.output
        if name in API_FIELDS:
            answer = client.patch("/types/email", json={API_FIELDS[name]: value},
                                  headers=admin.headers)
            assert answer.status_code == 422 and API_FIELDS[name] in answer.json["errors"]
    for value in (limit.min, limit.max):
        taken = runner.invoke(args=[*CLI_PROBES[name], f"{value}"])
        assert taken.exit_code == 0, taken.output
