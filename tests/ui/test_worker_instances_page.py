"""The dashboard's workers: each key's instances under it (the label each worker process
sends, shown as text, as reported), and a job's attempts naming theirs."""

from __future__ import annotations

import html
import re

from flask.testing import FlaskClient

from app.core.clock import ManualClock
from tests.conftest import Api, Key

HOSTILE_LABEL = "<b>host</b>:1"


def _rows(page: str, table_id: str) -> list[str]:
    table = page[page.index(f'<table id="{table_id}">'):]
    table = table[:table.index("</table>")]
    return [" ".join(re.sub(r"<[^>]+>", " ", row).split())
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.DOTALL)[1:]]


def test_the_overview_lists_each_keys_instances_under_it(
        signed_in: FlaskClient, api: Api, producer: Key, make_key, clock: ManualClock) -> None:
    mailer = make_key("mailer", "worker")
    idle = make_key("idle", "worker")
    for _ in range(3):
        api.enqueue(producer)
    api.claim(mailer, instance="host-a:4242")
    api.claim(mailer, instance="host-a:4242")
    api.claim(mailer, instance=HOSTILE_LABEL)
    api.claim(idle)
    clock.advance(60)
    api.claim(mailer, instance="host-a:4242")  # writes what the last minute counted
    page = signed_in.get("/ui/").text
    assert "<b>host" not in page
    assert html.escape(HOSTILE_LABEL, quote=False) in page
    # Each key (its types, running, claimed in the last minute, last seen), and under it
    # each instance (running, claimed in the last minute, last seen).
    assert _rows(page, "workers") == [
        "idle every type 0 — 2027-01-15 08:00:00 UTC (1 min ago)",
        "mailer every type 3 2 2027-01-15 08:01:00 UTC (just now)",
        "mailer · &lt;b&gt;host&lt;/b&gt;:1 1 0 2027-01-15 08:00:00 UTC (1 min ago)",
        "mailer · host-a:4242 2 2 2027-01-15 08:01:00 UTC (just now)"]


def test_the_job_page_names_each_attempts_instance(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key) -> None:
    job_id = api.enqueue(producer, max_retries=1).get_json()["id"]
    api.claim(worker, instance="host-a:4242")
    api.fail(worker, job_id, retry_in_seconds=0)
    api.claim(worker)
    rows = _rows(signed_in.get(f"/ui/jobs/{job_id}").text, "attempts")
    assert rows[0].startswith("1 worker-1 host-a:4242 ")
    assert rows[1].startswith("2 worker-1 — ")
