"""A queue worker as its own OS process, for the rescue proof: it claims jobs with a short
lease, prints each one as a JSON line, then holds them (no heartbeat, no complete) until it
is killed.

    python -m tests.e2e.worker_process BASE_URL TOKEN COUNT LEASE_SECONDS
"""

from __future__ import annotations

import json
import sys
import time

import requests

HOLD_SECONDS = 300  # killed long before; the bound only keeps a stray process from lingering


def main(base_url: str, token: str, count: int, lease_seconds: int) -> None:
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    claimed = 0
    deadline = time.monotonic() + HOLD_SECONDS
    while claimed < count and time.monotonic() < deadline:
        response = session.post(f"{base_url}/jobs/claim", json={"lease_seconds": lease_seconds},
                                timeout=30)
        if response.status_code == 204:
            time.sleep(0.05)
            continue
        response.raise_for_status()
        job = response.json()
        print(json.dumps({"id": job["id"], "lease_token": job["lease_token"]}), flush=True)
        claimed += 1
    print(json.dumps({"holding": claimed}), flush=True)
    time.sleep(max(0.0, deadline - time.monotonic()))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
