"""Schemathesis against the live server with the admin key, and the worker key on the worker
routes (tests/e2e/schemathesis_run.py says what it runs and checks)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.schemathesis_run import run_schemathesis
from tests.servers import LiveServer


@pytest.mark.slow
def test_schemathesis_finds_no_failure_against_the_live_server(
        start_server: Callable[..., LiveServer], server_database_url: str,
        tmp_path: Path) -> None:
    run_schemathesis("admin-and-worker", start_server(server_database_url),
                     server_database_url, tmp_path)
