"""The commands that act on the database: `queuelog db …`, `queuelog keys …`, `queuelog types
…`, `queuelog schedules …`, `queuelog purge`, `queuelog copy`, `queuelog backup`. Each runs
in the app's context (AppGroup, with_appcontext); app/cli/entry.py registers them."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from flask import current_app
from flask.cli import AppGroup, with_appcontext
from sqlalchemy import Engine

from app.core.callers import Role
from app.core.errors import NotFound, QueueError
from app.core.limits import BATCH_ROWS, RATE, TYPE_LIMIT
from app.core.priorities import Priority
from app.core.redaction import display_url
from app.core.statuses import TERMINAL_STATUSES
from app.keys.service import KeyCommandError
from app.storage.engine import shown_url, sqlite_path

if TYPE_CHECKING:  # app imports this module while it is being built
    from app import Services

_DURATION = re.compile(r"^(\d+)([smhdw])\Z")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
# Idempotency keys are recognised as long as their job is stored; a purge shorter than a
# day would make a producer's retry of yesterday's request create a second job.
MIN_PURGE_AGE_SECONDS = 86_400


def parse_duration(text: str) -> int:
    match = _DURATION.match(text.strip())
    if not match:
        raise click.BadParameter("use <n>[smhdw], for example 30d or 12h")
    return int(match[1]) * _UNIT_SECONDS[match[2]]


def app_services() -> Services:
    """The app's services, once the database is known to be there and migrated (checked once
    per process): a command never runs its statements, or prints a table's header, against a
    database it cannot use."""
    services: Services = current_app.extensions["queuelog"]
    if not current_app.extensions.get("queuelog_cli_database_checked"):
        require_migrated_database(current_app.config["DATABASE_URL"], services.db.engine)
        current_app.extensions["queuelog_cli_database_checked"] = True
    return services


def require_migrated_database(url: str, engine: Engine) -> None:
    """Refuse, in one line, a SQLite file that is not there (a mistyped path would otherwise
    be created empty by the first connection) and a database whose schema is not this
    queuelog's. Only `db upgrade` creates and migrates."""
    from app.storage.migrations import current_revision, head_revision

    path = sqlite_path(url)
    if path is not None and not os.path.isfile(path):
        raise click.ClickException(
            f"no SQLite database at {path}: create it there with `queuelog db upgrade`, or "
            "name the one you meant in QUEUELOG_DATABASE_URL")
    with engine.connect() as connection:
        current = current_revision(connection)
    head = head_revision()
    if current == head:
        return
    if current is None:
        raise click.ClickException(
            f"the database {shown_url(url)} has no queuelog tables: run `queuelog db upgrade` "
            "first")
    raise click.ClickException(
        f"the database {shown_url(url)} is at schema revision {current}, this queuelog's is "
        f"{head}: run `queuelog db upgrade` (or use the release that migrated it)")


# AppGroup (and with_appcontext on purge): the commands use current_app, and only the
# `queuelog`/`flask` entry point pushes an app context on its own; app.cli (the test
# runner, or any other caller) does not.
db_group = AppGroup("db", help="Manage the database schema.")


@db_group.command("upgrade")
@click.argument("revision", default="head")
def db_upgrade(revision: str) -> None:
    """Apply Alembic migrations to QUEUELOG_DATABASE_URL (default: to the newest)."""
    from alembic.util import CommandError

    from app.storage.migrations import upgrade

    url = current_app.config["DATABASE_URL"]
    path = sqlite_path(url)
    if path is not None and not os.path.isdir(os.path.dirname(path)):
        raise click.ClickException(
            f"cannot create the SQLite database {path}: its directory does not exist; create "
            "it, or name another file in QUEUELOG_DATABASE_URL")
    try:
        upgrade(url, revision)
    except CommandError as exc:  # an unknown revision, chiefly
        raise click.ClickException(
            f"cannot upgrade to {revision!r}: {exc}; give `head` (the default) or a revision "
            "id from alembic/versions") from None
    click.echo(f"database at {revision}")


