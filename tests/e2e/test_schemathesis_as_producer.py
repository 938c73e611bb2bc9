"""Schemathesis against the live server with a producer key on every route, whose 403s
must be documented too (tests/e2e/schemathesis_run.py says what it runs and checks).

On SQLite only: what this run adds to the admin's (a producer's refusals, documented) is
decided before any statement reaches the database; the routes a producer may use are fuzzed
on both engines by the admin's run in test_schemathesis.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.schemathesis_run import run_schemathesis
from tests.servers import LiveServer


@pytest.mark.slow
def test_schemathesis_finds_no_failure_as_a_producer(
        start_server: Callable[..., LiveServer], sqlite_file_url: str,
        tmp_path: Path) -> None:
    run_schemathesis("producer", start_server(sqlite_file_url), sqlite_file_url, tmp_path)
