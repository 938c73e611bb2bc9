"""Hostile bodies on the schedule, push-setting, flow-limit and protection routes: each is a
4xx problem and stores nothing."""

from __future__ import annotations

import json

import pytest

_DEEP: dict = {"a": 1}
for _ in range(100):
    _DEEP = {"x": _DEEP}

CASES = [
    ("post", "/schedules", {"name": "n", "cron": "* * * * *",
                            "job": {"type": "email", "payload": _DEEP}}),
    ("post", "/schedules", {"name": "n", "cron": "\u0661 * * * *", "job": {"type": "email"}}),
    ("post", "/schedules", {"name": "n", "cron": "* * * * *", "job": {"type": "email"},
                            "bogus": 1}),
    ("post", "/schedules", {"name": "n" * 101, "cron": "* * * * *", "job": {"type": "email"}}),
    ("post", "/schedules", {"name": "n", "cron": "* * * * *", "timezone": "../../etc/passwd",
                            "job": {"type": "email"}}),
    ("patch", "/types/email", {"push": {"url": "https://x.example/a",
                                        "timeout_seconds": 10**30}}),
    ("patch", "/types/email", {"push": {"url": "file:///etc/passwd"}}),
    ("patch", "/types/email", {"push": {"url": "https://x.example/a", "bogus": 1}}),
    ("patch", "/types/email", {"max_running": 10**40}),
    ("patch", "/types/email", {"circuit": {"failure_ratio": 10**400}}),
    ("patch", "/types/email", {"circuit": {"min_attempts": "\u0662\u0660"}}),
    ("patch", "/types/email", {"circuit": _DEEP}),
    ("patch", "/types/email", {"circuit": {"cooldown_seconds": True}}),
    ("patch", "/types/email", {"circuit_state": "half_open"}),
    ("patch", "/types/email", {"circuit_state": "open"}),  # no circuit to open
    ("patch", "/types/email", {"retry_budget": {"ratio": -0.0001}}),
    ("patch", "/types/email", {"retry_budget": {"minimum": 10**19}}),
    ("patch", "/types/email", {"retry_budget": [1, 2]}),
    ("patch", "/schedules/%C3%A9", {"paused": True}),
]


@pytest.mark.parametrize(("method", "path", "body"), CASES)
def test_hostile_bodies_on_schedule_push_and_limit_routes_are_refused_with_a_problem(
        client, admin, method, path, body):
    headers = {"Authorization": f"Bearer {admin.token}", "Content-Type": "application/json"}
    answer = getattr(client, method)(path, data=json.dumps(body), headers=headers)
    assert 400 <= answer.status_code < 500
    assert answer.headers["Content-Type"].startswith("application/problem+json")
    assert client.get("/schedules", headers=headers).get_json()["schedules"] == []
    shown = client.get("/types/email", headers=headers).get_json()
    assert shown["push"] is None and shown["max_running"] is None
    assert shown["circuit"] is None and shown["retry_budget"] is None
