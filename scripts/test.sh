#!/bin/sh
# Install queuelog with its test extra (the client's package comes inside it) into
# ./.venv-test (a plain, non-editable install, as users get) and run the whole suite.
# Arguments go to pytest (e.g. -m "not slow" for the fast tests alone). The PostgreSQL half
# runs when QUEUELOG_TEST_POSTGRES_URL names a server; otherwise the summary says it skipped.
set -eu
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv-test/bin/python ] || "$PYTHON" -m venv .venv-test
.venv-test/bin/python -m pip install --quiet --upgrade pip
# setuptools packs whatever an earlier build left in build/lib into the wheel it makes.
rm -rf build client/build
.venv-test/bin/python -m pip install --quiet ".[test,bench]"
# Byte-compile the checkout's code once: the test servers' gunicorn workers and the bench
# scripts import it from here (PYTHONPATH, tests/servers.py), and where
# PYTHONDONTWRITEBYTECODE is set (as in our image) none of them may write a .pyc, so each of
# the hundreds of workers the suite boots compiled all of it again (about 0.14 CPU-s of a
# worker's 0.65 s boot). __pycache__ is ignored by git and left out of the wheel.
.venv-test/bin/python -m compileall -q -j 0 app queuelog_gunicorn alembic bench tests wsgi.py >/dev/null
# Four processes (pytest-xdist), a file at a time each: much of the suite waits on real
# servers, leases and schedule slots, so even on two cores more processes than cores find CPU
# the others leave idle. A run of two used about a third of it. On one 2-core machine, the
# whole CI took 29:23 with three (151 s of it building the container's base image, once per
# machine) and 27:09 with four, the CPU then about 90 % busy: more would not help. A file's
# fixtures (the built image, the browser) are made once. `-n 0` after the script runs one
# process.
# The files run longest first (tests/longest_files.txt, in tests/conftest.py), not in
# pytest-xdist's default order (most tests first), which left the long files with few tests
# to the end, one process running them while the other idled.
# The 30 slowest tests are listed at the end, and the 20 files that cost the most CPU
# (tests/cpu_accounting.py): with the CPU the limit, the second list is where a shorter run
# comes from.
exec .venv-test/bin/python -m pytest -n 4 --dist loadfile --no-loadscope-reorder --durations=30 "$@"
