"""An HTTP client of the queue, one per producer or worker thread, as a real caller would hold."""

from __future__ import annotations

from collections import Counter
from typing import Any

import requests

from tests.servers import GunicornServer

REQUEST_TIMEOUT_SECONDS = 60


class QueueClient:
    """Calls the API of `server` with one key over one keep-alive session.

    It asks the server for its URL on every call, so it follows a server restarted on another
    port. `statuses` counts the answers by status, for the tests' "no 5xx" assertions.
    """

    def __init__(self, server: GunicornServer, token: str) -> None:
        self.server = server
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.statuses: Counter[int] = Counter()

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", REQUEST_TIMEOUT_SECONDS)
        response = self.session.request(method, f"{self.server.url}{path}", **kwargs)
        self.statuses[response.status_code] += 1
        return response

    def enqueue(self, body: dict[str, Any], idempotency_key: str | None = None
                ) -> requests.Response:
        headers = {} if idempotency_key is None else {"Idempotency-Key": idempotency_key}
        return self.request("POST", "/jobs", json=body, headers=headers)

    def claim(self, **body: Any) -> requests.Response:
        return self.request("POST", "/jobs/claim", json=body)

    def claim_many(self, **body: Any) -> requests.Response:
        return self.request("POST", "/jobs/claim-many", json=body)

    def complete_many(self, items: list[dict[str, Any]]) -> requests.Response:
        return self.request("POST", "/jobs/complete-many", json={"items": items})

    def heartbeat(self, job_id: int, **body: Any) -> requests.Response:
        return self.request("POST", f"/jobs/{job_id}/heartbeat", json=body)

    def complete(self, job_id: int, **body: Any) -> requests.Response:
        return self.request("POST", f"/jobs/{job_id}/complete", json=body)

    def get(self, job_id: int) -> requests.Response:
        return self.request("GET", f"/jobs/{job_id}")

    def list_all(self, **query: Any) -> list[dict[str, Any]]:
        """Every job the key may see (filtered by `query`), following next_cursor."""
        jobs: list[dict[str, Any]] = []
        params = {"limit": 500, **query}
        while True:
            response = self.request("GET", "/jobs", params=params)
            assert response.status_code == 200, response.text
            page = response.json()
            jobs.extend(page["jobs"])
            if page["next_cursor"] is None:
                return jobs
            params["cursor"] = page["next_cursor"]

    def close(self) -> None:
        self.session.close()


def server_errors(clients: list[QueueClient]) -> dict[int, int]:
    """The 5xx answers all these clients saw, by status."""
    total: Counter[int] = Counter()
    for client in clients:
        total.update(client.statuses)
    return {status: count for status, count in total.items() if status >= 500}
