"""A paused type on the dashboard: marked wherever its jobs are listed or shown (a jobs list's
rows, the list filtered to it, a job's page), and never counted as claimable (the overview's
oldest claimable job leaves it out; its own row says its oldest due job's wait, not as
claimable)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from flask.testing import FlaskClient

from app.core.clock import ManualClock
from tests.conftest import Api, Key

PAUSED_MARK = '<span class="paused"'


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    # The types' counts taken now, not from a snapshot up to 10 s old.
    return {**app_config, "TYPE_COUNTS_MAX_AGE_SECONDS": 0}


def _pause(client: FlaskClient, admin: Key, job_type: str) -> None:
    answer = client.patch(f"/types/{job_type}", headers=admin.headers, json={"paused": True})
    assert answer.status_code == 200, answer.get_json()


def _row(page: str, job_id: int) -> str:
    row = page[page.index(f'/ui/jobs/{job_id}"'):]
    return row[:row.index("</tr>")]


def _text(markup: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", markup)).strip()


def test_the_overviews_oldest_claimable_job_leaves_a_paused_types_jobs_out(
        signed_in: FlaskClient, client: FlaskClient, api: Api, producer: Key, admin: Key,
        clock: ManualClock) -> None:
    api.enqueue(producer, type="sync", payload={})
    clock.advance(600)
    api.enqueue(producer, type="email", payload={})
    clock.advance(60)
    before = _text(signed_in.get("/ui/").text)
    assert "Oldest claimable job: 11 min (sync)" in before

    _pause(client, admin, "sync")
    page = signed_in.get("/ui/").text

    said = _text(page)
    assert "Oldest claimable job: 1 min (email) (paused types left out" in said
    # The paused type's own row says how long its oldest due job waits, not as claimable.
    sync = page[page.index('<a href="/ui/jobs?type=sync">sync</a></th>'):]
    sync = sync[:sync.index("</tr>")]
    assert _text(re.search(r'<td class="oldest muted"[^>]*>(.*?)</td>', sync).group(1)) == (
        "none: paused (its oldest due job waits 11 min)")
    # Its page says the same.
    type_page = signed_in.get("/ui/types/sync").text
    assert _text(re.search(r'<td id="oldest"[^>]*>(.*?)</td>', type_page, re.S).group(1)) == (
        "none: paused (its oldest due job waits 11 min)")
    # Their live figures say it as the pages do (a poll would otherwise undo it).
    assert signed_in.get("/ui/live/overview").json["figures"]["type/sync/oldest"] == (
        "none: paused (its oldest due job waits 11 min)")
    assert signed_in.get("/ui/live/types/sync").json["figures"]["oldest"] == (
        "none: paused (its oldest due job waits 11 min)")
    # Every type paused: no job is claimable.
    _pause(client, admin, "email")
    assert "Oldest claimable job: none" in _text(signed_in.get("/ui/").text)


def test_a_paused_types_jobs_are_marked_in_the_list_and_on_their_pages(
        signed_in: FlaskClient, client: FlaskClient, api: Api, producer: Key,
        admin: Key) -> None:
    held = api.enqueue(producer, type="sync", payload={}).get_json()["id"]
    free = api.enqueue(producer, type="email", payload={}).get_json()["id"]
    page = signed_in.get("/ui/jobs").text
    assert PAUSED_MARK not in _row(page, held)

    _pause(client, admin, "sync")

    page = signed_in.get("/ui/jobs").text
    assert PAUSED_MARK in _row(page, held) and ">paused</span>" in _row(page, held)
    assert PAUSED_MARK not in _row(page, free)
    assert 'id="type-paused"' not in page  # the list is not filtered to it
    # Filtered to the paused type, the list says so above its rows.
    filtered = signed_in.get("/ui/jobs?type=sync").text
    note = re.search(r'<p class="note" id="type-paused">(.*?)</p>', filtered, re.S)
    assert note is not None and _text(note.group(1)) == (
        "Type sync is paused: no worker claims its jobs until it is resumed (Types).")
    assert 'id="type-paused"' not in signed_in.get("/ui/jobs?type=email").text
    # Its job's page, by its type and above its facts.
    job_page = signed_in.get(f"/ui/jobs/{held}").text
    assert "paused" in _text(re.search(r'<td id="job-type">(.*?)</td>', job_page).group(1))
    assert "no worker claims it until the type is resumed" in job_page
    other = signed_in.get(f"/ui/jobs/{free}").text
    assert 'id="type-paused"' not in other and PAUSED_MARK not in other
