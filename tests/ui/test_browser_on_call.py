"""An operator on call, in the real browser against a real server (as test_browser.py): a mail
type's downstream fails, its circuit breaker opens, and the operator finds why and the group
of failures behind it, sees which worker instance ran them, retries the group through its
confirmation (which says how many jobs it takes), and watches the backlog drain on the
overview without reloading it, once the downstream is back and the circuit has healed.
With QUEUELOG_SCREENSHOTS_DIR=docs/screenshots the run writes the screenshots docs/DASHBOARD.md
shows for each step ("On call")."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import requests

from tests.servers import LiveServer, bearer, create_api_key
from tests.ui import test_browser as walk

# The browser test's own: its fixtures (used by name), its marks and its helpers.
browser, database_url, server, screenshots = (walk.browser, walk.database_url, walk.server,
                                              walk.screenshots)
pytestmark = walk.pytestmark
_WATCH_CSP, _cell, _follow, _shot, _sign_in, _until = (walk._WATCH_CSP, walk._cell, walk._follow,
                                                        walk._shot, walk._sign_in, walk._until)

JOBS = 30
INSTANCE = "mail-host-1:4242"
# Opens once half of at least 5 attempts in a minute failed; its first probe 3 s later.
CIRCUIT = {"failure_ratio": 0.5, "min_attempts": 5, "window_seconds": 60, "cooldown_seconds": 3}
REFUSAL = "SMTP 421 4.7.0 try again later (queue id {})"


def _type(server: LiveServer, admin: str) -> dict[str, Any]:
    answer = requests.get(server.url_of("/types/email"), headers=bearer(admin), timeout=10)
    assert answer.status_code == 200, answer.text
    shown: dict[str, Any] = answer.json()
    return shown


def _claim(server: LiveServer, worker: str) -> dict[str, Any] | None:
    answer = requests.post(server.url_of("/jobs/claim"), headers=bearer(worker), timeout=10,
                           json={"types": ["email"], "instance": INSTANCE})
    assert answer.status_code in (200, 204), answer.text
    return answer.json() if answer.status_code == 200 else None


def _fail_until_the_circuit_opens(server: LiveServer, worker: str, admin: str) -> int:
    """The mail server refuses: each job claimed fails for good, until the circuit opens and
    claims find nothing. The number of jobs failed."""
    failed = 0
    deadline = time.monotonic() + 60
    while _type(server, admin)["circuit_state"]["state"] != "open":
        assert time.monotonic() < deadline, "the circuit never opened"
        job = _claim(server, worker)
        if job is None:
            time.sleep(0.1)
            continue
        answer = requests.post(server.url_of(f"/jobs/{job['id']}/fail"), headers=bearer(worker),
                               timeout=10, json={"lease_token": job["lease_token"],
                                                 "error": REFUSAL.format(4700 + job["id"])})
        assert answer.json()["status"] == "failed", answer.text
        failed += 1
    return failed


def _send_mail(server: LiveServer, worker: str, stop: threading.Event,
               completed: list[int]) -> None:
    """The mail server is back: a worker completes each job it is handed (the circuit hands
    out a probe, then doubling waves, then everything) until stopped."""
    while not stop.is_set():
        job = _claim(server, worker)
        if job is None:
            stop.wait(0.2)
            continue
        answer = requests.post(server.url_of(f"/jobs/{job['id']}/complete"),
                               headers=bearer(worker), timeout=10,
                               json={"lease_token": job["lease_token"]})
        assert answer.status_code == 200, answer.text
        completed.append(job["id"])


def test_on_call_a_circuit_opens_the_operator_retries_its_group_and_watches_it_drain(
        browser: Any, server: LiveServer, database_url: str, screenshots: Path) -> None:
    from selenium.webdriver.common.by import By

    engine = "sqlite" if database_url.startswith("sqlite") else "postgresql"
    producer = create_api_key(database_url, "shop", "producer")
    worker = create_api_key(database_url, "mailer", "worker")
    admin = create_api_key(database_url, "ops", "admin")
    assert requests.patch(server.url_of("/types/email"), headers=bearer(admin), timeout=10,
                          json={"circuit": CIRCUIT}).status_code == 200
    made = requests.post(server.url_of("/jobs/batch"), headers=bearer(producer), timeout=10,
                         json={"jobs": [{"type": "email", "max_retries": 0,
                                         "payload": {"order": 1000 + n}} for n in range(JOBS)]})
    assert made.status_code == 201, made.text
    failed = _fail_until_the_circuit_opens(server, worker, admin)
    assert failed >= CIRCUIT["min_attempts"]

    # 1. The overview: the mail type's state says its circuit is open (its counts are read
    # from a snapshot at most a few seconds old: the live page catches up).
    browser.delete_all_cookies()
    _sign_in(browser, server, admin)
    state = browser.find_element(By.CSS_SELECTOR, '[data-live="type/email/state"]')
    assert state.text == "circuit open"
    _until(browser, lambda _: _cell(browser, "type/email/failed") == str(failed)
           and _cell(browser, "type/email/pending") == str(JOBS - failed))
    _shot(browser, "on-call-1-overview", engine, screenshots)

    # 2. The type's page: open since when, its probe, and the failure group that opened it.
    _follow(browser, state.find_element(By.LINK_TEXT, "circuit open"))
    circuit = browser.find_element(By.ID, "circuit")
    assert circuit.find_element(By.CSS_SELECTOR, "span.circuit-open").text == "open"
    assert "probe from" in circuit.text
    opened_by = circuit.find_element(By.PARTIAL_LINK_TEXT, "SMTP 421 4.7.0 try again later")
    _shot(browser, "on-call-2-type", engine, screenshots)

    # 3. The failures page: one group, every failed job in it failing now.
    _follow(browser, opened_by)
    [group] = browser.find_elements(By.CSS_SELECTOR, "#failures tr.failure-group")
    assert group.get_attribute("data-type") == "email"
    assert [group.find_element(By.CSS_SELECTOR, f"td.{name}").text
            for name in ("failing-now", "jobs-failed", "count")] == [str(failed)] * 3
    _shot(browser, "on-call-3-failures", engine, screenshots)

    # 4. One of its jobs: its attempt names the worker instance that ran it.
    _follow(browser, group.find_elements(By.CSS_SELECTOR, "td.newest-jobs a")[0])
    assert INSTANCE in browser.find_element(By.ID, "attempts").text
    assert "SMTP 421 4.7.0" in browser.find_element(By.TAG_NAME, "body").text  # at its top
    browser.back()

    # 5. The downstream is fixed (outside the queue). The group's retry asks first, saying
    # how many jobs it takes.
    group = browser.find_element(By.CSS_SELECTOR, "#failures tr.failure-group")
    _follow(browser, group.find_element(By.LINK_TEXT, f"Retry {failed}…"))
    confirm = browser.find_element(
        By.XPATH, f"//button[normalize-space()='Retry {failed} jobs']")
    _shot(browser, "on-call-4-retry", engine, screenshots)
    _follow(browser, confirm)
    assert f"{failed} jobs sent back to pending." in browser.find_element(
        By.CSS_SELECTOR, ".messages").text

    # 6. The overview, live: every job pending again; then, as the mail server accepts, the
    # circuit's probe, its waves, the whole backlog completed and the circuit closed, shown
    # without a reload.
    browser.get(server.url_of("/ui/"))
    browser.execute_script(_WATCH_CSP + "window.queuelogOldPage = true;")
    _until(browser, lambda _: _cell(browser, "type/email/pending") == str(JOBS)
           and _cell(browser, "type/email/failed") == "0")
    stop, completed = threading.Event(), list[int]()
    sender = threading.Thread(target=_send_mail, args=(server, worker, stop, completed))
    sender.start()
    try:
        _until(browser, lambda _: _cell(browser, "type/email/pending") == "0"
               and _cell(browser, "type/email/running") == "0"
               and _cell(browser, "type/email/completed") == str(JOBS)
               and _cell(browser, "type/email/state") == "active"
               and _cell(browser, "oldest_claimable") == "none", timeout=120)
        assert browser.execute_script("return window.queuelogOldPage === true")  # no reload
        assert browser.execute_script("return window.queuelogViolations") == []
        _shot(browser, "on-call-5-drained", engine, screenshots)
    finally:
        stop.set()
        sender.join(timeout=30)
    assert sorted(completed) == sorted(set(completed)) and len(completed) == JOBS  # each once
    assert _type(server, admin)["circuit_state"]["state"] == "closed"
