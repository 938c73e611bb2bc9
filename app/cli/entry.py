"""The `queuelog` command itself (a Flask CLI group over the app factory, so `flask --app app …`
works the same) and the commands that run processes: `queuelog serve` (gunicorn with the
shipped settings), `queuelog dispatch` (push delivery) and the worker runner `queuelog worker
…` (the client's package, shipped in this distribution).

A mistake on the command line, or with the database (a URL queuelog cannot use, a file that
is not there, a schema not migrated, a server that refuses), is one line on stderr, never a
traceback: the group's invoke below is the one place that turns them into messages (their
wording: app/storage/engine.py)."""

from __future__ import annotations

import os
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from flask import Flask, current_app
from flask.cli import FlaskGroup, ScriptInfo, with_appcontext
from sqlalchemy.exc import DBAPIError

from app.cli.operate import (
    app_services,
    backup,
    copy,
    db_group,
    keys_group,
    purge,
    require_migrated_database,
    schedules_group,
    types_group,
)
from app.config import ConfigError
from app.storage.engine import DatabaseSetupError, explain_database_error, shown_url

if TYPE_CHECKING:  # app imports this module while it is being built
    pass


class _UsageMistake(click.ClickException):
    """A mistake on a command line: one line, exit 2 (a usage error, as click's own)."""

    exit_code = 2


class _ServeMistake(_UsageMistake):
    """A mistake on `queuelog serve`'s command line."""


