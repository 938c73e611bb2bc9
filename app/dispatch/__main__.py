"""`python -m app.dispatch [--concurrency N]`: `queuelog dispatch`, as the gunicorn master
starts it in the container (QUEUELOG_DISPATCH=1), without needing the console script."""

import sys

from app.cli import main

sys.argv = ["queuelog", "dispatch", *sys.argv[1:]]
main()
