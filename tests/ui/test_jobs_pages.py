"""The jobs list and a job's page for an operator's first hour: a failed job's
error at the top once, the list in either order with both ways through its pages, its
columns and filters, bulk actions behind a confirmation, the dashboard's own not-found page,
and schedule times in the schedule's own zone."""

from __future__ import annotations

import html
import re
from typing import Any

from flask import Flask
from flask.testing import FlaskClient
from markupsafe import escape

from app.core.clock import ManualClock
from app.ui.present import utc
from tests.conftest import Api, Key
from tests.ui.conftest import post_form

TRACEBACK = ('Traceback (most recent call last):\n  File "worker.py", line 12, in send\n'
             "    smtp.send(message)\nConnectionRefusedError: smtp.example.com:25 said no")


def _failed(api: Api, producer: Key, worker: Key, error: str = TRACEBACK,
            job_type: str = "email") -> int:
    job_id = int(api.enqueue(producer, type=job_type, payload={}, max_retries=0)
                 .get_json()["id"])
    claimed = api.claim(worker).get_json()
    assert claimed["id"] == job_id
    api.fail(worker, job_id, error=error, lease_token=claimed["lease_token"])
    return job_id


def _ids(page: str) -> list[int]:
    return [int(found) for found in re.findall(r'<th scope="row"><a href="/ui/jobs/(\d+)"', page)]


def test_a_failed_jobs_error_is_at_the_top_of_its_page_once(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key) -> None:
    job_id = _failed(api, producer, worker)
    page = signed_in.get(f"/ui/jobs/{job_id}").text
    shown = str(escape(TRACEBACK))
    assert page.count(shown) == 1
    assert page.count("said no") == 1  # nor in another form (the event's JSON detail)
    assert page.index(shown) < page.index("<caption>The job</caption>")
    assert "Why it failed" in page
    # The attempt that failed points up to it rather than saying it again.
    attempts = page[page.index('id="attempts"'):]
    assert 'href="#error-heading"' in attempts and "ConnectionRefusedError" not in attempts


def test_the_jobs_list_shows_the_last_line_of_an_error(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key) -> None:
    _failed(api, producer, worker)
    page = signed_in.get("/ui/jobs").text
    assert "ConnectionRefusedError: smtp.example.com:25 said no" in page
    assert "Traceback" not in page


def _row(page: str, job_id: int) -> str:
    row = page[page.index(f'/ui/jobs/{job_id}"'):]
    return row[:row.index("</tr>")]


def test_the_jobs_list_gives_the_last_error_its_whole_line_and_drops_an_empty_progress(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key) -> None:
    # A last line longer than any cell: shown whole (the stylesheet clips it to one line
    # with an ellipsis, tests/ui/test_browser.py), and whole in its tooltip.
    line = ("SMTP 550: mailbox unavailable for recipient ada@example.com "
            + "(policy rejection by upstream relay) " * 6).strip()
    job_id = _failed(api, producer, worker, error=f"Traceback (most recent call last):\n{line}")
    page = signed_in.get("/ui/jobs").text
    cell = re.search(r'<td class="error-line" title="([^"]*)">([^<]*)</td>', _row(page, job_id))
    assert cell is not None
    assert html.unescape(cell.group(1)) == line and html.unescape(cell.group(2)) == line
    # No job of the page reported progress: no column for it.
    assert '<th scope="col">Progress</th>' not in page and 'class="progress"' not in page
    assert len(re.findall(r"<th scope=\"col\">", page)) == 10


def test_the_jobs_list_is_newest_first_with_pages_both_ways(
        signed_in: FlaskClient, client: FlaskClient, producer: Key) -> None:
    answer = client.post("/jobs/batch", headers=producer.headers,
                         json={"jobs": [{"type": "email", "payload": {"n": n}}
                                        for n in range(60)]})
    assert answer.status_code == 201
    first = signed_in.get("/ui/jobs").text
    assert _ids(first) == list(range(60, 10, -1))
    assert 'rel="prev"' not in first
    following = html.unescape(re.search(r'href="([^"]+)" rel="next"', first).group(1))
    second = signed_in.get(following).text
    assert _ids(second) == list(range(10, 0, -1)) and 'rel="next"' not in second
    back = html.unescape(re.search(r'href="([^"]+)" rel="prev"', second).group(1))
    again = signed_in.get(back).text
    assert _ids(again) == list(range(60, 10, -1))
    assert 'rel="prev"' not in again and 'rel="next"' in again
    oldest = signed_in.get("/ui/jobs?order=oldest").text
    assert _ids(oldest) == list(range(1, 51))
    following = html.unescape(re.search(r'href="([^"]+)" rel="next"', oldest).group(1))
    assert "order=oldest" in following
    second = signed_in.get(following).text
    assert _ids(second) == list(range(51, 61))
    back = html.unescape(re.search(r'href="([^"]+)" rel="prev"', second).group(1))
    assert _ids(signed_in.get(back).text) == list(range(1, 51))


