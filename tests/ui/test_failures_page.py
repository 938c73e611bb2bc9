"""The dashboard's failures page (contract §19): each failure group with its counts, its
newest error shown as text, its failed attempts per hour over the last day as a chart, its
newest jobs, a type filter, and a button that retries the group's failed jobs (and only
those), behind the dashboard's CSRF check."""

from __future__ import annotations

import html
import re
from typing import Any

from flask.testing import FlaskClient
from markupsafe import escape

from app.core.clock import MICROS, ManualClock, to_rfc3339
from app.ui.present import utc
from tests.conftest import Api, Key
from tests.ui.conftest import csrf_of, post_form

HOSTILE_TIMEOUT = "<script>alert(1)</script> timeout after {ms} ms"
REFUSED = "connection refused by mail.example.com:25"
HOUR_US = 3600 * MICROS


def _fail(api: Api, producer: Key, worker: Key, error: str, *, job_type: str = "email",
          max_retries: int = 0, job_id: int | None = None) -> int:
    """Enqueue a job (unless given) and fail its next attempt with `error`; its id."""
    if job_id is None:
        job_id = int(api.enqueue(producer, type=job_type, payload={},
                                 max_retries=max_retries).get_json()["id"])
    claimed = api.claim(worker, types=[job_type]).get_json()
    assert claimed["id"] == job_id
    failed = api.fail(worker, job_id, lease_token=claimed["lease_token"], error=error,
                      retry_in_seconds=0)
    assert failed.status_code == 200, failed.get_json()
    return job_id


def _fingerprints(client: FlaskClient, admin: Key) -> dict[tuple[str, str], str]:
    """The groups' fingerprints as the API shows them, by (type, first word of the sample)."""
    shown = client.get("/failures", headers=admin.headers).get_json()["groups"]
    return {(group["type"], group["sample"].split()[0]): group["fingerprint"]
            for group in shown}


def _rows(page: str) -> list[str]:
    """The failures table's group rows, in order."""
    return re.findall(r'<tr class="failure-group".*?</tr>', page, flags=re.DOTALL)


def _row(page: str, fingerprint: str) -> str:
    [row] = [row for row in _rows(page) if f'data-fingerprint="{fingerprint}"' in row]
    return row


def _cell(row: str, name: str) -> str:
    found = re.search(rf'<td class="[^"]*\b{name}\b[^"]*"[^>]*>(.*?)</td>', row, flags=re.DOTALL)
    assert found is not None, name
    return found.group(1).strip()


def _status(api: Api, admin: Key, job_id: int) -> str:
    status: str = api.get(admin, job_id).get_json()["status"]
    return status


def test_the_page_lists_each_group_with_its_counts_and_its_error_as_text(
        signed_in: FlaskClient, api: Api, clock: ManualClock, producer: Key, worker: Key,
        admin: Key) -> None:
    first_at = clock.now_us()
    timeouts = [_fail(api, producer, worker, HOSTILE_TIMEOUT.format(ms=30012))]
    clock.advance(5)
    # Retried once, then failed for good: two attempts of the group, one job failed.
    timeouts.append(_fail(api, producer, worker, HOSTILE_TIMEOUT.format(ms=29876),
                          max_retries=1))
    _fail(api, producer, worker, HOSTILE_TIMEOUT.format(ms=31000), job_id=timeouts[-1])
    clock.advance(5)
    refused = _fail(api, producer, worker, REFUSED, job_type="pdf")
    prints = _fingerprints(signed_in, admin)

    answer = signed_in.get("/ui/failures")

    assert answer.status_code == 200
    page = answer.text
    assert '<a href="/ui/failures" aria-current="page">Failures</a>' in page
    # Most recently seen first.
    assert re.findall(r'<tr class="failure-group" data-type="(\w+)"', page) == ["pdf", "email"]
    email = _row(page, prints[("email", "<script>alert(1)</script>")])
    assert '<th scope="row">email</th>' in email
    assert (_cell(email, "count"), _cell(email, "jobs-failed")) == ("3", "2")
    # The worker's error is text: escaped, never markup; the newest one is the sample.
    assert _cell(email, "sample") == str(escape(HOSTILE_TIMEOUT.format(ms=31000)))
    assert "<script>" not in page
    # Each time as its age, the time in UTC its tooltip.
    first, last = to_rfc3339(first_at), to_rfc3339(first_at + 5 * MICROS)
    assert f'<time datetime="{first}" title="{utc(first)}">10 s ago</time>' in _cell(email, "when")
    assert f'<time datetime="{last}" title="{utc(last)}">5 s ago</time>' in email
    # Its newest jobs, newest first, each a link to the job's page.
    assert re.findall(r'<a href="/ui/jobs/(\d+)">', _cell(email, "newest-jobs")) == [
        str(timeouts[1]), str(timeouts[0])]
    pdf = _row(page, prints[("pdf", "connection")])
    assert _cell(pdf, "sample") == REFUSED
    assert (_cell(pdf, "count"), _cell(pdf, "jobs-failed")) == ("1", "1")
    assert f'<a href="/ui/jobs/{refused}">{refused}</a>' in pdf
    assert "No failures" not in page


