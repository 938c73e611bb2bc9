"""The README's pictures of the dashboard's charts: the overview and a type's page, as a
1200x900 headless Chromium sees them, saved as overview.png and type.png.

An hour of made-up traffic (three types, the failures and the backlog rising and falling) is
written into a temporary SQLite database through the app itself, its clock walked a minute at
a time over the last hour; then a real gunicorn serves that database and the browser signs in
and takes the pictures. Nothing is kept but the pictures.

    python scripts/screenshots.py [DIRECTORY]      (default: docs/screenshots)

Needs chromium and chromium-driver (apt) and selenium (the test extra).
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python scripts/screenshots.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app import create_app
from app.core.callers import Role
from app.core.clock import MICROS, ManualClock
from app.storage.migrations import upgrade
from tests.servers import REPO_ROOT, LiveServer

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WINDOW = (1200, 900)
JOB_TYPES = ("email", "pdf", "sync")  # the types LiveServer configures
MINUTES = 60
# Every run draws the same traffic.
SEED = 35


def make_traffic(database_url: str) -> str:
    """An hour of traffic, minute by minute up to now, written through the app's own API;
    returns an admin token."""
    minute_us = 60 * MICROS
    now_minute = time.time_ns() // 1000 // minute_us * minute_us
    clock = ManualClock(start_us=now_minute - (MINUTES - 1) * minute_us + 5 * MICROS)
    app = create_app({"DATABASE_URL": database_url, "JOB_TYPES": frozenset(JOB_TYPES),
                      "CLOCK": clock, "TYPE_COUNTS_MAX_AGE_SECONDS": 0})
    # The in-process requests' log lines would bury what the script prints.
    logging.disable(logging.INFO)
    services = app.extensions["queuelog"]
    tokens = {role: services.keys.create_key(f"readme-{role}", Role(role))
              for role in ("producer", "worker", "admin")}
    client = app.test_client()

    def call(path: str, role: str, body: dict[str, Any]) -> Any:
        answer = client.post(path, json=body,
                             headers={"Authorization": f"Bearer {tokens[role]}"})
        assert answer.status_code in (200, 201), answer.get_data(as_text=True)
        return answer.get_json()

    rng = random.Random(SEED)
    for minute in range(MINUTES):
        # Mail comes in waves; PDFs steadily; sync jobs in a burst a quarter of an hour ago.
        arrivals = {"email": round(9 + 7 * math.sin(minute / 6)) + rng.randint(0, 3),
                    "pdf": rng.randint(2, 5),
                    "sync": 14 if 40 <= minute < 44 else rng.randint(0, 1)}
        for job_type, count in arrivals.items():
            for _ in range(count):
                call("/jobs", "producer", {"type": job_type, "payload": {"minute": minute},
                                           "max_retries": 0})
        # The workers keep up with a part of it: the backlog rises with the waves.
        for job_type, capacity in (("email", 10), ("pdf", 4), ("sync", 5)):
            for _ in range(capacity):
                claimed = client.post("/jobs/claim", json={"types": [job_type]}, headers={
                    "Authorization": f"Bearer {tokens['worker']}"})
                if claimed.status_code != 200:
                    break
                job = claimed.get_json()
                if rng.random() < (0.25 if 20 <= minute < 26 and job_type == "email" else 0.04):
                    call(f"/jobs/{job['id']}/fail", "worker",
                         {"lease_token": job["lease_token"], "error": "SMTP 451: try later"})
                else:
                    call(f"/jobs/{job['id']}/complete", "worker",
                         {"lease_token": job["lease_token"], "result": {"ok": True}})
        services.stats.sample_depth()
        clock.advance(60)
    services.db.engine.dispose()
    return str(tokens["admin"])


def take_screenshots(url_of: Any, admin_token: str, directory: Path) -> list[Path]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     f"--window-size={WINDOW[0]},{WINDOW[1]}", "--lang=en-US",
                     "--disable-gpu", "--hide-scrollbars"):
        options.add_argument(argument)
    browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    saved = []
    try:
        # The page itself 1200x900, whatever the window's frame takes.
        browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": WINDOW[0], "height": WINDOW[1], "deviceScaleFactor": 1, "mobile": False})
        browser.get(url_of("/ui/sign-in"))
        browser.find_element(By.ID, "token").send_keys(admin_token)
        browser.find_element(By.CSS_SELECTOR, "form.sign-in button[type=submit]").click()
        browser.find_element(By.ID, "charts-heading")  # signed in: the overview
        directory.mkdir(parents=True, exist_ok=True)
        for name, path in (("overview", "/ui/"), ("type", "/ui/types/email")):
            browser.get(url_of(path))
            browser.find_element(By.CSS_SELECTOR, "svg.chart")
            target = directory / f"{name}.png"
            assert browser.save_screenshot(str(target)), target
            saved.append(target)
    finally:
        browser.quit()
    return saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", nargs="?", type=Path, default=REPO_ROOT / "docs" / "img",
                        help="where overview.png and type.png go (default: docs/screenshots)")
    directory = parser.parse_args().directory.resolve()
    with tempfile.TemporaryDirectory(prefix="queuelog-screenshots-") as scratch:
        database_url = f"sqlite:///{Path(scratch) / 'readme.sqlite3'}"
        upgrade(database_url)
        admin_token = make_traffic(database_url)
        with LiveServer(database_url, log_path=Path(scratch) / "gunicorn.log", workers=1,
                        threads=4) as server:
            server.start()
            for path in take_screenshots(server.url_of, admin_token, directory):
                print(f"{path} ({path.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
