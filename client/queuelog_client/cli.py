"""The worker runner's command line: `queuelog worker --url URL --types a,b --handler m:f`.

argparse rather than click so the client needs nothing beyond the standard library; the
server's `queuelog` command hands its `worker` arguments to `main` unchanged.
The token comes from QUEUELOG_TOKEN or --token-file, never from an argument: a command
line is visible to every user of the host (ps, /proc) and stays in shell history.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from queuelog_client._version import __version__
from queuelog_client.client import MAX_CLAIM_WAIT_SECONDS, check_url
from queuelog_client.errors import ProblemError
from queuelog_client.logs import FORMAT as LOG_FORMAT
from queuelog_client.worker import (
    INSTANCE_VARIABLE,
    RECONNECT_BACKOFF_MAX_SECONDS,
    Worker,
    check_instance,
    default_instance,
    load_handler,
)

TOKEN_VARIABLE = "QUEUELOG_TOKEN"  # noqa: S105 - a variable name, not a secret
URL_VARIABLE = "QUEUELOG_URL"


class OneLineParser(argparse.ArgumentParser):
    """A mistake on the command line is one line on stderr (exit 2): what is wrong, the short
    usage when one is given, and where the help is; not argparse's whole usage block, which
    runs over several lines here."""

    def __init__(self, *args: Any, short_usage: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.short_usage = short_usage

    def error(self, message: str) -> NoReturn:
        usage = f"usage: {self.short_usage}; " if self.short_usage else ""
        self.exit(2, f"{self.prog}: error: {message} ({usage}see {self.prog} --help)\n")


class _RefuseToken(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *_: object, **__: object) -> None:
        parser.error(f"--token is refused: a token on the command line is visible in ps and "
                     f"shell history; set {TOKEN_VARIABLE} or use --token-file PATH")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=prog or "queuelog worker", allow_abbrev=False,
        description="Claim jobs from a queuelog server and run a Python handler on each. "
                    f"The worker key's token comes from {TOKEN_VARIABLE} or --token-file. "
                    "SIGTERM or SIGINT: stop claiming, let held jobs finish (a second "
                    "signal: now), exit 0.")
    parser.add_argument("--url", default=os.environ.get(URL_VARIABLE),
                        help=f"the server, e.g. http://127.0.0.1:8000 (default ${URL_VARIABLE})")
    parser.add_argument("--handler", required=True,
                        help="package.module:function, called with each job as a dict; "
                             "returns a dict (the result) or None")
    parser.add_argument("--types", help="comma-separated job types (default: any the key "
                                        "allows)")
    parser.add_argument("--concurrency", type=_positive_int, default=1,
                        help="jobs run at once, each in its own thread (default 1)")
    parser.add_argument("--token-file", help="read the token from this file instead of "
                                             f"${TOKEN_VARIABLE}")
    parser.add_argument("--token", nargs="?", action=_RefuseToken, help=argparse.SUPPRESS)
    parser.add_argument("--lease-seconds", type=_positive_int,
                        help="lease asked for each claim (default: the server's)")
    parser.add_argument("--wait-seconds", type=float, default=5.0,
                        help=f"long-poll wait of each claim, 0..{MAX_CLAIM_WAIT_SECONDS:g} "
                             "(default 5); a stop is noticed once the claim in flight "
                             f"returns; 0 polls, pausing up to {RECONNECT_BACKOFF_MAX_SECONDS:g} s "
                             "while there is no work")
    parser.add_argument("--grace-seconds", type=float, default=30.0,
                        help="on SIGTERM, how long held jobs may still run (default 30)")
    parser.add_argument("--instance",
                        help="this process's label, sent with its claims and heartbeats and "
                             "shown under the key by GET /workers and on each job's attempts "
                             f"(default ${INSTANCE_VARIABLE}, else host:pid)")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--version", action="version", version=f"queuelog-client {__version__}")
    return parser


def _read_token(path: str | None) -> str | None:
    if path is None:
        return os.environ.get(TOKEN_VARIABLE) or None
    with open(path, encoding="utf-8") as handle:
        return handle.read().strip() or None


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Run the worker until SIGTERM/SIGINT; the exit status (0 after a stop by signal)."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if not args.url:
        parser.error(f"--url is required (or set {URL_VARIABLE})")
    try:
        check_url(args.url)
    except ValueError as exc:
        parser.error(f"--url: {exc}")
    if not 0 <= args.wait_seconds <= MAX_CLAIM_WAIT_SECONDS:
        parser.error(f"--wait-seconds must be between 0 and {MAX_CLAIM_WAIT_SECONDS:g}")
    try:
        token = _read_token(args.token_file)
    except OSError as exc:
        parser.error(f"--token-file: {exc.strerror}: {args.token_file}")
    if not token:
        parser.error(f"no token: set {TOKEN_VARIABLE} or use --token-file PATH")

    logging.basicConfig(level=args.log_level, stream=sys.stderr, format=LOG_FORMAT)
    # Like `flask --app` and gunicorn: a handler module in the working directory imports.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        handler = load_handler(args.handler)
    except (ImportError, AttributeError, ValueError) as exc:
        parser.error(f"--handler {args.handler}: {exc}")

    types = [t.strip() for t in args.types.split(",") if t.strip()] if args.types else None
    try:
        instance = check_instance(args.instance if args.instance is not None
                                  else default_instance())
    except ValueError as exc:
        parser.error(f"--instance (or {INSTANCE_VARIABLE}): {exc}")
    worker = Worker(args.url, handler, token=token, types=types,
                    concurrency=args.concurrency, lease_seconds=args.lease_seconds,
                    wait_seconds=args.wait_seconds, grace_seconds=args.grace_seconds,
                    instance=instance)
    try:
        worker.run()
    except ProblemError:
        return 1  # the worker logged the refusal once already, as it stopped claiming
    return 0


MODULE_PROG = "python -m queuelog_client"


def module_main(argv: Sequence[str] | None = None, prog: str = MODULE_PROG) -> int:
    """`python -m queuelog_client`: its one command, `worker`, with --help and --version."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["worker"]:
        return main(args[1:], prog=f"{prog} worker")
    parser = OneLineParser(
        prog=prog, allow_abbrev=False,
        short_usage=f"{prog} worker --url URL --handler MODULE:FUNCTION [options]",
        description="The queuelog client's command line (the Python API is "
                    "queuelog_client.Client and queuelog_client.Worker).",
        epilog=f"Run '{prog} worker --help' for the worker runner's options. The worker key's "
               f"token comes from {TOKEN_VARIABLE} (or --token-file), the server from --url "
               f"or {URL_VARIABLE}.")
    parser.add_argument("--version", action="version", version=f"queuelog-client {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command")
    commands.add_parser("worker", add_help=False,
                        help="claim jobs from a queuelog server and run a Python handler on "
                             "each (the same runner as the server's `queuelog worker`)")
    parsed = parser.parse_args(args)  # help, version and mistakes exit here
    if parsed.command is None:
        parser.error("no command given")
    raise AssertionError("unreachable: worker is handled above")