keys_group = AppGroup("keys", help="Create, list and revoke API keys; set a producer key's "
                                     "check url and check secret.")


def _key_call(call: Callable[[], Any]) -> Any:
    """Run a key command; its refusal (a KeyCommandError, or a check url's ValidationFailed)
    as one line."""
    try:
        return call()
    except KeyCommandError as exc:
        raise click.ClickException(str(exc)) from None
    except QueueError as problem:
        raise click.ClickException(problem.detail) from None


def _sign_hint(name: str) -> str:
    return (f"its checks are signed once `queuelog keys check-secret {name}` makes a check "
            "secret")


@keys_group.command("create")
@click.argument("name")
@click.option("--role", required=True, type=click.Choice([r.value for r in Role]))
@click.option("--max-priority", type=click.Choice([p.label for p in Priority],
                                                  case_sensitive=False),
              help="highest priority a producer may enqueue at (default medium)")
@click.option("--types", help="comma-separated job types this key is limited to")
@click.option("--check-url", metavar="URL",
              help="a producer's: asked about its reservations left unanswered; must start "
                   "with one of QUEUELOG_CHECK_URL_ORIGINS")
def keys_create(name: str, role: str, max_priority: str | None, types: str | None,
                check_url: str | None) -> None:
    """Create a key; its token is printed once, alone on the last line."""
    token = _key_call(lambda: app_services().keys.create_key(
        name, Role(role),
        max_priority=Priority.from_label(max_priority) if max_priority else None,
        job_types=types.split(",") if types else None,
        known_types=current_app.config["JOB_TYPES"],
        check_url=check_url,
    ))
    if check_url is not None:
        click.echo(f"check url set: {display_url(check_url)}; {_sign_hint(name)}")
    click.echo(f"created {role} key {name!r}; its token is shown once, store it now:")
    click.echo(token)


@keys_group.command("list")
def keys_list() -> None:
    """List keys (never their tokens). max_priority is a producer's ceiling: "-" for others.
    check_url, a producer's, in its display form (no credentials, no query values)."""
    keys = app_services().keys.list_keys()
    click.echo(f"{'name':<24} {'role':<9} {'max_priority':<13} {'types':<24} {'status':<8} "
               "check_url")
    for key in keys:
        status = "revoked" if key.revoked_at is not None else "live"
        ceiling = (Priority(key.max_priority).label if key.role == Role.PRODUCER.value
                   else "-")
        check = display_url(key.check_url) if key.check_url else ""
        click.echo(f"{key.name:<24} {key.role:<9} {ceiling:<13} "
                   f"{key.job_types or '*':<24} {status:<8} {check}".rstrip())


@keys_group.command("revoke")
@click.argument("name")
def keys_revoke(name: str) -> None:
    """Revoke a key; the next request with it is refused."""
    _key_call(lambda: app_services().keys.revoke_key(name))
    click.echo(f"revoked {name!r}")


@keys_group.command("set-check-url")
@click.argument("name")
@click.argument("url", required=False)
@click.option("--clear", is_flag=True, help="remove the key's check url")
def keys_set_check_url(name: str, url: str | None, clear: bool) -> None:
    """Set producer key NAME's check url to URL, or --clear it. Reservations made from now
    on take it; those made before keep theirs."""
    if clear == (url is not None):
        raise click.ClickException("give the check url, or --clear to remove it (not both)")
    key = _key_call(lambda: app_services().keys.set_check_url(name, url))
    if url is None:
        click.echo(f"check url of {name!r} cleared: its reservations from now on without a "
                   "check url of their own are released at their deadline if left unanswered")
        return
    hint = "" if key.check_secret else f"; {_sign_hint(name)}"
    click.echo(f"check url of {name!r} set: {display_url(url)}{hint}")


