"""Running Alembic from the application: the scripts travel with the installed project.

Alembic is imported by the functions that use it, not with this module: every gunicorn
worker and every `queuelog` command imports the app, most never migrate, and Alembic is a
tenth of the app's import time."""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection

if TYPE_CHECKING:
    from alembic.config import Config


def _ini_path() -> Path:
    """alembic.ini of the checkout when running from one, else the installed copy."""
    checkout = Path(__file__).resolve().parents[2] / "alembic.ini"
    if checkout.is_file():
        return checkout
    for scheme_path in {sysconfig.get_path("data"), sysconfig.get_path("data", "posix_user")}:
        installed = Path(scheme_path) / "share" / "queuelog" / "alembic.ini"
        if installed.is_file():
            return installed
    raise FileNotFoundError("queuelog's alembic.ini is neither in a checkout nor installed")


def alembic_config(database_url: str, connection: Connection | None = None) -> Config:
    from alembic.config import Config

    config = Config(str(_ini_path()))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """Migrate to `revision`. A revision the scripts do not know raises CommandError before
    the database is opened (on SQLite, opening creates the file)."""
    from alembic import command
    from alembic.script import ScriptDirectory
    from alembic.script.revision import RevisionError
    from alembic.util import CommandError

    config = alembic_config(database_url)
    try:
        ScriptDirectory.from_config(config).get_revisions(revision)
    except RevisionError as exc:
        raise CommandError(str(exc)) from None
    command.upgrade(config, revision)


def head_revision() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def current_revision(connection: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection).get_current_revision()
