#!/bin/sh
# Install queuelog with its test extra into ./.venv and run the whole test suite.
# Arguments go to pytest (e.g. -m "not slow" for the fast tests alone). The PostgreSQL half
# runs when QUEUELOG_TEST_POSTGRES_URL names a server; otherwise the summary says it skipped.
set -eu
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet ".[test]"
exec .venv/bin/python -m pytest "$@"
