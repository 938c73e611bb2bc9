"""Schemathesis against the live server, from its own /openapi.json: the documented examples,
boundary values (coverage), fuzzed valid and invalid data, and stateful sequences that follow
the links it infers (enqueue, then read, claim, complete…), with every check it has: no 5xx,
responses, status codes, content types and headers as documented, invalid data refused,
authentication enforced (each operation is also tried without a key and with a wrong one).
Zero failures.

Each role sees a different API, so it runs twice, one test file each (so that the two runs
can go to different test processes): with the admin key (and the worker key on the worker
routes, see schemathesis_hooks.py) in test_schemathesis.py, and with a producer key on every
route, whose 403s must be documented too, in test_schemathesis_as_producer.py (on SQLite
alone: a producer's refusals are decided before any statement reaches the database).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.servers import REPO_ROOT, LiveServer, create_api_key

HERE = Path(__file__).resolve().parent
# Fuzzed examples per operation, beside the examples and coverage phases, which walk every
# operation's documented examples and boundary values whatever this says. The producer's run
# is there for its answers' statuses (a 403 on every route it may not use, documented) and its
# own routes' bodies, which the admin's run fuzzes too: fewer examples find those as surely.
# The admin's run fuzzes 30 per operation (about 60 operations, both engines, every CI run;
# the seed changes each run, so the fuzzing adds up over runs).
MAX_EXAMPLES = {"admin-and-worker": 30, "producer": 20}
RUN_TIMEOUT_SECONDS = 300


def run_schemathesis(keys: str, server: LiveServer, url: str, tmp_path: Path) -> None:
    """Run schemathesis against `server` (on the database `url`) with the keys of `keys`
    ("admin-and-worker" or "producer"); fail with its report unless it finds nothing."""
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
        "--max-examples", str(MAX_EXAMPLES[keys]),
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