def test_the_jobs_list_shows_when_each_job_runs_and_finished(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key,
        clock: ManualClock) -> None:
    job_id = api.enqueue(producer, type="email", payload={}).get_json()["id"]
    claimed = api.claim(worker).get_json()
    clock.advance(90)
    api.complete(worker, job_id, result={}, lease_token=claimed["lease_token"])
    finished = api.get(producer, job_id).get_json()["updated_at"]
    clock.advance(120)
    page = signed_in.get("/ui/jobs").text
    assert '<th scope="col">Runs at</th>' in page and '<th scope="col">Finished</th>' in page
    # Each time as its age, the time in UTC its tooltip: the row stays one line.
    row = _row(page, job_id)
    assert (f'<time datetime="{finished}" title="{utc(finished)}">2 min ago</time>'
            in row), row


def test_the_scheduled_filter_lists_the_pending_jobs_not_yet_due(
        signed_in: FlaskClient, api: Api, producer: Key) -> None:
    due = api.enqueue(producer, type="email", payload={}).get_json()["id"]
    later = api.enqueue(producer, type="email", payload={}, delay_seconds=3600).get_json()["id"]
    assert _ids(signed_in.get("/ui/jobs?status=scheduled").text) == [later]
    assert _ids(signed_in.get("/ui/jobs?status=pending").text) == [later, due]
    assert '<option value="scheduled" selected>' in signed_in.get(
        "/ui/jobs?status=scheduled").text


def test_bulk_retry_of_the_filtered_jobs_asks_first_and_needs_its_csrf_token(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key, admin: Key) -> None:
    failed = [_failed(api, producer, worker) for _ in range(3)]
    other = _failed(api, producer, worker, job_type="pdf")
    listing = signed_in.get("/ui/jobs?type=email&status=failed").text
    confirm = html.unescape(re.search(r'href="(/ui/jobs/retry-many[^"]*)"', listing).group(1))
    assert "cancel-many" not in listing  # a failed job cannot be cancelled
    page = signed_in.get(confirm).text
    # The count it takes, not the limit: the pdf job and the pending one are not counted.
    api.enqueue(producer, type="email", payload={})
    page = signed_in.get(confirm).text
    said = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", page))
    assert "Retry jobs?" in page and "1000" not in said and "1,000" not in said
    assert ("3 jobs are failed of type email now. This sends back to pending, "
            "each with a fresh retry budget, all 3;") in said, said
    assert ">Retry 3 jobs</button>" in page
    assert all(api.get(admin, job_id).get_json()["status"] == "failed" for job_id in failed)
    refused = signed_in.post("/ui/jobs/retry-many", data={"type": "email", "status": "failed"})
    assert refused.status_code == 400
    answer = post_form(signed_in, confirm, "/ui/jobs/retry-many",
                       {"type": "email", "status": "failed"})
    assert answer.status_code == 302
    assert "3 jobs sent back to pending." in signed_in.get(answer.headers["Location"]).text
    assert [api.get(admin, job_id).get_json()["status"] for job_id in failed] == ["pending"] * 3
    assert api.get(admin, other).get_json()["status"] == "failed"


def test_a_bulk_confirmation_counts_up_to_its_cap_and_says_what_its_limit_takes(
        signed_in: FlaskClient, client: FlaskClient, producer: Key, app: Flask,
        monkeypatch: Any) -> None:
    from app.ui import routes

    answer = client.post("/jobs/batch", headers=producer.headers,
                         json={"jobs": [{"type": "email", "payload": {}} for _ in range(12)]})
    assert answer.status_code == 201
    monkeypatch.setattr(routes, "BULK_COUNT_CAP", 20)
    monkeypatch.setattr(routes._bulk_schema.fields["limit"], "load_default", 5)
    said = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", signed_in.get(
        "/ui/jobs/cancel-many?type=email").text))
    assert "12 jobs are pending, suspended or waiting of type email now." in said, said
    assert "This cancels the oldest 5 of them (run it again for the rest);" in said
    monkeypatch.setattr(routes, "BULK_COUNT_CAP", 10)
    page = signed_in.get("/ui/jobs/cancel-many?type=email").text
    said = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", page))
    assert "More than 10 jobs are pending, suspended or waiting of type email now." in said
    assert ">Cancel 5 jobs</button>" in page
    # None found: nothing to do, and no button.
    page = signed_in.get("/ui/jobs/cancel-many?type=pdf").text
    assert "There is nothing to cancel." in page and "<button" not in page.split("<main>")[1]


