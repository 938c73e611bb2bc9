"""Schemathesis against the live server with a producer key on every route, whose 403s
must be documented too (tests/e2e/schemathesis_run.py says what it runs and checks)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.schemathesis_run import run_schemathesis
from tests.servers import LiveServer


@pytest.mark.slow
def test_schemathesis_finds_no_failure_as_a_producer(
        start_server: Callable[..., LiveServer], server_database_url: str,
        tmp_path: Path) -> None:
    run_schemathesis("producer", start_server(server_database_url),
                     server_database_url, tmp_path)
