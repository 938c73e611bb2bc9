"""Dashboard: the server time of its pages with a million stored jobs.

One admin signed in to the dashboard (a session cookie, as a browser holds it) asks for the
overview, the jobs list (unfiltered, and with each filter), a deep page of it, and a job's
page, in turns, over one keep-alive connection to a gunicorn server with the shipped
settings. The store is bench/flow.py's million (940k completed, 20k failed, 10k cancelled,
25k pending, 5k running, inserted in that order, so that a filter on a rare status has the
most rows to pass over). Timed on the client over loopback: an upper bound of server time.

    PYTHONPATH=. python bench/dashboard.py [--smoke] [--repeats N]
"""

from __future__ import annotations

import http.client
import os
import re
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/dashboard.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.jobs.domain.cursor import encode_cursor
from bench.data import create_keys, scratch_directory
from bench.flow import STORE_FULL, STORE_SMOKE, build_million
from bench.load import LOOPBACK
from bench.report import Report, Table, Target, load_note, run_script
from bench.servers import queuelog_server
from bench.stats import Spread, ms, percentile

FULL_REQUESTS, SMOKE_REQUESTS = 100, 5
TARGET_MS = 200.0
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


class Browser:
    """One keep-alive connection holding the dashboard's session cookie."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection(LOOPBACK, port, timeout=60)
        self.cookie = ""

    def request(self, method: str, path: str, form: dict[str, str] | None = None,
                expect: int = 200) -> str:
        headers = {"Cookie": self.cookie} if self.cookie else {}
        body = None
        if form is not None:
            body = urllib.parse.urlencode(form)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        self.conn.request(method, path, body=body, headers=headers)
        response = self.conn.getresponse()
        text = response.read().decode()
        set_cookie = response.getheader("Set-Cookie")
        if set_cookie:
            self.cookie = set_cookie.split(";", 1)[0]
        if response.status != expect:
            raise RuntimeError(f"{method} {path} answered {response.status}: {text[:300]}")
        return text

    def sign_in(self, token: str) -> None:
        page = self.request("GET", "/ui/sign-in")
        match = _CSRF.search(page)
        assert match is not None
        self.request("POST", "/ui/sign-in", {"token": token, "csrf_token": match.group(1)},
                     expect=302)

    def close(self) -> None:
        self.conn.close()


def pages(store: list[tuple[str, int]]) -> list[tuple[str, str]]:
    """(label, path) of each page timed; ids follow the store's insertion order."""
    first_id: dict[str, int] = {}
    next_id = 1
    for status, count in store:
        first_id[status] = next_id
        next_id += count
    middle = next_id // 2
    return [
        ("overview", "/ui/"),
        ("jobs, no filter", "/ui/jobs"),
        ("jobs, type=email", "/ui/jobs?type=email"),
        ("jobs, status=failed (rare, after the completed)", "/ui/jobs?status=failed"),
        ("jobs, type=report, status=pending", "/ui/jobs?type=report&status=pending"),
        ("jobs, producer=producer-0, status=running",
         "/ui/jobs?producer=producer-0&status=running"),
        ("jobs, a page in the middle (cursor)", f"/ui/jobs?cursor={encode_cursor(middle)}"),
        ("job page, a failed job", f"/ui/jobs/{first_id['failed']}"),
        ("job page, a pending job (explain counts the jobs ahead)",
         f"/ui/jobs/{first_id['pending'] + store[3][1] - 1}"),
    ]


def measure(options: Any) -> Report:
    store = STORE_SMOKE if options.smoke else STORE_FULL
    requests = SMOKE_REQUESTS if options.smoke else FULL_REQUESTS
    total = sum(count for _status, count in store)
    timed = pages(store)
    p50 = {label: Spread() for label, _ in timed}
    p95 = {label: Spread() for label, _ in timed}
    load = os.getloadavg()
    with scratch_directory("queuelog-bench-dashboard-") as directory:
        url = build_million(directory, store)
        tokens = create_keys(url, {"admin-0": "admin"})
        with queuelog_server(directory, url) as server:
            browser = Browser(server.port)
            browser.sign_in(tokens["admin-0"])
            for _label, path in timed:  # each page once, before the clock starts
                browser.request("GET", path)
            for _repeat in range(options.repeats):
                latencies: dict[str, list[float]] = {label: [] for label, _ in timed}
                for _ in range(requests):
                    for label, path in timed:  # in turns: the machine's load falls on all
                        began = time.perf_counter()
                        browser.request("GET", path)
                        latencies[label].append(time.perf_counter() - began)
                for label, values in latencies.items():
                    p50[label].add(ms(percentile(values, 50)))
                    p95[label].add(ms(percentile(values, 95)))
            browser.close()
    report = Report("Dashboard: page times with a million stored jobs",
                    "python bench/dashboard.py", options.smoke, options.repeats)
    table = Table(f"GET of each page, one signed-in admin, SQLite, {total:,} jobs stored, "
                  f"{requests} requests per page and repeat (ms; median [min-max] over "
                  "repeats)", ["page", "p50", "p95"])
    for label, _path in timed:
        table.add(label, p50[label].show(2), p95[label].show(2))
    report.tables.append(table)
    worst = max(timed, key=lambda page: p95[page[0]].median)[0]
    report.targets.append(Target(f"every page's p95, {total:,} jobs stored (worst: {worst})",
                                 f"< {TARGET_MS:.0f} ms", p95[worst].show(2, " ms"),
                                 p95[worst].median < TARGET_MS))
    report.notes += [
        load_note(load),
        "Each page is what a browser gets: the session is read and the admin key looked up "
        "in the database on every page, then the same services as the JSON API (GET /types "
        "counts, /workers, the id-ordered job listing with its filters, a job's attempts, "
        "events and explanation), rendered by Jinja2.",
    ]
    return report


def main(argv: list[str] | None = None) -> None:
    run_script(measure, __doc__, argv)


if __name__ == "__main__":
    main()