@keys_group.command("check-secret")
@click.argument("name")
def keys_check_secret(name: str) -> None:
    """Give producer key NAME a new check secret, printed once, alone on the last line; the
    one before stops signing its checks at once."""
    secret = _key_call(lambda: app_services().keys.rotate_check_secret(name))
    click.echo(f"new check secret of {name!r} (the one before no longer signs its checks); "
               "it is shown once, store it now:")
    click.echo(secret)


types_group = AppGroup("types", help="Read and change job types' flow control.")


def _limit_text(value: object) -> str:
    return "-" if value is None else str(value)


def _burst_text(settings: Any) -> str:
    # The bucket exists only with a rate: without one, a burst would be a number that limits
    # nothing.
    return "-" if settings.rate_per_second is None else str(settings.effective_burst)


@types_group.command("list")
def types_list() -> None:
    """Each configured type: paused, limits, counts (pending, running and the finished ones),
    oldest claimable age, last claim."""
    from app.core.clock import to_rfc3339

    views = app_services().types.list_types()
    click.echo(f"{'type':<20} {'paused':<7} {'max_run':<8} {'per_key':<8} {'rate/s':<9} "
               f"{'burst':<6} {'pending':>8} {'running':>8} {'completed':>10} {'failed':>8} "
               f"{'cancelled':>10} {'oldest_s':>9}  last_claim_at")
    for view in views:
        s, c = view.settings, view.counts
        oldest = ("-" if view.oldest_claimable_age_seconds is None
                  else f"{view.oldest_claimable_age_seconds:.1f}")
        click.echo(f"{s.type:<20} {'yes' if s.paused else 'no':<7} "
                   f"{_limit_text(s.max_running):<8} {_limit_text(s.max_running_per_key):<8} "
                   f"{_limit_text(s.rate_per_second):<9} {_burst_text(s):<6} "
                   f"{c.pending:>8} {c.running:>8} {c.completed:>10} {c.failed:>8} "
                   f"{c.cancelled:>10} {oldest:>9}  {to_rfc3339(s.last_claim_at) or '-'}")


# The API's bounds (TypePatchSchema's), so the CLI and PATCH /types refuse the same values.
_LIMIT = click.IntRange(TYPE_LIMIT.min, TYPE_LIMIT.max)


@types_group.command("set")
@click.argument("job_type")
@click.option("--paused/--resume", default=None, help="stop or resume claims of the type")
@click.option("--max-running", type=_LIMIT, help="running jobs of the type at most")
@click.option("--max-running-per-key", type=_LIMIT,
              help="running jobs per concurrency_key at most")
@click.option("--rate", type=click.FloatRange(RATE.min, RATE.max),
              help="claims per second (token bucket)")
@click.option("--burst", type=_LIMIT, help="tokens the bucket holds at most")
@click.option("--clear-max-running", is_flag=True, help="remove the running cap")
@click.option("--clear-max-running-per-key", is_flag=True, help="remove the per-key cap")
@click.option("--clear-rate", is_flag=True, help="remove the rate")
@click.option("--clear-burst", is_flag=True, help="burst back to ceil(rate)")
@click.option("--fairness", type=click.Choice(["key", "off"]),
              help="key: claims take turns across concurrency keys")
@click.option("--ordering", type=click.Choice(["key", "off"]),
              help="key: one job per concurrency key at a time, in enqueue order")
@click.option("--on-failure", type=click.Choice(["skip", "block"]),
              help="an ordered key whose job failed: run its next job, or block the key")
@click.option("--key-scope", type=click.Choice(["producer", "shared"]),
              help="whose are the fair and ordered keys: each producer's own, or one key "
                   "for every producer (see docs/FLOW-CONTROL.md for the risk)")
