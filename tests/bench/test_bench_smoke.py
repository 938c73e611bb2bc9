"""Every benchmark script still runs: each at smoke size (a few hundred jobs, one repeat) in
its own process. Nothing here looks at a timing; the figures are for bench/RESULTS.md."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.data import POSTGRES_VARIABLE
from bench.servers import SMOKE_WORKERS_VARIABLE
from tests.conftest import POSTGRES_URL_VARIABLE
from tests.servers import REPO_ROOT, server_environment

# script: the first line of the report it prints, and a column of its first table.
SCRIPTS = {
    "costs": ("== What a job costs: statements, round trips and rows written per plain step",
              "round trips"),
    "storage": ("== Storage: repository vs raw sqlite3", "repository / raw"),
    "depth": ("== Depth: claim latency", "statement p50"),
    "http_single": ("== HTTP, one job per request", "bare Flask jobs/s"),
    "http_events": ("== HTTP claim + complete: events on vs off", "events off jobs/s"),
    "http_batch": ("== HTTP, batches and long polling", "jobs per request"),
    "await_latency": ("== Waiting for a result across processes", "p99"),
    "peers": ("== Peers:", "dequeue + ack jobs/s"),
    "peer_servers": ("== Peer servers: queuelog over HTTP beside procrastinate and RQ",
                     "queuelog / peer"),
    # Its table's column shows whether pg-boss was measured or skipped (no Node or npm, or
    # no network to install them): the smoke run does not depend on downloading pg-boss.
    "pgboss": ("== pg-boss: queuelog over HTTP beside pg-boss on the same PostgreSQL",
               "queuelog / pg-boss"),
    "memory": ("== Memory: one gunicorn worker", "peak (VmHWM) after"),
    "flow": ("== Flow control: limited claims and GET /types", "limits configured, not reached"),
    "workflows": ("== Workflows: dependency wake-up, enqueue, fan-in", "workflow / batch"),
    "keys": ("== Fair share and ordered keys: claim cost", "fairness on / off, claims"),
    "heartbeat": ("== Heartbeats with progress: cost beside a plain heartbeat",
                  "time / plain's"),
    "reserve": ("== Reserved jobs: reserve + confirm, and the check-back",
                "reserve + confirm / plain"),
    "enqueue_options": ("== Enqueue options: what each field costs a single enqueue",
                        "time / plain's"),
    "retention": ("== Retention: enqueues and claims while a million expired jobs are removed",
                  "during / baseline"),
    "failures": ("== Failure groups: GET /failures with a million stored jobs",
                 "million / small p50"),
    "tags": ("== Tags: GET /jobs?tag= at a million jobs", "jobs shown"),
    "over_time": ("== Stats over time: what counting costs", "stats off jobs/s"),
    "dashboard": ("== Dashboard: page times", "jobs, no filter"),
    "push": ("== Push delivery: the dispatcher vs a plain HTTP loop", "dispatch / plain"),
    "backlog": ("== Backlog: explain and the counting read paths at a million pending",
                "statistic"),
    "bloat": ("== Bloat: claim rate after a million jobs cycled", "after 500 jobs cycled"),
    "long_transaction": ("== Long transaction: the claim rate while a snapshot is held open",
                         "claims + completes /s"),
    "wakes": ("== Database wakes: idle statements, cross-host wakes, enqueue cost",
              "QUEUELOG_NOTIFY=0 (peeking)"),
    "waits": ("== Waits: one event resuming many, claims beside suspended jobs, the suspend "
              "cycle", "jobs woken"),
    "protection": ("== A type that protects itself: a closed circuit's and a retry budget's "
                   "cost", "circuit breaker (closed) and retry budget configured"),
}
# The scripts that measure PostgreSQL beside SQLite do so here too when the tests have a
# PostgreSQL server (smoke sizes: a few seconds more each); pgboss measures PostgreSQL only.
ENGINE_SCRIPTS = frozenset({"costs", "http_single", "http_batch", "peer_servers", "pgboss",
                            "flow", "workflows", "keys", "heartbeat", "reserve",
                            "enqueue_options", "retention", "failures", "tags", "over_time",
                            "backlog", "bloat",
                            "long_transaction", "wakes", "waits", "protection"})
# They take a minute or two each: they are shared out over three files, so that the two test
# processes (which take a file at a time) can each take some, and none is left alone at the end.
ENGINE_SHARES = 3


def engine_scripts(share: int) -> list[str]:
    return sorted(ENGINE_SCRIPTS)[share::ENGINE_SHARES]


def run_bench(*argv: str, tmp_path: Path,
              postgres: bool = False) -> subprocess.CompletedProcess[str]:
    env = server_environment(tmp_path)
    # One gunicorn worker per server the script starts: the run reads no figure, and each
    # server then boots one worker rather than one per core (bench/servers.py).
    env[SMOKE_WORKERS_VARIABLE] = "1"
    server = os.environ.get(POSTGRES_URL_VARIABLE)
    if postgres and server:
        env[POSTGRES_VARIABLE] = server
        # The databases a smoke run makes commit without waiting for the disk, as the tests'
        # own do (tests/conftest.py): its figures are not read here.
        env["PGOPTIONS"] = "-c synchronous_commit=off"
    return subprocess.run([sys.executable, *argv], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def smoke_run_prints_its_table(script: str, tmp_path: Path) -> None:
    done = run_bench(f"bench/{script}.py", "--smoke", tmp_path=tmp_path,
                     postgres=script in ENGINE_SCRIPTS)

    assert done.returncode == 0, done.stderr[-4000:]
    heading, column = SCRIPTS[script]
    assert heading in done.stdout
    assert column in done.stdout


# The scripts that measure both engines are smoked in test_bench_smoke_engines*.py.
@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(set(SCRIPTS) - ENGINE_SCRIPTS))
def test_benchmark_runs_at_smoke_size_and_prints_its_table(script: str,
                                                           tmp_path: Path) -> None:
    smoke_run_prints_its_table(script, tmp_path)


@pytest.mark.slow
def test_run_all_writes_the_results_document(tmp_path: Path) -> None:
    output = tmp_path / "RESULTS.md"

    done = run_bench("bench/run_all.py", "--smoke", "--only", "storage", "--output",
                     str(output), tmp_path=tmp_path)

    assert done.returncode == 0, done.stderr[-4000:]
    text = output.read_text()
    assert "## Machine" in text
    assert "## Targets" in text
    assert "## Storage: repository vs raw sqlite3" in text