def test_each_groups_chart_has_a_bar_an_hour_that_says_its_count(
        signed_in: FlaskClient, api: Api, clock: ManualClock, producer: Key, worker: Key,
        admin: Key) -> None:
    clock.advance(600)  # ten minutes into an hour
    earlier_hour = clock.now_us() // HOUR_US * HOUR_US
    _fail(api, producer, worker, HOSTILE_TIMEOUT.format(ms=1))
    # Late in an hour: still that hour's (an hour's count is never rounded to the next).
    clock.advance(2 * 3600 + 40 * 60)
    this_hour = clock.now_us() // HOUR_US * HOUR_US
    assert this_hour == earlier_hour + 2 * HOUR_US
    for ms in (2, 3):
        _fail(api, producer, worker, HOSTILE_TIMEOUT.format(ms=ms))
    [fingerprint] = _fingerprints(signed_in, admin).values()

    chart = _cell(_row(signed_in.get("/ui/failures").text, fingerprint), "chart")

    bars = re.findall(r'<rect [^>]*data-hour="([^"]+)" data-count="(\d+)"><title>([^<]+)</title>',
                      chart)
    assert len(bars) == 24
    counts = [int(count) for _hour, count, _title in bars]
    assert counts == [0] * 21 + [1, 0, 2]
    assert bars[-1][0] == to_rfc3339(this_hour) and bars[-3][0] == to_rfc3339(earlier_hour)
    assert bars[-1][2] == f"{utc(to_rfc3339(this_hour))[:16]} UTC: 2 failed attempts"
    assert bars[-3][2] == f"{utc(to_rfc3339(earlier_hour))[:16]} UTC: 1 failed attempt"
    # Read aloud as one picture: the counts, oldest first.
    assert ('aria-label="Failed attempts per hour over the last 24 hours, oldest first: '
            f'{", ".join(["0"] * 21)}, 1, 0, 2"') in chart
    # The busiest hour is the chart's full height; an hour without failures a line.
    heights = [int(h) for h in re.findall(r'<rect [^>]*height="(\d+)"', chart)]
    assert heights[-1] == 2 * heights[-3] and heights[-2] == 1


def test_the_type_filter_shows_that_types_groups_and_stays_after_a_retry(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key, admin: Key) -> None:
    _fail(api, producer, worker, HOSTILE_TIMEOUT.format(ms=1))
    pdf_job = _fail(api, producer, worker, REFUSED, job_type="pdf")
    prints = _fingerprints(signed_in, admin)

    page = signed_in.get("/ui/failures?type=pdf").text

    assert [row for row in _rows(page) if 'data-type="email"' in row] == []
    assert len(_rows(page)) == 1
    assert '<option value="pdf" selected>pdf</option>' in page
    assert "(type pdf)" in page
    answer = post_form(signed_in, "/ui/failures?type=pdf",
                       f"/ui/failures/pdf/{prints[('pdf', 'connection')]}/retry",
                       {"filtered": "1"})
    assert answer.status_code == 302
    assert answer.headers["Location"] == "/ui/failures?type=pdf"
    assert _status(api, admin, pdf_job) == "pending"
    # Unfiltered, both types' groups; a type with none says so.
    assert len(_rows(signed_in.get("/ui/failures").text)) == 2
    assert "No failures of this type." in signed_in.get("/ui/failures?type=sync").text
    too_long = signed_in.get("/ui/failures", query_string={"type": "x" * 101})
    assert too_long.status_code == 400
    assert "type: Length must be between 1 and 100." in too_long.text
    # PostgreSQL's text cannot hold NUL: the form says so, the database is never asked.
    with_nul = signed_in.get("/ui/failures", query_string={"type": "p\x00df"})
    assert with_nul.status_code == 400 and "type: Must not contain NUL" in with_nul.text


