#!/bin/sh
# Install queuelog into ./.venv, migrate its database and serve it on 127.0.0.1:8000.
# Job types default to "email,report" here; set QUEUELOG_JOB_TYPES to choose your own.
# The install is editable, so gunicorn (which imports wsgi.py from here) and the
# .venv/bin/queuelog command run the same code and use the same instance/ folder.
set -eu
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ./client -e .
export QUEUELOG_JOB_TYPES="${QUEUELOG_JOB_TYPES:-email,report}"
.venv/bin/queuelog db upgrade
echo "queuelog: create keys with .venv/bin/queuelog keys create NAME --role producer|worker|admin"
exec .venv/bin/gunicorn --bind "${QUEUELOG_BIND:-127.0.0.1:8000}" wsgi:app
