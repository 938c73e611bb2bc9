"""The benchmark scripts that measure PostgreSQL beside SQLite still run, at smoke size, on both
engines when the tests have a PostgreSQL server (tests/bench/test_bench_smoke.py has the rest
and says what is checked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.test_bench_smoke import ENGINE_SCRIPTS, smoke_run_prints_its_table


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(ENGINE_SCRIPTS))
def test_benchmark_runs_at_smoke_size_on_both_engines(script: str, tmp_path: Path) -> None:
    smoke_run_prints_its_table(script, tmp_path)
