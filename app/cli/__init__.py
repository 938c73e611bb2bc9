"""`queuelog`, the operator's command line: entry.py is the command and the processes it runs,
operate.py the commands that act on the database."""

from app.cli.entry import build_cli, main, register_commands, serve
from app.cli.operate import parse_duration

__all__ = ["build_cli", "main", "parse_duration", "register_commands", "serve"]
