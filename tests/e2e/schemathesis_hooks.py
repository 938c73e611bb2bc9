"""Loaded by `st run` through SCHEMATHESIS_HOOKS: which key each operation is called with.

QUEUELOG_ST_KEYS holds {"default": token, "worker": token}: the worker's key for the routes
only workers may use (claim, heartbeat, complete, fail), the default key for the rest. Each
request then reaches the route's logic instead of stopping at 403, and schemathesis still
probes every operation without a key and with a wrong one.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import schemathesis

_WORKER_ROUTES = re.compile(
    r"^/jobs/(claim|claim-many|complete-many|\{job_id\}/(heartbeat|complete|fail))$")
_KEYS: dict[str, str] = json.loads(os.environ.get("QUEUELOG_ST_KEYS", "{}"))


# No caching: the token depends on the operation, and a cached one would leak across them.
@schemathesis.auth(refresh_interval=None)
class KeyPerRole:
    def get(self, case: Any, context: Any) -> str:
        operation = context.operation
        if operation.method.upper() == "POST" and _WORKER_ROUTES.match(operation.path):
            return _KEYS.get("worker", _KEYS["default"])
        return _KEYS["default"]

    def set(self, case: Any, data: str, context: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


# A claim may wait up to 20 s for work, by design (long polling, proven by
# tests/jobs/test_waiting.py). Fuzzing hundreds of claims that each wait that long would
# only measure the sleep, so valid generated waits are shortened to a tenth of a second (a
# wait all the same: the claim registers, sleeps and gives up as a longer one does); every
# other field, and out-of-range wait_seconds, are sent as generated.
_LONGEST_FUZZED_WAIT = 0.1


@schemathesis.hook
def map_body(context: Any, body: Any) -> Any:
    wait = body.get("wait_seconds") if isinstance(body, dict) else None
    valid_wait = isinstance(wait, int | float) and not isinstance(wait, bool) and wait <= 20
    if valid_wait and wait > _LONGEST_FUZZED_WAIT:
        return {**body, "wait_seconds": _LONGEST_FUZZED_WAIT}
    return body


# Likewise GET /jobs/{id}?wait_seconds=N may wait up to 60 s for a job to finish (proven by
# tests/jobs/test_wait_for_result.py): valid generated waits are shortened the same way.
@schemathesis.hook
def map_query(context: Any, query: Any) -> Any:
    wait = query.get("wait_seconds") if isinstance(query, dict) else None
    try:
        seconds = float(wait) if isinstance(wait, str) else None
    except ValueError:
        seconds = None
    if seconds is not None and _LONGEST_FUZZED_WAIT < seconds <= 60:
        return {**query, "wait_seconds": str(_LONGEST_FUZZED_WAIT)}
    return query
