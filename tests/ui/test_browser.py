"""The dashboard in a real browser: Debian's chromium, headless, driven through its
chromedriver by selenium, against a real gunicorn server (two processes, so that a page may be
served by another process than the sign-in was) over a real database. Each page's screenshot
is written to a temporary folder, or to QUEUELOG_SCREENSHOTS_DIR when set (to refresh the
committed ones the README shows: QUEUELOG_SCREENSHOTS_DIR=docs/screenshots), so that a test
run leaves the checkout as it was.

In CI (CI=true) these run, never skip: .ci/run installs chromium and chromium-driver.
Elsewhere they skip only when the browser is not installed."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from app.core.clock import Clock
from app.keys.service import KeyService
from app.storage.engine import Database, make_engine
from tests.conftest import ENGINES
from tests.servers import REPO_ROOT, LiveServer, bearer, create_api_key

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# Where the README's screenshots are kept; written only when asked (QUEUELOG_SCREENSHOTS_DIR).
SCREENSHOTS_VARIABLE = "QUEUELOG_SCREENSHOTS_DIR"
HOSTILE = "<script>alert('payload')</script>"

_browser_missing = not (CHROMIUM.exists() and CHROMEDRIVER.exists())
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_browser_missing and os.environ.get("CI") != "true",
                       reason="chromium and chromium-driver are not installed (apt)"),
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--window-size=1440,1000", "--lang=en-US", "--disable-gpu"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(5)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(params=ENGINES)
def database_url(request: pytest.FixtureRequest, sqlite_template: str, tmp_path: Path) -> str:
    if request.param == "sqlite":
        path = tmp_path / "browser.sqlite3"
        shutil.copyfile(sqlite_template, path)
        return f"sqlite:///{path}"
    url: str = request.getfixturevalue("postgres_server").create_database()
    return url


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[LiveServer]:
    # Six-field (seconds) cron expressions, so that a schedule has fired within the test.
    live = LiveServer(database_url, log_path=tmp_path / "gunicorn.log", workers=2, threads=4,
                      settings={"SCHEDULE_SECONDS": "true"})
    try:
        yield live.start()
    finally:
        # Killed, not stopped: a graceful stop waits out its grace for the connections the
        # browser keeps open, and proves nothing here (tests/ops tests the graceful stop).
        live.kill()


def _revoke(database_url: str, name: str) -> None:
    engine = make_engine(database_url, pooled=False)
    try:
        KeyService(Database(engine), Clock()).revoke_key(name)
    finally:
        engine.dispose()


def _failed_job(server: LiveServer, producer: str, worker: str) -> int:
    enqueued = requests.post(server.url_of("/jobs"), headers=bearer(producer), timeout=10,
                             json={"type": "email", "max_retries": 0,
                                   "payload": {"to": "ada@example.com", "note": HOSTILE}})
    job_id: int = enqueued.json()["id"]
    claimed = requests.post(server.url_of("/jobs/claim"), headers=bearer(worker),
                            timeout=10).json()
    failed = requests.post(server.url_of(f"/jobs/{job_id}/fail"), headers=bearer(worker),
                           timeout=10, json={"error": "SMTP 550: mailbox unavailable",
                                             "lease_token": claimed["lease_token"]})
    assert failed.json()["status"] == "failed"
    return job_id


def _fired_schedules(server: LiveServer, admin: str) -> int:
    """Two schedules: `nightly-report`, which has fired once (its last job is that job's id,
    returned), and `hourly-sync`, paused, which never has."""
    created = requests.post(server.url_of("/schedules"), headers=bearer(admin), timeout=10,
                            json={"name": "nightly-report", "cron": "* * * * * *",
                                  "job": {"type": "pdf", "payload": {"report": "daily"}}})
    assert created.status_code == 201, created.text
    url = server.url_of("/schedules/nightly-report")
    deadline = time.monotonic() + 30
    while (last_job := requests.get(url, headers=bearer(admin),
                                    timeout=10).json()["last_job_id"]) is None:
        assert time.monotonic() < deadline, "the schedule never fired"
        time.sleep(0.2)
    # From now on a nightly schedule (the PATCH keeps its last run and job).
    changed = requests.patch(url, headers=bearer(admin), timeout=10,
                             json={"cron": "0 3 * * *", "timezone": "Europe/Berlin"})
    assert changed.json()["last_job_id"] == last_job
    requests.post(server.url_of("/schedules"), headers=bearer(admin), timeout=10,
                  json={"name": "hourly-sync", "cron": "@hourly", "paused": True,
                        "job": {"type": "sync", "payload": {"source": "crm"}}})
    job_id: int = last_job
    return job_id


def _schedule(server: LiveServer, admin: str, name: str) -> Any:
    return requests.get(server.url_of(f"/schedules/{name}"), headers=bearer(admin), timeout=10)


def _follow(browser: Any, element: Any) -> None:
    """Click a link or a form's button and wait for the page it leads to: a click returns
    before the browser has loaded the next page, and a check made in between (through the
    API, or of the old page's messages) would see the state before the click.

    The old page is marked in its own window object and the wait lasts until a document
    without the mark has loaded. Chromedriver may answer a command sent mid-navigation with
    an error of its own ("unhandled inspector error"), so such errors only mean "not yet"."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    browser.execute_script("window.queuelogOldPage = true;")
    element.click()
    WebDriverWait(browser, 30, ignored_exceptions=(WebDriverException,)).until(
        lambda driver: driver.execute_script(
            "return window.queuelogOldPage === undefined"
            " && document.readyState === 'complete';"))


def _sign_in(browser: Any, server: LiveServer, token: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(server.url_of("/ui/sign-in"))
    browser.find_element(By.ID, "token").send_keys(token)
    _follow(browser, browser.find_element(By.CSS_SELECTOR, "form.sign-in button[type=submit]"))


def _click_button(browser: Any, label: str) -> None:
    from selenium.webdriver.common.by import By

    _follow(browser, browser.find_element(By.XPATH, f"//button[normalize-space()='{label}']"))


def screenshots_directory(default: Path) -> Path:
    """QUEUELOG_SCREENSHOTS_DIR (relative to the checkout) when set, else `default`."""
    chosen = os.environ.get(SCREENSHOTS_VARIABLE)
    return REPO_ROOT / chosen if chosen else default


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return screenshots_directory(tmp_path_factory.mktemp("screenshots"))


def _shot(browser: Any, name: str, engine: str, directory: Path) -> None:
    # One set of screenshots, from the SQLite run (the pages look the same on both).
    if engine == "sqlite":
        directory.mkdir(parents=True, exist_ok=True)
        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(1440, max(700, min(int(height) + 40, 2400)))
        assert browser.save_screenshot(str(directory / f"{name}.png"))
        browser.set_window_size(1440, 1000)


def test_an_operator_signs_in_retries_a_failed_job_steers_types_and_schedules_and_signs_out(
        browser: Any, server: LiveServer, database_url: str, screenshots: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    engine = "sqlite" if database_url.startswith("sqlite") else "postgresql"
    producer = create_api_key(database_url, "shop", "producer")
    worker = create_api_key(database_url, "mailer", "worker")
    admin = create_api_key(database_url, "ops", "admin")
    job_id = _failed_job(server, producer, worker)
    requests.post(server.url_of("/jobs"), headers=bearer(producer), timeout=10,
                  json={"type": "pdf", "payload": {"invoice": 1042}})
    scheduled_job = _fired_schedules(server, admin)

    # Without a session every page leads to the sign-in page.
    browser.delete_all_cookies()
    browser.get(server.url_of("/ui/jobs"))
    assert browser.current_url == server.url_of("/ui/sign-in")
    _shot(browser, "sign-in", engine, screenshots)

    # A producer's token is refused, saying why.
    _sign_in(browser, server, producer)
    assert "A producer key may not use the dashboard" in browser.find_element(
        By.CSS_SELECTOR, "p.error").text
    assert browser.current_url == server.url_of("/ui/sign-in")

    # The admin signs in and sees the failed job counted on the overview.
    _sign_in(browser, server, admin)
    assert browser.current_url == server.url_of("/ui/")
    failed_link = browser.find_element(
        By.CSS_SELECTOR, "a[href='/ui/jobs?type=email&status=failed']")
    assert failed_link.text == "1"
    assert "mailer" in browser.find_element(By.TAG_NAME, "main").text
    # Schedules with their next and last run; the last job a link to its page.
    nightly = browser.find_element(By.XPATH, "//th[normalize-space()='nightly-report']/..").text
    assert "0 3 * * *" in nightly and "Europe/Berlin" in nightly and "pdf" in nightly
    # The last run's age: "(N s ago)", or "(just now)" when the page came within a second.
    assert re.search(r"\((\d[^()]* ago|just now)\)", nightly) and "(in " in nightly
    assert browser.find_element(By.CSS_SELECTOR, f"#schedules a[href='/ui/jobs/{scheduled_job}']")
    assert "paused" in browser.find_element(
        By.XPATH, "//th[normalize-space()='hourly-sync']/..").text
    _shot(browser, "overview", engine, screenshots)

    _follow(browser, failed_link)
    rows = browser.find_elements(By.CSS_SELECTOR, "table tbody tr")
    assert len(rows) == 1 and "SMTP 550" in rows[0].text
    _shot(browser, "jobs", engine, screenshots)

    # The job's page: why it failed at the top, its attempts, the payload shown as text.
    _follow(browser, browser.find_element(By.LINK_TEXT, str(job_id)))
    assert browser.current_url == server.url_of(f"/ui/jobs/{job_id}")
    assert "SMTP 550" in browser.find_element(By.CSS_SELECTOR, "section.failure").text
    attempts = browser.find_element(By.ID, "attempts").text
    assert "mailer" in attempts and "failed" in attempts
    assert HOSTILE in browser.find_element(By.CSS_SELECTOR, "#payload-heading + pre").text
    _shot(browser, "job", engine, screenshots)

    _click_button(browser, "Retry")
    assert "Sent back to pending." in browser.find_element(By.CSS_SELECTOR, ".messages").text
    shown = requests.get(server.url_of(f"/jobs/{job_id}"), headers=bearer(admin), timeout=10)
    assert shown.json()["status"] == "pending"

    # Pause and resume a type.
    _follow(browser, browser.find_element(By.LINK_TEXT, "Types"))
    email_row = "//th[normalize-space()='email']/.."
    _follow(browser,
            browser.find_element(By.XPATH, f"{email_row}//button[normalize-space()='Pause']"))
    assert "email: paused." in browser.find_element(By.CSS_SELECTOR, ".messages").text
    assert "paused" in browser.find_element(By.XPATH, email_row).text
    assert requests.get(server.url_of("/types/email"), headers=bearer(admin),
                        timeout=10).json()["paused"] is True
    # Its jobs say so where they are listed and shown; the overview's oldest claimable job
    # is the pdf, not the older mail waiting for the type's resume.
    browser.get(server.url_of("/ui/jobs?type=email"))
    assert "Type email is paused" in browser.find_element(By.ID, "type-paused").text
    row = browser.find_element(By.XPATH, f"//th[normalize-space()='{job_id}']/..")
    assert "paused" in row.find_element(By.XPATH, "td[1]").text
    _shot(browser, "jobs-paused", engine, screenshots)
    browser.get(server.url_of(f"/ui/jobs/{job_id}"))
    assert "paused" in browser.find_element(By.ID, "job-type").text
    browser.get(server.url_of("/ui/"))
    assert browser.find_element(By.ID, "oldest-claimable").text.startswith(
        "Oldest claimable job:")
    assert "(pdf)" in browser.find_element(By.ID, "oldest-claimable").text
    browser.get(server.url_of("/ui/types"))
    pdf_row = "//th[normalize-space()='pdf']/.."
    for field, value in (("max_running", "3"), ("rate_per_second", "2.5")):
        browser.find_element(By.XPATH, f"{pdf_row}//input[@name='{field}']").send_keys(value)
    _follow(browser,
            browser.find_element(By.XPATH, f"{pdf_row}//button[normalize-space()='Save limits']"))
    pdf = requests.get(server.url_of("/types/pdf"), headers=bearer(admin), timeout=10).json()
    assert (pdf["max_running"], pdf["rate_per_second"], pdf["burst"]) == (3, 2.5, 3)
    # Order a type's keys: the page comes back with the mode chosen.
    ordering = f"{pdf_row}//select[@name='ordering']"
    Select(browser.find_element(By.XPATH, ordering)).select_by_value("key")
    _follow(browser, browser.find_element(
        By.XPATH, f"{pdf_row}//button[normalize-space()='Save key modes']"))
    assert "pdf: key modes changed." in browser.find_element(By.CSS_SELECTOR, ".messages").text
    assert Select(browser.find_element(By.XPATH, ordering)).first_selected_option.text == "key"
    assert requests.get(server.url_of("/types/pdf"), headers=bearer(admin),
                        timeout=10).json()["ordering"] == "key"
    _shot(browser, "types", engine, screenshots)
    _follow(browser,
            browser.find_element(By.XPATH, f"{email_row}//button[normalize-space()='Resume']"))
    assert requests.get(server.url_of("/types/email"), headers=bearer(admin),
                        timeout=10).json()["paused"] is False

    # Pause and resume a schedule, delete another.
    _follow(browser, browser.find_element(By.LINK_TEXT, "Schedules"))
    assert browser.current_url == server.url_of("/ui/schedules")
    nightly_row = "//th[normalize-space()='nightly-report']/.."
    _follow(browser,
            browser.find_element(By.XPATH, f"{nightly_row}//button[normalize-space()='Pause']"))
    assert "nightly-report: paused." in browser.find_element(By.CSS_SELECTOR, ".messages").text
    assert _schedule(server, admin, "nightly-report").json()["paused"] is True
    _follow(browser,
            browser.find_element(By.XPATH, f"{nightly_row}//button[normalize-space()='Resume']"))
    assert "nightly-report: resumed." in browser.find_element(By.CSS_SELECTOR, ".messages").text
    assert _schedule(server, admin, "nightly-report").json()["paused"] is False
    _shot(browser, "schedules", engine, screenshots)
    sync_row = "//th[normalize-space()='hourly-sync']/.."
    _follow(browser,
            browser.find_element(By.XPATH, f"{sync_row}//button[normalize-space()='Delete']"))
    assert "hourly-sync: deleted" in browser.find_element(By.CSS_SELECTOR, ".messages").text
    assert _schedule(server, admin, "hourly-sync").status_code == 404

    # A post carrying the session cookie but no CSRF token is refused.
    cookies = {c["name"]: c["value"] for c in browser.get_cookies()}
    forged = requests.post(server.url_of("/ui/types/email/pause"), cookies=cookies, data={},
                           timeout=10, allow_redirects=False)
    assert forged.status_code == 400 and "CSRF" in forged.text
    assert requests.get(server.url_of("/types/email"), headers=bearer(admin),
                        timeout=10).json()["paused"] is False
    forged = requests.post(server.url_of("/ui/schedules/nightly-report/pause"), cookies=cookies,
                           data={}, timeout=10, allow_redirects=False)
    assert forged.status_code == 400
    assert _schedule(server, admin, "nightly-report").json()["paused"] is False

    _click_button(browser, "Sign out")
    assert browser.current_url == server.url_of("/ui/sign-in?signed_out=1")
    assert "Signed out." in browser.find_element(By.CSS_SELECTOR, ".messages").text
    browser.get(server.url_of("/ui/"))
    assert browser.current_url == server.url_of("/ui/sign-in")


def test_a_page_of_50_failed_jobs_gives_each_error_one_line_of_the_rows_room(
        browser: Any, server: LiveServer, database_url: str, screenshots: Path) -> None:
    from selenium.webdriver.common.by import By

    engine = "sqlite" if database_url.startswith("sqlite") else "postgresql"
    producer = create_api_key(database_url, "shop", "producer")
    worker = create_api_key(database_url, "mailer", "worker")
    admin = create_api_key(database_url, "ops", "admin")
    errors = ("SMTP 550: mailbox unavailable for recipient ada{n}@example.com (policy "
              "rejection by the upstream relay, see https://mail.example.com/help)",
              "ConnectionError: HTTPSConnectionPool(host='api.example.com', port=443): Max "
              "retries exceeded with url: /v1/charge/{n} (Caused by NewConnectionError)")
    for n in range(50):
        _failed_with(server, producer, worker, "email", errors[n % 2].format(n=n))
    browser.delete_all_cookies()
    _sign_in(browser, server, admin)
    browser.get(server.url_of("/ui/jobs?type=email&status=failed"))

    rows = browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")
    assert len(rows) == 50
    # No job reported progress: no column for it.
    headers = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#jobs thead th")]
    assert "Progress" not in headers and headers[-1] == "Last error"
    # Each error has most of the row, on one line, cut with an ellipsis, whole in its
    # tooltip; every row is one line of text.
    for row in rows:
        cell = row.find_element(By.CSS_SELECTOR, "td.error-line")
        assert cell.size["width"] >= 500, cell.size
        assert row.size["height"] < 40, row.size
        assert cell.get_attribute("title").startswith(("SMTP 550", "ConnectionError"))
    assert browser.execute_script(
        "return getComputedStyle(arguments[0]).textOverflow",
        rows[0].find_element(By.CSS_SELECTOR, "td.error-line")) == "ellipsis"
    assert browser.execute_script("return document.documentElement.scrollHeight") < 2600
    _shot(browser, "jobs-50-failed", engine, screenshots)


def test_a_revoked_admin_keys_session_ends_at_its_next_page(
        browser: Any, server: LiveServer, database_url: str) -> None:
    from selenium.webdriver.common.by import By

    admin = create_api_key(database_url, "night-shift", "admin")
    browser.delete_all_cookies()
    _sign_in(browser, server, admin)
    assert browser.current_url == server.url_of("/ui/")
    _revoke(database_url, "night-shift")
    _follow(browser, browser.find_element(By.LINK_TEXT, "Jobs"))
    assert browser.current_url == server.url_of("/ui/sign-in")


def test_bulk_retry_of_the_filtered_jobs_asks_first_and_a_wrong_path_is_the_dashboards_page(
        browser: Any, server: LiveServer, database_url: str) -> None:
    from selenium.webdriver.common.by import By

    producer = create_api_key(database_url, "shop", "producer")
    worker = create_api_key(database_url, "mailer", "worker")
    admin = create_api_key(database_url, "ops", "admin")
    failed = [_failed_job(server, producer, worker) for _ in range(2)]
    browser.delete_all_cookies()
    _sign_in(browser, server, admin)
    browser.get(server.url_of("/ui/jobs?type=email&status=failed"))
    _follow(browser, browser.find_element(By.PARTIAL_LINK_TEXT, "Retry every failed"))
    assert "Retry jobs?" in browser.find_element(By.TAG_NAME, "h1").text
    assert all(requests.get(server.url_of(f"/jobs/{job_id}"), headers=bearer(admin),
                            timeout=10).json()["status"] == "failed" for job_id in failed)
    # It says how many it takes, not a limit.
    assert browser.find_element(By.ID, "bulk-count").text.startswith(
        "2 jobs are failed of type email now.")
    _click_button(browser, "Retry 2 jobs")
    assert "2 jobs sent back to pending." in browser.find_element(
        By.CSS_SELECTOR, ".messages").text
    assert all(requests.get(server.url_of(f"/jobs/{job_id}"), headers=bearer(admin),
                            timeout=10).json()["status"] == "pending" for job_id in failed)
    browser.get(server.url_of("/ui/jobs/abc"))
    assert browser.find_element(By.TAG_NAME, "h1").text == "Not Found"
    assert browser.find_element(By.LINK_TEXT, "Jobs")  # the dashboard's page, signed in


def test_an_operator_watches_a_running_jobs_progress_and_requests_its_cancel(
        browser: Any, server: LiveServer, database_url: str, screenshots: Path) -> None:
    from selenium.webdriver.common.by import By

    engine = "sqlite" if database_url.startswith("sqlite") else "postgresql"
    producer = create_api_key(database_url, "shop", "producer")
    worker = create_api_key(database_url, "importer", "worker")
    admin = create_api_key(database_url, "ops", "admin")
    enqueued = requests.post(server.url_of("/jobs"), headers=bearer(producer), timeout=10,
                             json={"type": "email", "payload": {"file": "invoices.csv"},
                                   "timeout_seconds": 3600})
    job_id: int = enqueued.json()["id"]
    claimed = requests.post(server.url_of("/jobs/claim"), headers=bearer(worker),
                            timeout=10).json()
    assert claimed["id"] == job_id
    beat_url, lease = server.url_of(f"/jobs/{job_id}/heartbeat"), claimed["lease_token"]
    beat = requests.post(beat_url, headers=bearer(worker), timeout=10, json={
        "lease_token": lease, "progress": {"done": 42, "total": 120},
        "message": "importing invoices.csv"})
    assert beat.status_code == 200, beat.text
    browser.delete_all_cookies()
    _sign_in(browser, server, admin)

    # The list shows the job's share; its page, a bar the browser draws at 42 of 120.
    browser.get(server.url_of("/ui/jobs"))
    row = browser.find_element(By.XPATH, f"//th[normalize-space()='{job_id}']/..")
    assert row.find_element(By.TAG_NAME, "progress").get_dom_attribute("value") == "42"
    assert "35 %" in row.text
    _follow(browser, row.find_element(By.LINK_TEXT, str(job_id)))
    bar = browser.find_element(By.ID, "job-progress")
    assert bar.tag_name == "progress" and bar.is_displayed()
    assert (bar.get_dom_attribute("value"), bar.get_dom_attribute("max")) == ("42", "120")
    assert abs(float(bar.get_property("position")) - 42 / 120) < 1e-9
    assert browser.find_element(By.ID, "progress-count").text == "42 / 120"
    assert browser.find_element(By.ID, "progress-message").text == "importing invoices.csv"
    assert "1 h an attempt (3600 s)" in browser.find_element(By.ID, "timeout").text
    _shot(browser, "running-job", engine, screenshots)

    # Its cancel is a request: the job runs on until its worker, told at its next heartbeat,
    # reports; then it ends cancelled, its last progress still shown.
    _click_button(browser, "Request cancel")
    assert "Cancel requested (by ops" in browser.find_element(By.CSS_SELECTOR, ".messages").text
    assert "Cancel requested by ops" in browser.find_element(By.ID, "cancel-requested").text
    # Asked once: no second request is offered (looked for in the source, as a missing
    # element would be waited for).
    assert ">Request cancel</button>" not in browser.page_source
    told = _heartbeat(beat_url, worker, lease)
    assert (told["status"], told["cancel_requested"]) == ("running", True)
    stopped = requests.post(server.url_of(f"/jobs/{job_id}/fail"), headers=bearer(worker),
                            timeout=10, json={"lease_token": lease, "error": "stopped"})
    assert stopped.json()["status"] == "cancelled"
    browser.refresh()
    assert browser.find_element(By.CSS_SELECTOR, "h1 span").text == "cancelled"
    assert browser.find_element(By.ID, "job-progress").get_dom_attribute("value") == "42"
    assert 'id="cancel-requested"' not in browser.page_source


def _heartbeat(beat_url: str, worker: str, lease: str) -> Any:
    """A heartbeat's answer, sent again after its Retry-After when it came within a second
    of the job's last one (a job beats at most once a second, as the client's runner does)."""
    while True:
        answer = requests.post(beat_url, headers=bearer(worker), timeout=10,
                               json={"lease_token": lease})
        if answer.status_code != 429:
            return answer.json()
        time.sleep(float(answer.headers["Retry-After"]))


def _failed_with(server: LiveServer, producer: str, worker: str, job_type: str,
                 error: str) -> int:
    """A job of `job_type` enqueued, claimed and failed for good with `error`; its id."""
    enqueued = requests.post(server.url_of("/jobs"), headers=bearer(producer), timeout=10,
                             json={"type": job_type, "max_retries": 0, "payload": {}})
    job_id: int = enqueued.json()["id"]
    claimed = requests.post(server.url_of("/jobs/claim"), headers=bearer(worker), timeout=10,
                            json={"types": [job_type]}).json()
    assert claimed["id"] == job_id
    failed = requests.post(server.url_of(f"/jobs/{job_id}/fail"), headers=bearer(worker),
                           timeout=10, json={"error": error,
                                             "lease_token": claimed["lease_token"]})
    assert failed.json()["status"] == "failed"
    return job_id


def test_an_operator_reads_the_failures_page_and_retries_one_groups_failed_jobs(
        browser: Any, server: LiveServer, database_url: str, screenshots: Path) -> None:
    from selenium.webdriver.common.by import By

    engine = "sqlite" if database_url.startswith("sqlite") else "postgresql"
    producer = create_api_key(database_url, "shop", "producer")
    worker = create_api_key(database_url, "mailer", "worker")
    admin = create_api_key(database_url, "ops", "admin")
    # Two mails refused alike (their numbers differ): one group; a PDF's timeout another.
    mails = [_failed_with(server, producer, worker, "email",
                          f"SMTP 550: mailbox unavailable (queue id {n})") for n in (4711, 4712)]
    rendering = f"{HOSTILE} renderer timed out after 30012 ms"
    pdf = _failed_with(server, producer, worker, "pdf", rendering)
    browser.delete_all_cookies()
    _sign_in(browser, server, admin)

    _follow(browser, browser.find_element(By.LINK_TEXT, "Failures"))
    assert browser.current_url == server.url_of("/ui/failures")
    rows = browser.find_elements(By.CSS_SELECTOR, "#failures tr.failure-group")
    # Most recently seen first.
    assert [row.get_attribute("data-type") for row in rows] == ["pdf", "email"]
    pdf_row, email_row = rows
    assert [email_row.find_element(By.CSS_SELECTOR, f"td.{name}").text
            for name in ("failing-now", "jobs-failed", "count")] == ["2", "2", "2"]
    assert "SMTP 550: mailbox unavailable (queue id 4712)" in email_row.text
    # The worker's error is shown as the text it is, never run as markup.
    assert pdf_row.find_element(By.CSS_SELECTOR, "td.sample").text == rendering
    # The chart: 24 hourly bars, each saying its count; the failures are all of the last hour
    # or two (the test may cross an hour's end).
    chart = email_row.find_element(By.CSS_SELECTOR, "svg.hourly")
    assert chart.is_displayed()
    bars = chart.find_elements(By.TAG_NAME, "rect")
    counts = [int(bar.get_attribute("data-count")) for bar in bars]
    assert len(counts) == 24 and sum(counts) == 2 and sum(counts[-2:]) == 2
    said = chart.get_attribute("aria-label")
    assert said.endswith(", ".join(str(count) for count in counts))
    assert bars[-1].find_element(By.TAG_NAME, "title").get_attribute("textContent").endswith(
        f"UTC: {counts[-1]} failed attempt{'' if counts[-1] == 1 else 's'}")
    newest = email_row.find_elements(By.CSS_SELECTOR, "td.newest-jobs a")
    assert [int(link.text) for link in newest] == mails[::-1]
    _shot(browser, "failures", engine, screenshots)

    # The retry asks first, saying how many of the group's jobs it takes.
    _follow(browser, email_row.find_element(By.LINK_TEXT, "Retry 2…"))
    assert "Retry the failed jobs of this group?" in browser.find_element(By.TAG_NAME, "h1").text
    assert "2 jobs of type email that are failed now" in browser.find_element(
        By.ID, "retry-count").text
    _shot(browser, "failure-retry", engine, screenshots)
    assert requests.get(server.url_of(f"/jobs/{mails[0]}"), headers=bearer(admin),
                        timeout=10).json()["status"] == "failed"
    _click_button(browser, "Retry 2 jobs")
    assert browser.current_url == server.url_of("/ui/failures")
    assert "2 jobs sent back to pending." in browser.find_element(
        By.CSS_SELECTOR, ".messages").text
    statuses = {job_id: requests.get(server.url_of(f"/jobs/{job_id}"), headers=bearer(admin),
                                     timeout=10).json()["status"] for job_id in [*mails, pdf]}
    assert statuses == {mails[0]: "pending", mails[1]: "pending", pdf: "failed"}


# An order's workflow, run part way so that its drawing has a job in every status.
ORDER_WORKFLOW: dict[str, Any] = {"name": "order-1001", "jobs": [
    {"ref": "validate", "type": "email"},
    {"ref": "charge", "type": "pdf", "depends_on": ["validate"]},
    {"ref": "reserve-stock", "type": "sync", "depends_on": ["validate"]},
    {"ref": "invoice", "type": "pdf", "depends_on": ["charge"], "max_retries": 0},
    {"ref": "confirmation-mail", "type": "email", "depends_on": ["charge"]},
    {"ref": "ship", "type": "sync", "depends_on": ["charge", "reserve-stock"]},
    {"ref": "notify", "type": "email", "depends_on": ["confirmation-mail", "ship"],
     "on_dependency_failure": "run"},
    {"ref": "archive", "type": "sync", "depends_on": ["invoice", "notify"]},
]}


def _order_run_part_way(server: LiveServer, producer: str, worker: str) -> dict[str, Any]:
    """The order's workflow with validate, charge and reserve-stock completed, invoice failed
    (and so archive cancelled), confirmation-mail running, ship pending, notify waiting."""
    created = requests.post(server.url_of("/workflows"), headers=bearer(producer), timeout=10,
                            json=ORDER_WORKFLOW)
    assert created.status_code == 201, created.text
    workflow: dict[str, Any] = created.json()
    ids = workflow["jobs"]
    for ref, outcome in (("validate", "complete"), ("charge", "complete"),
                         ("reserve-stock", "complete"), ("invoice", "fail"),
                         ("confirmation-mail", None)):
        claimed = requests.post(server.url_of("/jobs/claim"), headers=bearer(worker),
                                timeout=10).json()
        assert claimed["id"] == ids[ref], (ref, claimed)
        if outcome is not None:
            body: dict[str, Any] = {"lease_token": claimed["lease_token"]}
            body |= {"error": "PDF renderer timed out"} if outcome == "fail" else {}
            answer = requests.post(server.url_of(f"/jobs/{claimed['id']}/{outcome}"),
                                   headers=bearer(worker), timeout=10, json=body)
            assert answer.status_code == 200, answer.text
    return workflow


def test_an_operator_opens_a_workflows_drawing_and_follows_a_job_in_it(
        browser: Any, server: LiveServer, database_url: str, screenshots: Path) -> None:
    from selenium.webdriver.common.by import By

    engine = "sqlite" if database_url.startswith("sqlite") else "postgresql"
    producer = create_api_key(database_url, "shop", "producer")
    worker = create_api_key(database_url, "fulfilment", "worker")
    admin = create_api_key(database_url, "ops", "admin")
    workflow = _order_run_part_way(server, producer, worker)
    ids = workflow["jobs"]
    browser.delete_all_cookies()
    _sign_in(browser, server, admin)

    _follow(browser, browser.find_element(By.LINK_TEXT, "Workflows"))
    row = browser.find_element(By.XPATH, "//table[@id='workflows']//tbody/tr").text
    assert "order-1001" in row and "running" in row
    _follow(browser, browser.find_element(By.LINK_TEXT, str(workflow["id"])))
    assert browser.current_url == server.url_of(f"/ui/workflows/{workflow['id']}")
    drawing = browser.find_element(By.CSS_SELECTOR, "svg.graph")
    assert drawing.is_displayed()
    boxes = drawing.find_elements(By.CSS_SELECTOR, "a.node")
    assert sorted(int(box.get_attribute("data-job")) for box in boxes) == sorted(ids.values())
    assert len(drawing.find_elements(By.CSS_SELECTOR, "path.arrow")) == 10
    # Each box is coloured by its status through the stylesheet (the CSP allows no inline
    # style): a failed job's box is not a completed one's.
    fills = {status: drawing.find_element(
                By.CSS_SELECTOR, f"a.status-{status} rect").value_of_css_property("fill")
             for status in ("completed", "failed", "running", "pending", "waiting",
                            "cancelled")}
    assert len(set(fills.values())) == 6, fills
    _shot(browser, "workflow", engine, screenshots)

    mail = ids["confirmation-mail"]
    _follow(browser, drawing.find_element(By.CSS_SELECTOR, f"a.node[data-job='{mail}']"))
    assert browser.current_url == server.url_of(f"/ui/jobs/{mail}")
    assert browser.find_element(By.LINK_TEXT, f"workflow {workflow['id']}")
    assert browser.find_element(By.ID, "depends-on").text == str(ids["charge"])

    # Cancel the rest of it from its page: ship (pending) and notify (waiting).
    browser.back()
    _click_button(browser, "Cancel")
    assert "Cancelled its waiting and pending jobs." in browser.find_element(
        By.CSS_SELECTOR, ".messages").text
    shown = requests.get(server.url_of(f"/workflows/{workflow['id']}"), headers=bearer(admin),
                         timeout=10).json()
    assert {job["ref"]: job["status"] for job in shown["jobs"]} == {
        "validate": "completed", "charge": "completed", "reserve-stock": "completed",
        "invoice": "failed", "confirmation-mail": "running", "ship": "cancelled",
        "notify": "cancelled", "archive": "cancelled"}


def test_screenshots_go_to_the_checkout_only_when_asked(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(SCREENSHOTS_VARIABLE, raising=False)
    assert screenshots_directory(tmp_path) == tmp_path
    monkeypatch.setenv(SCREENSHOTS_VARIABLE, "docs/screenshots")
    assert screenshots_directory(tmp_path) == REPO_ROOT / "docs" / "screenshots"


def _traffic(server: LiveServer, producer: str, worker: str) -> None:
    """Three mails enqueued: one completed, one failed for good, one left pending."""
    for _ in range(3):
        enqueued = requests.post(server.url_of("/jobs"), headers=bearer(producer), timeout=10,
                                 json={"type": "email", "max_retries": 0, "payload": {}})
        assert enqueued.status_code == 201, enqueued.text
    for outcome in ("complete", "fail"):
        claimed = requests.post(server.url_of("/jobs/claim"), headers=bearer(worker),
                                timeout=10, json={"types": ["email"]}).json()
        body = {"lease_token": claimed["lease_token"]}
        body |= {"error": "SMTP 550"} if outcome == "fail" else {}
        answer = requests.post(server.url_of(f"/jobs/{claimed['id']}/{outcome}"),
                               headers=bearer(worker), timeout=10, json=body)
        assert answer.status_code == 200, answer.text


def _counted(server: LiveServer, admin: str, enqueued: int) -> None:
    """Wait until every worker process has written its stats (each about once a second):
    the charts read what is written."""
    deadline = time.monotonic() + 30
    while True:
        buckets = requests.get(server.url_of("/stats"), headers=bearer(admin), timeout=10,
                               params={"type": "email"}).json()["buckets"]
        if sum(bucket["enqueued"] for bucket in buckets) >= enqueued:
            return
        assert time.monotonic() < deadline, "the stats never counted the traffic"
        time.sleep(0.2)


_BUCKET = re.compile(r"^\d\d:\d\d — (\d+) enqueued, (\d+) completed, (\d+) failed$")


def test_an_operator_reads_a_types_charts_and_turns_auto_refresh_on(
        browser: Any, server: LiveServer, database_url: str, screenshots: Path) -> None:
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    engine = "sqlite" if database_url.startswith("sqlite") else "postgresql"
    producer = create_api_key(database_url, "shop", "producer")
    worker = create_api_key(database_url, "mailer", "worker")
    admin = create_api_key(database_url, "ops", "admin")
    _traffic(server, producer, worker)
    _counted(server, admin, 3)
    browser.delete_all_cookies()
    _sign_in(browser, server, admin)

    # From the types page to the type's own.
    _follow(browser, browser.find_element(By.LINK_TEXT, "Types"))
    _follow(browser, browser.find_element(By.LINK_TEXT, "email"))
    assert browser.current_url == server.url_of("/ui/types/email")
    chart = browser.find_element(By.CSS_SELECTOR, "#throughput svg.chart")
    assert chart.is_displayed()
    # What a screen reader is told of the chart: its numbers.
    said = "email: 3 enqueued, 1 completed, 1 failed in the last hour"
    assert chart.accessible_name == said
    assert chart.find_element(By.TAG_NAME, "title").get_attribute("textContent") == said
    # Each minute's bar says its own (the traffic may straddle a minute's end); together
    # they say the chart's numbers, all of the last two minutes.
    buckets = chart.find_elements(By.CSS_SELECTOR, "g.bucket")
    assert len(buckets) == 60
    titles = [bucket.find_element(By.TAG_NAME, "title").get_attribute("textContent")
              for bucket in buckets]
    counts = [tuple(int(n) for n in _BUCKET.fullmatch(title).groups())  # type: ignore[union-attr]
              for title in titles]
    assert tuple(map(sum, zip(*counts, strict=True))) == (3, 1, 1)
    assert tuple(map(sum, zip(*counts[-2:], strict=True))) == (3, 1, 1)
    busy = next(bucket for bucket, count in zip(buckets, counts, strict=True) if count[0])
    assert busy.accessible_name == titles[buckets.index(busy)]
    failed = browser.find_element(By.CSS_SELECTOR, "#failures svg.chart")
    assert failed.accessible_name == "email: 1 failed attempt in the last hour"
    assert browser.find_element(By.CSS_SELECTOR, "#depth svg.chart").is_displayed()
    _shot(browser, "type", engine, screenshots)

    # The day's charts, by hour; then auto-refresh, which keeps the period.
    _follow(browser, browser.find_element(By.LINK_TEXT, "last day"))
    assert browser.current_url == server.url_of("/ui/types/email?period=day")
    day = browser.find_element(By.CSS_SELECTOR, "#throughput svg.chart")
    assert day.accessible_name == "email: 3 enqueued, 1 completed, 1 failed in the last 24 hours"
    # Its totals in words under it; its axis at round ticks, 0 once; this hour's jobs a bar
    # as wide as the hour's share of the chart, not a hairline.
    assert browser.find_element(By.CSS_SELECTOR, "#throughput p.chart-totals").text == (
        "3 enqueued, 1 completed, 1 failed in the last 24 hours")
    assert [label.get_attribute("textContent") for label in day.find_elements(
        By.CSS_SELECTOR, "g.axes text.tick, g.axes text.max")] == ["0", "1", "2", "3"]
    assert day.find_elements(By.CSS_SELECTOR, "rect.completed")[-1].size["width"] >= 10
    _shot(browser, "type-day", engine, screenshots)
    _follow(browser, browser.find_element(By.LINK_TEXT, "Auto-refresh: off"))
    assert browser.current_url == server.url_of("/ui/types/email?period=day&refresh=on")
    # The page reloads itself (a <meta> refresh, no script): the mark set on it goes.
    browser.execute_script("window.queuelogOldPage = true;")
    WebDriverWait(browser, 60, ignored_exceptions=(WebDriverException,)).until(
        lambda driver: driver.execute_script(
            "return window.queuelogOldPage === undefined"
            " && document.readyState === 'complete';"))
    assert browser.current_url == server.url_of("/ui/types/email?period=day&refresh=on")
    _follow(browser, browser.find_element(By.LINK_TEXT, "Auto-refresh: on"))
    assert browser.current_url == server.url_of("/ui/types/email?period=day")


def test_an_operator_finds_a_suspended_job_and_what_it_waits_for(
        browser: Any, server: LiveServer, database_url: str, screenshots: Path) -> None:
    from selenium.webdriver.common.by import By

    engine = "sqlite" if database_url.startswith("sqlite") else "postgresql"
    producer = create_api_key(database_url, "shop", "producer")
    worker = create_api_key(database_url, "mailer", "worker")
    admin = create_api_key(database_url, "ops", "admin")
    job_id = requests.post(server.url_of("/jobs"), headers=bearer(producer), timeout=10,
                           json={"type": "email", "payload": {"order": 1001}}).json()["id"]
    claimed = requests.post(server.url_of("/jobs/claim"), headers=bearer(worker),
                            timeout=10).json()
    suspended = requests.post(
        server.url_of(f"/jobs/{job_id}/suspend"), headers=bearer(worker), timeout=10,
        json={"lease_token": claimed["lease_token"], "checkpoint": {"charged": True},
              "wait_for": {"event": "order.shipped", "key": "1001", "timeout_seconds": 86400}})
    assert suspended.json()["status"] == "suspended", suspended.text
    browser.delete_all_cookies()
    _sign_in(browser, server, admin)

    # The overview counts it, a link to the list filtered to suspended jobs, which says what
    # each waits for.
    browser.get(server.url_of("/ui/"))
    counted = browser.find_element(
        By.CSS_SELECTOR, "a[href*='status=suspended'][href*='type=email']")
    assert counted.text == "1"
    _follow(browser, counted)
    row = browser.find_element(By.XPATH, f"//th[normalize-space()='{job_id}']/..")
    assert "suspended" in row.text
    assert "waits for the event order.shipped, key 1001" in row.text
    _follow(browser, row.find_element(By.LINK_TEXT, str(job_id)))
    assert browser.find_element(By.CSS_SELECTOR, "h1 span").text == "suspended"
    waits = browser.find_element(By.ID, "waiting-for").text
    assert waits.startswith("the event order.shipped, key 1001, until ")
    _shot(browser, "suspended-job", engine, screenshots)

    # The event resumes it: pending, and its page says how its wait ended.
    posted = requests.post(server.url_of("/events"), headers=bearer(producer), timeout=10,
                           json={"name": "order.shipped", "key": "1001",
                                 "data": {"carrier": "DHL"}})
    assert posted.json() == {"woken": 1}
    browser.refresh()
    assert browser.find_element(By.CSS_SELECTOR, "h1 span").text == "pending"
    assert "waiting-for" not in browser.page_source
    resumed = browser.find_element(By.ID, "resumed").text
    assert resumed.startswith("ended by event") and '"carrier": "DHL"' in resumed


def test_an_operator_sees_a_types_circuit_open_and_what_opened_it(
        browser: Any, server: LiveServer, database_url: str, screenshots: Path) -> None:
    from selenium.webdriver.common.by import By

    engine = "sqlite" if database_url.startswith("sqlite") else "postgresql"
    producer = create_api_key(database_url, "shop", "producer")
    worker = create_api_key(database_url, "mailer", "worker")
    admin = create_api_key(database_url, "ops", "admin")
    # The type's circuit opens after 2 failed attempts, its probe a minute later.
    assert requests.patch(server.url_of("/types/sync"), headers=bearer(admin), timeout=10,
                          json={"circuit": {"min_attempts": 2, "cooldown_seconds": 60},
                                "retry_budget": {"minimum": 5}}).status_code == 200
    for _ in range(3):
        requests.post(server.url_of("/jobs"), headers=bearer(producer), timeout=10,
                      json={"type": "sync", "max_retries": 0})
    for _ in range(2):
        claimed = requests.post(server.url_of("/jobs/claim"), headers=bearer(worker),
                                timeout=10, json={"types": ["sync"]}).json()
        requests.post(server.url_of(f"/jobs/{claimed['id']}/fail"), headers=bearer(worker),
                      timeout=10, json={"lease_token": claimed["lease_token"],
                                        "error": "SMTP 421 try again later"})
    deadline = time.monotonic() + 30
    while requests.get(server.url_of("/types/sync"), headers=bearer(admin),
                       timeout=10).json()["circuit_state"]["state"] != "open":
        assert time.monotonic() < deadline, "the circuit never opened"
        time.sleep(0.1)
    browser.delete_all_cookies()
    _sign_in(browser, server, admin)

    browser.get(server.url_of("/ui/types/sync"))
    circuit = browser.find_element(By.ID, "circuit")
    assert circuit.find_element(By.CSS_SELECTOR, "span.circuit-open").text == "open"
    assert "probe from" in circuit.text
    assert "opens at 50% failed of at least 2 attempts in 60 s, probes after 60 s" in circuit.text
    assert "0.2 per first attempt + 5 retries per 60 s" in browser.find_element(
        By.ID, "type-settings").text
    _shot(browser, "circuit-open", engine, screenshots)
    # What opened it: its failure group, on the failures page.
    _follow(browser, circuit.find_element(By.LINK_TEXT, "SMTP 421 try again later"))
    assert "/ui/failures" in browser.current_url
    assert "SMTP 421 try again later" in browser.page_source
    requests.patch(server.url_of("/types/sync"), headers=bearer(admin), timeout=10,
                   json={"circuit": None, "retry_budget": None})


def _until(browser: Any, condition: Any, timeout: float = 60) -> Any:
    """Wait, polling, until `condition(browser)` is true (never a fixed sleep)."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, timeout, poll_frequency=0.25,
                         ignored_exceptions=(WebDriverException,)).until(condition)


def _cell(browser: Any, key: str) -> str:
    from selenium.webdriver.common.by import By

    text: str = browser.find_element(By.CSS_SELECTOR, f'[data-live="{key}"]').text
    return text


# Catches what the CSP would refuse the live script (a fetch, an HTML write, an eval) from
# the moment it is set: each violation's directive, kept on the window.
_WATCH_CSP = """
window.queuelogViolations = [];
document.addEventListener('securitypolicyviolation', function (e) {
  window.queuelogViolations.push(e.violatedDirective + ' ' + e.blockedURI);
});
"""


def test_an_operator_watches_the_overview_and_a_job_change_live_and_finds_jobs_by_search(
        browser: Any, server: LiveServer, database_url: str, screenshots: Path) -> None:
    from selenium.webdriver.common.by import By

    engine = "sqlite" if database_url.startswith("sqlite") else "postgresql"
    producer = create_api_key(database_url, "shop", "producer")
    worker = create_api_key(database_url, "mailer", "worker")
    admin = create_api_key(database_url, "ops", "admin")
    failed = _failed_with(server, producer, worker, "email",
                          "SMTP 550: mailbox unavailable (queue id 4711)")
    browser.delete_all_cookies()
    _sign_in(browser, server, admin)

    # The overview says it is live, and keeps saying how fresh it is.
    assert browser.current_url == server.url_of("/ui/")
    browser.execute_script(_WATCH_CSP + "window.queuelogOldPage = true;")
    status = browser.find_element(By.ID, "live")
    _until(browser, lambda _: status.is_displayed()
           and re.fullmatch(r"Live: updated \d+ s ago", status.text.strip()))
    assert _cell(browser, "type/pdf/running") == "0"

    # A job claimed and completed through the API: the counts change on the page, no reload.
    enqueued = requests.post(server.url_of("/jobs"), headers=bearer(producer), timeout=10,
                             json={"type": "pdf", "payload": {"invoice": 1042}})
    job_id: int = enqueued.json()["id"]
    claimed = requests.post(server.url_of("/jobs/claim"), headers=bearer(worker), timeout=10,
                            json={"types": ["pdf"]}).json()
    assert claimed["id"] == job_id
    _until(browser, lambda _: _cell(browser, "type/pdf/running") == "1")
    _shot(browser, "live-overview", engine, screenshots)
    done = requests.post(server.url_of(f"/jobs/{job_id}/complete"), headers=bearer(worker),
                         timeout=10, json={"lease_token": claimed["lease_token"]})
    assert done.status_code == 200, done.text
    # Running is read live; completed comes from the counts' snapshot, at most 10 s old.
    _until(browser, lambda _: _cell(browser, "type/pdf/running") == "0"
           and _cell(browser, "type/pdf/completed") == "1")
    assert browser.execute_script("return window.queuelogOldPage === true")  # no reload
    assert browser.execute_script("return window.queuelogViolations") == []

    # A job's page: its status follows, and the page offers a reload (other buttons now).
    enqueued = requests.post(server.url_of("/jobs"), headers=bearer(producer), timeout=10,
                             json={"type": "sync", "payload": {}})
    watched: int = enqueued.json()["id"]
    browser.get(server.url_of(f"/ui/jobs/{watched}"))
    browser.execute_script(_WATCH_CSP + "window.queuelogOldPage = true;")
    status_word = browser.find_element(By.CSS_SELECTOR, 'h1 [data-live="status"]')
    assert status_word.text == "pending"
    reload = browser.find_element(By.CSS_SELECTOR, "#live .live-reload")
    assert not reload.is_displayed()
    claimed = requests.post(server.url_of("/jobs/claim"), headers=bearer(worker), timeout=10,
                            json={"types": ["sync"]}).json()
    assert claimed["id"] == watched
    _until(browser, lambda _: status_word.text == "running" and reload.is_displayed())
    assert "status-running" in status_word.get_attribute("class")
    assert browser.execute_script("return window.queuelogOldPage === true")
    assert browser.execute_script("return window.queuelogViolations") == []
    _shot(browser, "live-job", engine, screenshots)
    _follow(browser, reload)
    assert "Request cancel" in browser.page_source  # the running job's own button

    # The search box: a job's id jumps to its page; a missing one says so; error text lists
    # the jobs of the failure groups whose error holds it.
    def search(text: str) -> None:
        box = browser.find_element(By.ID, "search-q")
        box.clear()
        box.send_keys(text)
        _follow(browser, browser.find_element(By.CSS_SELECTOR, "form.search button"))

    search(str(failed))
    assert browser.current_url == server.url_of(f"/ui/jobs/{failed}")
    search("987654321")
    assert browser.find_element(By.TAG_NAME, "h1").text == "No job 987654321"
    search("mailbox UNAVAILABLE")
    assert browser.current_url == server.url_of("/ui/jobs?error=mailbox+UNAVAILABLE")
    assert "1 failure group matches" in browser.find_element(By.ID, "error-match").text
    rows = browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")
    assert [row.find_element(By.TAG_NAME, "th").text for row in rows] == [str(failed)]
    _shot(browser, "search", engine, screenshots)

    # A revoked key's session: the live page's script is refused and stops, saying so.
    browser.get(server.url_of("/ui/failures"))
    alert = browser.find_element(By.CSS_SELECTOR, "#live .live-alert")
    _until(browser, lambda _: "Live: updated" in browser.find_element(By.ID, "live").text)
    _revoke(database_url, "ops")
    _until(browser, lambda _: "Signed out" in alert.text)
    assert alert.find_element(By.LINK_TEXT, "Sign in again").get_attribute(
        "href") == server.url_of("/ui/sign-in")
    assert "(stopped)" in browser.find_element(By.CSS_SELECTOR, "#live .live-said").text
