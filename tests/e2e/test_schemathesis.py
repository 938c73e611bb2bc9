"""Schemathesis against the live server, from its own /openapi.json: the documented examples,
boundary values (coverage), fuzzed valid and invalid data, and stateful sequences that follow
the links it infers (enqueue, then read, claim, complete…), with every check it has: no 5xx,
responses, status codes, content types and headers as documented, invalid data refused,
authentication enforced (each operation is also tried without a key and with a wrong one).
Zero failures.

Each role sees a different API, so it runs twice: with the admin key (and the worker key on
the worker routes, see schemathesis_hooks.py), and with a producer key on every route, whose
403s must be documented too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.servers import REPO_ROOT, LiveServer, create_api_key

HERE = Path(__file__).resolve().parent
MAX_EXAMPLES = 50
RUN_TIMEOUT_SECONDS = 300


@pytest.mark.slow
@pytest.mark.parametrize("keys", ["admin-and-worker", "producer"])
def test_schemathesis_finds_no_failure_against_the_live_server(
        keys: str, start_server: Callable[..., LiveServer], server_database_url: str,
        tmp_path: Path) -> None:
    url = server_database_url
    server = start_server(url)
    if keys == "producer":
        tokens = {"default": create_api_key(url, "producer-1", "producer")}
    else:
        tokens = {"default": create_api_key(url, "admin-1", "admin"),
                  "worker": create_api_key(url, "worker-1", "worker")}
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        "SCHEMATHESIS_HOOKS": "tests.e2e.schemathesis_hooks",
        "QUEUELOG_ST_KEYS": json.dumps(tokens),
    }
    command = [
        sys.executable, "-m", "schemathesis.cli",
        "--config-file", str(HERE / "schemathesis.toml"),
        "run", f"{server.url}/openapi.json",
        "--checks", "all",
        "--phases", "examples,coverage,fuzzing,stateful",
        "--max-examples", str(MAX_EXAMPLES),
        "--request-timeout", "30",
        "--generation-database", "none",
        "--no-color",
    ]
    if os.environ.get("QUEUELOG_ST_SEED"):  # to replay a failing run: its report names the seed
        command += ["--seed", os.environ["QUEUELOG_ST_SEED"]]

    # Run from tmp_path: schemathesis keeps a cache directory where it runs.
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=RUN_TIMEOUT_SECONDS, check=False)

    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    # Every operation of the document was exercised, none filtered out or skipped.
    selected = re.search(r"Selected: (\d+)/(\d+)", report)
    tested = re.search(r"Tested: (\d+)", report)
    assert selected and tested, report
    assert int(tested[1]) == int(selected[1]) == int(selected[2]), report
