"""A type's page says what protects it (docs/DASHBOARD.md): its circuit, where it stands and
what opened it, its retry budget, and a push type's deliveries at once to its origin."""

from __future__ import annotations

from typing import Any

from flask import Flask
from flask.testing import FlaskClient

from app.types.origin_repository import OriginFigure, OriginRepository
from tests.conftest import Key


def test_a_types_page_shows_its_circuit_budget_and_push_concurrency(
        signed_in: FlaskClient, app: Flask, client: FlaskClient, admin: Key) -> None:
    page = signed_in.get("/ui/types/email")
    assert '<td id="circuit">off</td>' in page.text
    assert "<td>off</td>" in page.text  # no retry budget
    client.patch("/types/email", headers=admin.headers, json={
        "circuit": {"min_attempts": 5}, "retry_budget": {"minimum": 3},
        "push": {"url": "https://svc.internal/jobs/email"}})
    page = signed_in.get("/ui/types/email").text
    assert "opens at 50% failed of at least 5 attempts in 60 s, probes after 30 s" in page
    assert "0.2 per first attempt + 3 retries per 60 s" in page
    assert "no dispatcher has delivered yet" in page

    client.patch("/types/email", headers=admin.headers, json={"circuit_state": "open"})
    services = app.extensions["queuelog"]
    services.db.run_write(lambda conn: OriginRepository(conn).save(
        [OriginFigure("https://svc.internal:443", 3, 8)], services.clock.now_us()))
    page = signed_in.get("/ui/types/email").text
    assert 'class="circuit-open paused">open</span>' in page
    assert "probe from" in page
    assert "3 of 8 deliveries at once to https://svc.internal:443" in page


def test_a_types_page_shows_its_aging_and_a_jobs_page_what_its_wait_has_earned(
        signed_in: FlaskClient, client: FlaskClient, admin: Key, producer: Key,
        clock: Any) -> None:
    assert '<td id="aging">off</td>' in signed_in.get("/ui/types/email").text
    client.patch("/types/email", headers=admin.headers, json={"aging_seconds": 3600})
    page = signed_in.get("/ui/types/email").text
    assert '<td id="aging">one level per 1 h of waiting, up to high</td>' in page
    job = client.post("/jobs", json={"type": "email", "priority": "low"},
                      headers=producer.headers).json
    clock.advance(3600 + 60)
    page = signed_in.get(f"/ui/jobs/{job['id']}").text
    assert "claimed as <strong>medium</strong> now, one level higher" in page
