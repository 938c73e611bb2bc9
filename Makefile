# One command per job, the same locally and in CI.
.PHONY: serve test test-fast lint bench

serve:
	sh scripts/serve.sh

test:
	sh scripts/test.sh

test-fast:
	sh scripts/test.sh -m "not slow"

lint:
	.venv-test/bin/ruff check .
	.venv-test/bin/lint-imports
	.venv-test/bin/mypy

# The benchmarks (docs/BENCHMARKS.md): about two hours on 2 cores; writes
# bench/RESULTS.md. The venv holds the project and the peers bench/peers.py compares with.
bench: .venv-bench/bin/python
	PYTHONPATH=. .venv-bench/bin/python bench/run_all.py

.venv-bench/bin/python:
	python3 -m venv .venv-bench
	.venv-bench/bin/python -m pip install --quiet ".[bench]"