class _ServeCommand(click.Command):
    """`queuelog serve`, whose every usage mistake is one line (click's own would print the
    usage block first)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise _ServeMistake(f"queuelog serve: {exc.format_message()}") from None


def _serve_addresses(host: str | None, port: int | None, binds: tuple[str, ...]) -> list[str]:
    """Where gunicorn will listen: --bind, else --host/--port (what is not given taken from
    the configured address), else GUNICORN_CMD_ARGS's --bind, else QUEUELOG_BIND's."""
    from queuelog_gunicorn import arguments, binding

    if binds and (host is not None or port is not None):
        raise _ServeMistake("queuelog serve: give --bind, or --host and --port, not both")
    if binds:
        return list(binds)
    configured = arguments.binds_from_environment(os.environ) or binding.configured_binds()
    if host is None and port is None:
        return configured
    return [binding.address_of(host, port, configured)]


@click.command("serve", cls=_ServeCommand,
               context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("--database", "database_url", metavar="URL",
              help="the database to serve (sets QUEUELOG_DATABASE_URL); default: "
                   "QUEUELOG_DATABASE_URL, else queuelog.sqlite3 in the instance folder")
@click.option("--host", metavar="HOST",
              help="the address to listen on, e.g. 0.0.0.0 for every interface (default: "
                   "QUEUELOG_BIND's host, else 127.0.0.1)")
@click.option("--port", type=click.IntRange(1, 65_535), metavar="PORT",
              help="the port to listen on (default: QUEUELOG_BIND's port, else 8000)")
@click.option("-b", "--bind", "binds", multiple=True, metavar="HOST:PORT",
              help="listen on this address instead (repeatable; unix:PATH too); replaces "
                   "QUEUELOG_BIND")
@click.argument("gunicorn_args", nargs=-1, type=click.UNPROCESSED)
def serve(database_url: str | None, host: str | None, port: int | None,
          binds: tuple[str, ...], gunicorn_args: tuple[str, ...]) -> None:
    """Serve the API and dashboard with gunicorn and the shipped production settings.

    Listens on --host/--port (or --bind) when given, else where QUEUELOG_BIND says (default
    127.0.0.1:8000). Any other option goes to gunicorn (`queuelog serve --workers 2`; see
    gunicorn --help). The database must exist and be migrated: `queuelog db upgrade` first.
    """
    from queuelog_gunicorn import arguments, binding

    try:
        arguments.read_options(gunicorn_args)
    except arguments.ArgumentMistake as exc:
        raise _ServeMistake(
            f"queuelog serve: {exc}; its own options are --host, --port, --bind and "
            "--database (queuelog serve --help), the others gunicorn's (gunicorn --help)"
        ) from None
    addresses = _serve_addresses(host, port, binds)
    app = current_app
    if database_url is not None:
        os.environ["QUEUELOG_DATABASE_URL"] = database_url
        app = _create_app()
    url = app.config["DATABASE_URL"]
    # The workers inherit the database checked and shown here, never a default of their own
    # (from a checkout, gunicorn's working directory puts the checkout's app first, whose
    # default instance folder is not the installed one's).
    os.environ["QUEUELOG_DATABASE_URL"] = url
    try:
        require_migrated_database(url, app.extensions["queuelog"].db.engine)
    except DBAPIError as exc:
        raise click.ClickException(explain_database_error(exc, url) or str(exc)) from None
    unbindable = binding.first_unbindable(addresses)
    if unbindable is not None:
        address, reason = unbindable
        raise click.ClickException(
            f"cannot listen on {address}: {reason}; choose another address with --port PORT "
            "(or QUEUELOG_BIND=host:port, several comma-separated)")
    click.echo(f"queuelog: serving {shown_url(url)} on {', '.join(addresses)}", err=True)
    _say_configuration_warnings(app)
    # On gunicorn's command line, which it reads after its settings file and
    # GUNICORN_CMD_ARGS: the address said above is the one it listens on.
    bind_args = [arg for address in addresses for arg in ("--bind", address)]
    os.environ[binding.BIND_VARIABLE] = ",".join(addresses)
    # exec, not gunicorn in this process: the master must not hold the app's modules (see
    # queuelog_gunicorn/conf.py), and a container's stop signal must reach gunicorn itself.
    conf = Path(binding.__file__).with_name("conf.py")
    os.execv(sys.executable, [sys.executable, "-m", "gunicorn", "-c", str(conf),  # noqa: S606
                              *bind_args, *gunicorn_args, "app.wsgi:app"])


def _say_configuration_warnings(app: Flask) -> None:
    """What the service will refuse because of its settings, said once here rather than by
    each gunicorn worker as it loads the app (app/wsgi.py)."""
    from app.config import CONFIGURATION_WARNED, configuration_warnings

    for warning in configuration_warnings(app.config):
        click.echo(f"queuelog: warning: {warning}", err=True)
    os.environ[CONFIGURATION_WARNED] = "1"


# The worker runner talks to a server over HTTP and needs neither the app nor a database:
# its options are parsed by queuelog_client's own (standard-library) command line.
@click.command("worker", add_help_option=False,
               context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def worker(args: tuple[str, ...]) -> None:
    """Run jobs with a Python handler: queuelog worker --url URL --handler m:f (see --help)."""
    try:
        from queuelog_client.cli import main as worker_main
    except ModuleNotFoundError:
        # queuelog ships queuelog_client; it goes missing when a queuelog-client installed
        # over it (the same files) is uninstalled again.
        raise click.ClickException(
            "the worker runner (the queuelog_client package, shipped with queuelog) is not "
            "installed here: reinstall queuelog, or install the client (pip install ./client)"
        ) from None

    raise SystemExit(worker_main(list(args), prog="queuelog worker"))


@click.command("dispatch")
@click.option("--concurrency", type=click.IntRange(1, 256), default=None,
              help="deliveries at once (default: QUEUELOG_DISPATCH_CONCURRENCY, 16)")
@click.option("--metrics-port", type=click.IntRange(1, 65_535), default=None,
              help="serve this process's metrics on 127.0.0.1:PORT (when not run by the "
                   "container's gunicorn, whose /metrics shows them)")
@click.option("--only-if-enabled", is_flag=True, hidden=True,
              help="exit at once unless QUEUELOG_DISPATCH is on (the gunicorn hook)")
@with_appcontext
def dispatch(concurrency: int | None, metrics_port: int | None, only_if_enabled: bool) -> None:
    """Deliver the jobs of push types to their endpoints, until SIGTERM (then exit 0)."""
    import logging

    from app import start_stats_flusher
    from app.database_wakes import start_dispatch_wakes
    from app.dispatch.checks import CheckSettings
    from app.dispatch.dispatcher import Dispatcher
    from app.dispatch.metrics import DispatchMetrics

    config = current_app.config
    if only_if_enabled and not config["DISPATCH"]:
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    metrics = DispatchMetrics.from_environment()
    if metrics_port is not None:
        metrics.serve(metrics_port, "127.0.0.1")
    services = app_services()
    services.type_settings.start()
    dispatcher = Dispatcher(services.jobs, services.types,
                            concurrency=concurrency or config["DISPATCH_CONCURRENCY"],
                            grace_seconds=config["DISPATCH_GRACE_SECONDS"], metrics=metrics,
                            clock=services.clock,
                            checks=CheckSettings(config["CHECK_CONCURRENCY"],
                                                 config["CHECK_ORIGIN_CONCURRENCY"],
                                                 config["CHECK_TIMEOUT_SECONDS"]))
    dispatcher.install_signal_handlers()
    start_dispatch_wakes(current_app, dispatcher)
    # Its claims, completes and fails count in the stats like a worker's requests.
    start_stats_flusher(current_app)
    try:
        dispatcher.run()
    finally:
        services.stats_flusher.stop()


def register_commands(app: Flask) -> None:
    app.cli.add_command(serve)
    app.cli.add_command(db_group)
    app.cli.add_command(keys_group)
    app.cli.add_command(types_group)
    app.cli.add_command(schedules_group)
    app.cli.add_command(purge)
    app.cli.add_command(copy)
    app.cli.add_command(backup)
    app.cli.add_command(dispatch)
    app.cli.add_command(worker)


def _create_app() -> Flask:
    from app import create_app

    return create_app()


def queuelog_version() -> str:
    """The installed distribution's version (what `pip install .` recorded)."""
    try:
        return metadata.version("queuelog")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


