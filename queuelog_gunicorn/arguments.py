"""gunicorn's options as `queuelog serve` passes them on, read by gunicorn's own parser before
gunicorn starts: a mistake among them (an option gunicorn does not have, a value it cannot
read, a stray argument) is then one line from `queuelog serve`, said before it claims to be
serving anything, not gunicorn's usage block after it did.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Mapping, Sequence
from typing import NoReturn

from gunicorn.config import Config  # type: ignore[import-untyped]

# gunicorn reads these options from the environment too, before its command line.
CMD_ARGS_VARIABLE = "GUNICORN_CMD_ARGS"
_APP = "app.wsgi:app"


class ArgumentMistake(ValueError):
    """An argument gunicorn would refuse; its message says which and why."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ArgumentMistake(message)


def read_options(args: Sequence[str]) -> argparse.Namespace:
    """gunicorn's options among `args`, as gunicorn will read them; ArgumentMistake for one
    it would refuse, or for an argument that is no option (gunicorn would take it for the
    application to serve)."""
    parser = _Parser(prog="gunicorn", add_help=False)
    parser.add_argument("args", nargs="*")
    for setting in Config().settings.values():
        setting.add_option(parser)
    options = parser.parse_args([_APP, *args])
    stray = [arg for arg in options.args if arg != _APP]
    if stray:
        raise ArgumentMistake(f"unexpected argument{'s' if len(stray) > 1 else ''}: "
                              f"{' '.join(stray)} (only options are taken)")
    return options


def binds_from_environment(environ: Mapping[str, str]) -> list[str]:
    """The addresses GUNICORN_CMD_ARGS names with -b/--bind (empty when none): gunicorn takes
    them over its settings file's."""
    raw = environ.get(CMD_ARGS_VARIABLE, "")
    if not raw.strip():
        return []
    try:
        options = read_options(shlex.split(raw))
    except (ArgumentMistake, ValueError):
        return []  # gunicorn itself says what is wrong with it
    return list(options.bind or [])
