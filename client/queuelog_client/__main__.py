"""`python -m queuelog_client worker …`: the worker runner without the server installed."""

import sys

from queuelog_client.cli import main

if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] != "worker":
        sys.stderr.write("usage: python -m queuelog_client worker --help\n")
        sys.exit(2)
    sys.exit(main(args[1:], prog="python -m queuelog_client worker"))