def test_bulk_cancel_takes_the_pending_jobs_of_the_type(
        signed_in: FlaskClient, api: Api, producer: Key, admin: Key) -> None:
    ids = [api.enqueue(producer, type="email", payload={}).get_json()["id"] for _ in range(2)]
    answer = post_form(signed_in, "/ui/jobs/cancel-many?type=email", "/ui/jobs/cancel-many",
                       {"type": "email"})
    assert "2 jobs cancelled." in signed_in.get(answer.headers["Location"]).text
    assert {api.get(admin, job_id).get_json()["status"] for job_id in ids} == {"cancelled"}


def test_bulk_actions_are_offered_only_for_filters_they_can_take(
        signed_in: FlaskClient) -> None:
    for query in ("producer=producer-1", "status=scheduled", "status=completed",
                  "status=running"):
        page = signed_in.get(f"/ui/jobs?{query}").text
        assert "retry-many" not in page and "cancel-many" not in page, query
    assert "retry-many" in signed_in.get("/ui/jobs").text
    assert signed_in.get("/ui/jobs/explode-many").status_code == 404
    assert signed_in.get("/ui/jobs/retry-many?status=lost").status_code == 400


def test_a_path_under_ui_that_is_no_page_is_the_dashboards_own_not_found_page(
        signed_in: FlaskClient, client: FlaskClient) -> None:
    for browser in (signed_in, client):
        for path in ("/ui/jobs/abc", "/ui/nosuchpage", "/ui/jobs/1/nothing"):
            answer = browser.get(path)
            assert answer.status_code == 404, path
            assert answer.mimetype == "text/html", path
            assert "<h1>Not Found</h1>" in answer.text, path
        answer = browser.get("/ui/sign-out")
        assert answer.status_code == 405 and answer.mimetype == "text/html"
        assert "POST" in answer.headers["Allow"]
    assert client.get("/nosuchroute").mimetype == "application/problem+json"


def test_schedule_times_are_shown_in_the_schedules_own_zone_too(
        signed_in: FlaskClient, client: FlaskClient, admin: Key, app: Flask) -> None:
    answer = client.post("/schedules", headers=admin.headers, json={
        "name": "berlin", "cron": "0 3 * * *", "timezone": "Europe/Berlin",
        "job": {"type": "email", "payload": {}}})
    assert answer.status_code == 201
    next_run = answer.get_json()["next_run_at"]  # 03:00 in Berlin, in winter 02:00 UTC
    page = signed_in.get("/ui/schedules").text
    assert f'<time class="zoned" datetime="{next_run}">{next_run[:10]} 02:00:00 UTC</time>' \
        in page
    assert f"{next_run[:10]} 03:00:00 CET" in page


def test_the_tag_filter_lists_the_jobs_of_a_tag_and_the_job_page_shows_tags_and_trace(
        signed_in: FlaskClient, api: Api, producer: Key) -> None:
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    tagged = api.enqueue(producer, tags=["order:1001", "vip"],
                         headers={"traceparent": traceparent}).json["id"]
    other = api.enqueue(producer, tags=["vip"]).json["id"]
    api.enqueue(producer)
    page = signed_in.get("/ui/jobs?tag=order:1001").text
    assert f'/ui/jobs/{tagged}"' in page and f'/ui/jobs/{other}"' not in page
    assert "(filtered)" in page and 'value="order:1001"' in page
    both = signed_in.get("/ui/jobs?tag=vip").text
    assert f'/ui/jobs/{tagged}"' in both and f'/ui/jobs/{other}"' in both
    shown = signed_in.get(f"/ui/jobs/{tagged}").text
    assert ">order:1001</a>" in shown and ">vip</a>" in shown and traceparent in shown
    refused = signed_in.get("/ui/jobs", query_string={"tag": "x" * 65})
    assert refused.status_code == 400 and "tag:" in refused.text
