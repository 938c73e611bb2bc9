# One command per job, the same locally and in CI.
.PHONY: serve test test-fast lint

serve:
	sh scripts/serve.sh

test:
	sh scripts/test.sh

test-fast:
	sh scripts/test.sh -m "not slow"

lint:
	.venv-test/bin/ruff check .