def types_set(job_type: str, paused: bool | None, max_running: int | None,
              max_running_per_key: int | None, rate: float | None, burst: int | None,
              clear_max_running: bool, clear_max_running_per_key: bool, clear_rate: bool,
              clear_burst: bool, fairness: str | None, ordering: str | None,
              on_failure: str | None, key_scope: str | None) -> None:
    """Change a type's settings (the others stay); the next claim applies them."""
    patch: dict[str, object] = {}
    for name, mode in (("fairness", fairness), ("ordering", ordering)):
        if mode is not None:
            patch[name] = None if mode == "off" else mode
    if on_failure is not None:
        patch["on_failure"] = on_failure
    if key_scope is not None:
        patch["key_scope"] = key_scope
    for name, value, clear in (("max_running", max_running, clear_max_running),
                               ("max_running_per_key", max_running_per_key,
                                clear_max_running_per_key),
                               ("rate_per_second", rate, clear_rate),
                               ("burst", burst, clear_burst)):
        if value is not None and clear:
            raise click.UsageError(f"give a value for {name} or clear it, not both")
        if value is not None or clear:
            patch[name] = value
    if paused is not None:
        patch["paused"] = paused
    if not patch:
        raise click.UsageError("nothing to change; see --help")
    try:
        view = app_services().types.update_type(job_type, patch)
    except NotFound:
        raise click.ClickException(
            f"{job_type!r} is not a configured job type (QUEUELOG_JOB_TYPES)") from None
    s = view.settings
    click.echo(f"{s.type}: paused={'yes' if s.paused else 'no'} "
               f"max_running={_limit_text(s.max_running)} "
               f"max_running_per_key={_limit_text(s.max_running_per_key)} "
               f"rate_per_second={_limit_text(s.rate_per_second)} burst={_burst_text(s)} "
               f"fairness={s.fairness or 'off'} ordering={s.ordering or 'off'} "
               f"on_failure={s.on_failure or 'skip'} key_scope={s.key_scope or 'producer'}")


schedules_group = AppGroup("schedules", help="List, create, pause, resume and delete "
                                             "schedules.")


def _echo_schedules(schedules: Any) -> None:
    """The schedules as a table, its header first (one row or many)."""
    from app.core.clock import to_rfc3339

    click.echo(f"{'name':<24} {'cron':<16} {'timezone':<18} {'catch_up':<7} {'paused':<7} "
               f"{'next_run_at':<27}  last_run_at")
    for schedule in schedules:
        click.echo(f"{schedule.name:<24} {schedule.cron:<16} {schedule.timezone:<18} "
                   f"{schedule.catch_up:<7} {'yes' if schedule.paused else 'no':<7} "
                   f"{to_rfc3339(schedule.next_run_at)}  "
                   f"{to_rfc3339(schedule.last_run_at) or '-'}")


def _schedule_call(call: Callable[[], Any]) -> Any:
    """Run a schedule use case; its problem (422 naming the field, 404, 409) as a message."""
    try:
        return call()
    except QueueError as problem:
        fields = "; ".join(f"{field}: {' '.join(map(str, messages))}"
                           for field, messages in (problem.errors or {}).items())
        raise click.ClickException(fields or problem.detail) from None


@schedules_group.command("list")
def schedules_list() -> None:
    """Every schedule: expression, zone, catch-up, paused, next and last slot."""
    _echo_schedules(app_services().schedules.every_schedule())


@schedules_group.command("create")
@click.argument("name")
@click.argument("cron")
@click.option("--type", "job_type", help="the job type each slot enqueues")
@click.option("--payload", default=None, help="the job's payload, a JSON object")
@click.option("--job", "job_json", default=None,
              help="the whole job template as JSON (any POST /jobs field but run_at, "
                   "delay_seconds and idempotency_key), instead of --type/--payload")
@click.option("--timezone", default="UTC", show_default=True, help="an IANA zone name")
@click.option("--catch-up", type=click.Choice(["latest", "none", "all"]), default="latest",
              show_default=True, help="what missed slots do after downtime")
