"""Helpers of the schedule tests: a clock set to a given UTC time, and short API calls."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.core.clock import EPOCH, ManualClock, parse_rfc3339
from tests.conftest import Key


def micros(text: str) -> int:
    """Microseconds of an RFC 3339 time ('2026-03-29T01:00:00Z')."""
    return parse_rfc3339(text)


def utc(micros_value: int) -> str:
    moment = datetime.fromtimestamp(micros_value / 1_000_000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def set_clock(clock: ManualClock, text: str) -> None:
    clock.advance((micros(text) - clock.now_us()) / 1_000_000)


class Schedules:
    """Short calls for the schedule tests."""

    def __init__(self, app: Flask, client: FlaskClient, admin: Key) -> None:
        self.app = app
        self.client = client
        self.admin = admin

    @property
    def service(self) -> Any:
        return self.app.extensions["queuelog"].schedules

    def create(self, key: Key | None = None, **body: Any) -> Any:
        body.setdefault("name", "nightly")
        body.setdefault("job", {"type": "email", "payload": {"to": "ops"}})
        return self.client.post("/schedules", json=body, headers=(key or self.admin).headers)

    def patch(self, name: str, **body: Any) -> Any:
        return self.client.patch(f"/schedules/{name}", json=body, headers=self.admin.headers)

    def get(self, name: str) -> Any:
        return self.client.get(f"/schedules/{name}", headers=self.admin.headers)

    def fire(self) -> int:
        fired: int = self.service.fire_due()
        return fired

    def jobs(self) -> list[dict[str, Any]]:
        response = self.client.get("/jobs", query_string={"limit": 500},
                                   headers=self.admin.headers)
        return [job for job in response.get_json()["jobs"] if job["schedule"] is not None]

    def slots(self) -> list[str]:
        return [job["scheduled_for"][:19] + "Z" for job in self.jobs()]

    def run_until(self, clock: ManualClock, until: str, step_seconds: float) -> None:
        """Move the clock to `until` in steps, firing after each (as the ticker would)."""
        end = micros(until)
        while clock.now_us() < end:
            clock.advance(min(step_seconds, (end - clock.now_us()) / 1_000_000))
            self.fire()


@pytest.fixture
def schedules(app: Flask, client: FlaskClient, admin: Key) -> Schedules:
    return Schedules(app, client, admin)


__all__ = ["EPOCH", "Schedules", "micros", "set_clock", "utc"]
