#!/bin/sh
# Install queuelog into ./.venv, migrate its database and serve it on 127.0.0.1:8000.
# Job types default to "email,report" here; set QUEUELOG_JOB_TYPES to choose your own.
# The install is editable, so the checkout's code is what runs, and its instance/ folder
# holds the SQLite file. `queuelog serve` runs gunicorn with the shipped settings
# (queuelog_gunicorn/conf.py). Arguments to this script go to `queuelog serve`: --port 9000
# and --host 0.0.0.0 choose the address (else QUEUELOG_BIND, several comma-separated), and
# any other option is gunicorn's (--workers 2).
set -eu
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# Install when the venv is new or the project's metadata changed, not on every start: a
# later start then needs no package index.
STAMP=.venv/queuelog-installed
METADATA=$(cat setup.cfg setup.py pyproject.toml | cksum)
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$METADATA" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e .
    echo "$METADATA" > "$STAMP"
fi
export QUEUELOG_JOB_TYPES="${QUEUELOG_JOB_TYPES:-email,report}"
.venv/bin/queuelog db upgrade
echo "queuelog: create keys with .venv/bin/queuelog keys create NAME --role producer|worker|admin"
exec .venv/bin/queuelog serve "$@"