def test_failing_now_says_what_is_failed_now_beside_the_jobs_that_ever_failed(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key, admin: Key) -> None:
    jobs = [_fail(api, producer, worker, HOSTILE_TIMEOUT.format(ms=ms)) for ms in (1, 2, 3)]
    [fingerprint] = _fingerprints(signed_in, admin).values()
    row = _row(signed_in.get("/ui/failures").text, fingerprint)
    assert (_cell(row, "failing-now"), _cell(row, "jobs-failed")) == ("<strong>3</strong>", "3")
    # Retried, and two fail again with the same error: ever 5, now 2 (the third is pending).
    post_form(signed_in, f"/ui/failures/email/{fingerprint}/retry",
              f"/ui/failures/email/{fingerprint}/retry")
    for job_id in jobs[:2]:
        _fail(api, producer, worker, HOSTILE_TIMEOUT.format(ms=7), job_id=job_id)
    row = _row(signed_in.get("/ui/failures").text, fingerprint)
    assert (_cell(row, "failing-now"), _cell(row, "jobs-failed"), _cell(row, "count")) == (
        "<strong>2</strong>", "5", "5")
    # Its job failing again with another error is no longer this group's to retry.
    post_form(signed_in, f"/ui/failures/email/{fingerprint}/retry",
              f"/ui/failures/email/{fingerprint}/retry")
    _fail(api, producer, worker, REFUSED, job_id=jobs[0])
    row = _row(signed_in.get("/ui/failures").text, fingerprint)
    assert _cell(row, "failing-now") == "<strong>0</strong>"
    assert "nothing failed now" in row and "/retry" not in row


def test_a_groups_retry_asks_first_with_the_count_and_takes_its_failed_jobs_only(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key, admin: Key) -> None:
    timeouts = [_fail(api, producer, worker, HOSTILE_TIMEOUT.format(ms=ms)) for ms in (1, 2)]
    refused = _fail(api, producer, worker, REFUSED)
    # Failed first with a timeout, then for good with a refusal: its error is the refusal.
    moved_on = _fail(api, producer, worker, HOSTILE_TIMEOUT.format(ms=9), max_retries=1)
    _fail(api, producer, worker, REFUSED, job_id=moved_on)
    # Of the group, but already retried: pending, nothing to retry.
    again = _fail(api, producer, worker, HOSTILE_TIMEOUT.format(ms=3), max_retries=1)
    prints = _fingerprints(signed_in, admin)
    timeout_print = prints[("email", "<script>alert(1)</script>")]
    page = signed_in.get("/ui/failures").text
    action = f"/ui/failures/email/{timeout_print}/retry"
    # The page links to a confirmation, saying how many; no form retries from the list.
    row = _row(page, timeout_print)
    assert f'<a class="button" href="{action}">Retry 2…</a>' in row
    assert "<form" not in row

    confirm = signed_in.get(action)

    assert confirm.status_code == 200
    said = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", confirm.text))
    assert ("This sends back to pending, each with a fresh retry budget, 2 jobs of type email "
            "that are failed now with this error as their last.") in said
    assert str(escape(HOSTILE_TIMEOUT.format(ms=3))) in confirm.text
    assert ">Retry 2 jobs</button>" in confirm.text
    assert [_status(api, admin, job_id) for job_id in timeouts] == ["failed", "failed"]

    answer = post_form(signed_in, action, action)

    assert answer.status_code == 302 and answer.headers["Location"] == "/ui/failures"
    assert [_status(api, admin, job_id) for job_id in timeouts] == ["pending", "pending"]
    assert [_status(api, admin, job_id) for job_id in (refused, moved_on)] == [
        "failed", "failed"]
    assert _status(api, admin, again) == "pending"
    after = signed_in.get("/ui/failures").text
    assert '<li class="ok">2 jobs sent back to pending.</li>' in after
    # Nothing left to retry: the confirmation says so and offers no button.
    confirm = signed_in.get(action).text
    assert "there is nothing to retry" in confirm and "<button type=\"submit\">Retry" not in confirm
    post_form(signed_in, "/ui/failures", action)
    assert "0 jobs sent back to pending." in signed_in.get("/ui/failures").text
    assert _status(api, admin, refused) == "failed"