@click.option("--paused", is_flag=True, help="create it paused")
def schedules_create(name: str, cron: str, job_type: str | None, payload: str | None,
                     job_json: str | None, timezone: str, catch_up: str, paused: bool) -> None:
    """Create schedule NAME firing on CRON (five fields or @hourly … @yearly)."""
    from marshmallow import ValidationError

    from app.schedules.schemas import ScheduleCreateSchema

    if (job_json is None) == (job_type is None):
        raise click.UsageError("give --type (with --payload) or --job")
    try:
        job = (json.loads(job_json) if job_json is not None
               else {"type": job_type, "payload": json.loads(payload or "{}")})
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}") from None
    body = {"name": name, "cron": cron, "timezone": timezone, "job": job,
            "catch_up": catch_up, "paused": paused}
    try:
        loaded = ScheduleCreateSchema().load(body)
    except ValidationError as exc:
        raise click.ClickException(f"invalid: {exc.messages}") from None
    schedule = _schedule_call(lambda: app_services().schedules.create_schedule(loaded))
    _echo_schedules([schedule])


def _set_paused(name: str, paused: bool) -> None:
    schedule = _schedule_call(
        lambda: app_services().schedules.update_schedule(name, {"paused": paused}))
    _echo_schedules([schedule])


@schedules_group.command("pause")
@click.argument("name")
def schedules_pause(name: str) -> None:
    """Pause a schedule: its slots are skipped until it is resumed."""
    _set_paused(name, True)


@schedules_group.command("resume")
@click.argument("name")
def schedules_resume(name: str) -> None:
    """Resume a schedule at its next slot (the skipped ones are not made up)."""
    _set_paused(name, False)


@schedules_group.command("delete")
@click.argument("name")
def schedules_delete(name: str) -> None:
    """Delete a schedule; the jobs it enqueued stay."""
    _schedule_call(lambda: app_services().schedules.delete_schedule(name))
    click.echo(f"deleted {name!r}")


@click.command("purge")
@click.option("--older-than", "older_than", required=True,
              help="age since the last change, <n>[smhdw], e.g. 30d")
@click.option("--status", "statuses", multiple=True,
              type=click.Choice(sorted(s.value for s in TERMINAL_STATUSES)),
              help="only these statuses (repeatable); default: every finished status")
@click.option("--force", is_flag=True, help="allow --older-than below 24 hours")
@click.option("--batch-size", type=click.IntRange(BATCH_ROWS.min, BATCH_ROWS.max),
              help="jobs deleted per transaction; default: QUEUELOG_BULK_BATCH_SIZE")
@with_appcontext
def purge(older_than: str, statuses: tuple[str, ...], force: bool,
          batch_size: int | None) -> None:
    """Delete finished jobs, in batches; pending and running jobs are never touched."""
    seconds = parse_duration(older_than)
    if seconds < MIN_PURGE_AGE_SECONDS and not force:
        raise click.ClickException(
            "--older-than below 24h forgets idempotency keys producers may still retry; "
            "add --force if that is what you want")
    deleted = app_services().jobs.purge(older_than_seconds=seconds, statuses=statuses or None,
                                     batch_size=batch_size)
    click.echo(f"purged {deleted} jobs")


@click.command("copy")
@click.option("--from", "source_url", required=True, help="SQLAlchemy URL to copy from")
@click.option("--to", "target_url", required=True,
              help="SQLAlchemy URL to copy into (migrated here; must hold no jobs or keys)")
@click.option("--batch-size", default=BATCH_ROWS.default, show_default=True,
              type=click.IntRange(BATCH_ROWS.min, BATCH_ROWS.max))
def copy(source_url: str, target_url: str, batch_size: int) -> None:
    """Copy every job and key to another database, ids kept (stop the service first)."""
    from app.storage.transfer import TransferError, copy_database

    try:
        copied = copy_database(source_url, target_url, batch_size=batch_size)
    except TransferError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"copied {copied['api_keys']} keys and {copied['jobs']} jobs")


@click.command("backup")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="replace PATH if it exists")
@with_appcontext
def backup(path: Path, force: bool) -> None:
    """Write a consistent copy of the SQLite database to PATH, while the service runs."""
    from app.ops.backup import BackupError, backup_sqlite

    try:
        jobs = backup_sqlite(app_services().db.engine, path, overwrite=force)
    except BackupError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"backed up {jobs} jobs to {path}")
