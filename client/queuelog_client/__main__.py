"""`python -m queuelog_client worker …`: the worker runner without the server installed."""

import sys

from queuelog_client.cli import module_main

if __name__ == "__main__":
    sys.exit(module_main())