def test_a_filtered_pages_retry_comes_back_to_the_filtered_page(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key, admin: Key) -> None:
    _fail(api, producer, worker, REFUSED, job_type="pdf")
    [fingerprint] = _fingerprints(signed_in, admin).values()
    page = signed_in.get("/ui/failures?type=pdf").text
    link = html.unescape(re.search(r'<a class="button" href="([^"]+)"', page).group(1))
    assert link == f"/ui/failures/pdf/{fingerprint}/retry?filtered=1"
    confirm = signed_in.get(link).text
    assert 'name="filtered" value="1"' in confirm
    assert 'href="/ui/failures?type=pdf">Back to the failures</a>' in confirm
    answer = post_form(signed_in, link, link.split("?")[0], {"filtered": "1"})
    assert answer.headers["Location"] == "/ui/failures?type=pdf"


def test_a_retry_without_the_forms_csrf_token_is_refused(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key, admin: Key) -> None:
    job_id = _fail(api, producer, worker, HOSTILE_TIMEOUT.format(ms=1))
    [fingerprint] = _fingerprints(signed_in, admin).values()
    action = f"/ui/failures/email/{fingerprint}/retry"
    token = csrf_of(signed_in.get("/ui/failures").text)

    for data in ({}, {"csrf_token": "not-the-token"}, {"csrf_token": token[:-1]}):
        answer = signed_in.post(action, data=data)
        assert answer.status_code == 400, data
        assert "Form refused" in answer.text and "CSRF" in answer.text
    assert _status(api, admin, job_id) == "failed"
    # The same post with the page's token does it.
    assert signed_in.post(action, data={"csrf_token": token}).status_code == 302
    assert _status(api, admin, job_id) == "pending"


def test_a_retry_of_no_such_group_is_the_dashboards_not_found_page(
        signed_in: FlaskClient) -> None:
    for fingerprint in ("zzzz", "ABCDEF0123456789", "0123456789abcdeg"):
        answer = post_form(signed_in, "/ui/failures",
                           f"/ui/failures/email/{fingerprint}/retry")
        assert answer.status_code == 404, fingerprint
        assert "No such failure group." in answer.text
        confirm = signed_in.get(f"/ui/failures/email/{fingerprint}/retry")
        assert confirm.status_code == 404 and "No such failure group." in confirm.text
    assert signed_in.get("/ui/failures/email/0123456789abcdef/retry").status_code == 404


def test_without_failures_the_page_says_so(signed_in: FlaskClient) -> None:
    page = signed_in.get("/ui/failures").text
    assert "No failures." in page
    assert _rows(page) == [] and "<svg" not in page


def test_only_a_signed_in_admin_sees_the_page(client: FlaskClient, api: Api, producer: Key,
                                              worker: Key, admin: Key) -> None:
    _fail(api, producer, worker, HOSTILE_TIMEOUT.format(ms=1))
    answer: Any = client.get("/ui/failures")
    assert answer.status_code == 302 and answer.headers["Location"] == "/ui/sign-in"
    # A bearer key is no session: the dashboard is not the JSON API.
    answer = client.get("/ui/failures", headers=admin.headers)
    assert answer.status_code == 302 and answer.headers["Location"] == "/ui/sign-in"
