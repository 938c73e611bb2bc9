"""The benchmark scripts that measure PostgreSQL beside SQLite still run, at smoke size, on both
engines when the tests have a PostgreSQL server (tests/bench/test_bench_smoke.py has the rest
and says what is checked): a third of them here, the others in test_bench_smoke_engines_2.py
and _3.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.test_bench_smoke import engine_scripts, smoke_run_prints_its_table


@pytest.mark.slow
@pytest.mark.parametrize("script", engine_scripts(0))
def test_benchmark_runs_at_smoke_size_on_both_engines(script: str, tmp_path: Path) -> None:
    smoke_run_prints_its_table(script, tmp_path)