# FlaskGroup gives every group --app, --debug and --env-file; queuelog has one app, is served
# by gunicorn (never Flask's development server) and reads no dotenv files.
_FLASK_OPTIONS = frozenset({"app", "debug", "env_file"})


class _QueuelogGroup(FlaskGroup):
    """FlaskGroup whose commands' database and settings mistakes are one line (click's
    "Error: …" on stderr, exit 1), not a traceback. The app is built inside invoke (when a
    command is looked up), so a URL it cannot use, or a QUEUELOG_ variable it cannot read
    (ConfigError names it), is caught here too."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            # click's own would print the usage block before the mistake: one line instead,
            # naming the command and where its usage is.
            where = exc.ctx.command_path if exc.ctx is not None else "queuelog"
            raise _UsageMistake(f"{where}: {exc.format_message()} (see {where} --help)"
                                ) from None
        except (DatabaseSetupError, ConfigError) as exc:
            raise click.ClickException(str(exc)) from None
        except DBAPIError as exc:
            url = ctx.ensure_object(ScriptInfo).load_app().config["DATABASE_URL"]
            raise click.ClickException(explain_database_error(exc, url) or str(exc)) from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        # `queuelog --help` builds the app to list its commands; Flask prints the traceback of
        # an app that cannot be built. A database URL queuelog cannot use is one line instead,
        # and the help lists what needs no app (the worker).
        try:
            ctx.ensure_object(ScriptInfo).load_app()
        except (DatabaseSetupError, ConfigError) as exc:
            click.echo(f"Error: {exc}", err=True)
            return sorted(click.Group.list_commands(self, ctx))
        return super().list_commands(ctx)


def build_cli() -> click.Group:
    """The `queuelog` command: queuelog's commands and version, none of Flask's own."""
    cli = _QueuelogGroup(create_app=_create_app, add_default_commands=False,
                     add_version_option=False, load_dotenv=False, set_debug_flag=False,
                     help="queuelog: operate the job queue (serve it with `queuelog serve`).")
    cli.params = [param for param in cli.params if param.name not in _FLASK_OPTIONS]
    click.version_option(queuelog_version(), "--version", prog_name="queuelog",
                         message="%(prog)s %(version)s")(cli)
    # On the group itself, so `queuelog worker` never builds the app (no database needed).
    cli.add_command(worker)
    return cli


def main() -> None:
    build_cli().main(prog_name="queuelog")
