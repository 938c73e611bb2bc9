#!/bin/sh
# The container's entry point: bring the database to the newest migration, then become
# gunicorn through `queuelog serve` (the shipped settings). `exec` here and queuelog serve's
# own exec make gunicorn this very process (PID 1 in the container), so the stop signal
# reaches it directly and starts its graceful shutdown.
#
# Without QUEUELOG_DATABASE_URL the SQLite file goes in QUEUELOG_DATA_DIR (the volume).
# Arguments are passed on to gunicorn (e.g. --workers 2).
#
# QUEUELOG_DISPATCH=1 runs the push dispatcher too: not from here (a process started beside
# an exec'd gunicorn would never get the stop signal, which goes to PID 1 alone) but as the
# gunicorn master's child (queuelog_gunicorn/conf.py and dispatch.py), which stops it.
set -eu

if [ -z "${QUEUELOG_DATABASE_URL:-}" ]; then
    QUEUELOG_DATABASE_URL="sqlite:///${QUEUELOG_DATA_DIR:-/var/lib/queuelog}/queuelog.sqlite3"
    export QUEUELOG_DATABASE_URL
fi

# SQLite needs to create the file, its -wal and -shm beside it: say so plainly if it cannot,
# rather than let the migration fail with "unable to open database file".
case "$QUEUELOG_DATABASE_URL" in
    sqlite:///*)
        db_path="${QUEUELOG_DATABASE_URL#sqlite:///}"
        db_dir="$(dirname "${db_path%%\?*}")"
        if [ ! -d "$db_dir" ] || [ ! -w "$db_dir" ]; then
            echo "entrypoint: $db_dir is not a writable directory; mount a volume there" \
                 "writable by uid $(id -u), or set QUEUELOG_DATABASE_URL" >&2
            exit 1
        fi
        ;;
esac

# Its progress goes to stderr: stdout carries only the JSON request lines.
queuelog db upgrade >&2

exec queuelog serve "$@"
