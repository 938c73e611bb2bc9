"""Where the database tells a served process of each change (PostgreSQL, unless
QUEUELOG_NOTIFY is off: docs/SCALING.md, "The database tells every host"): what listens, what
each notice wakes, and who says the process waits. Called where the app is served (wsgi.py)
and by `queuelog dispatch`, never by the factory: tests and operator commands listen to
nothing."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from flask import Flask
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from app.jobs.domain.claim_positions import ClaimPositions
from app.jobs.tx.uow import CLAIMABLE, FINISHED
from app.jobs.usecases.horizon_watch import HorizonWatch
from app.jobs.usecases.listening_lead import RETENTION_IDLE_SECONDS, ListeningLead
from app.jobs.usecases.waiters import WaiterEntry
from app.jobs.wake.database_wake import SCHEDULES, TYPES, DatabaseWakes
from app.storage.activity import HORIZON_HELD
from app.storage.engine import make_engine
from app.storage.listener import DatabaseListener

if TYPE_CHECKING:
    from app.dispatch.dispatcher import Dispatcher


def start_database_wakes(app: Flask) -> None:
    """On PostgreSQL (unless QUEUELOG_NOTIFY is off), let the database tell this process of
    every change its waiters, settings copy, ticker and maintenance act on, rather than have
    them peek (docs/SCALING.md, "The database tells every host"): one process per host
    listens, leads maintenance if the lead is free, and tells the host's others. Called where
    the app is served (wsgi.py), before the maintenance loop starts."""
    services = app.extensions["queuelog"]
    engine = services.db.engine
    lock_path = services.host.listener_lock_path
    if (engine.dialect.name != "postgresql" or not app.config["NOTIFY"]
            or lock_path is None or "queuelog_listener" in app.extensions):
        return
    every_kind = frozenset({CLAIMABLE, FINISHED, TYPES, SCHEDULES})
    # The horizon's notice is no change to catch up on: it is not among the kinds every
    # process is told after its host's listener (re)connects.
    wakes = DatabaseWakes(services.host, every_kind | {HORIZON_HELD})
    claims, finished = services.jobs.signal, services.jobs.finished
    entry = WaiterEntry(services.db, services.clock)
    claims.told_by_database(entry.before_claim_wait)
    finished.told_by_database(entry.before_read_wait)
    # Not a job's end: every claim waiting in the process would look again at each one. A
    # claim whose type's jobs an end may free (a cap, an ordered key) peeks instead.
    wakes.on([CLAIMABLE], claims.notify_here)
    wakes.on([FINISHED], finished.notify_here)
    services.type_settings.told_by_database()
    wakes.on([TYPES], services.type_settings.changed)
    # A snapshot holds the horizon: claims read from positions (docs/SCALING.md).
    positions = services.jobs.claim_positions
    wakes.on([HORIZON_HELD], positions.horizon_held)
    threading.Thread(target=look_at_the_horizon, args=(services.horizon, positions),
                     name="queuelog-horizon-look", daemon=True).start()
    # Retention's windows are type settings too: a pass starts on the leader's next round.
    wakes.on([TYPES], services.jobs.retention.windows_changed)
    ticker = app.extensions.get("queuelog_ticker")
    if ticker is not None:
        ticker.told_by_database()
        wakes.on([SCHEDULES], ticker.changed)
    services.host.keep_listening()
    services.jobs.retention.idle_seconds = RETENTION_IDLE_SECONDS
    maintenance = services.maintenance
    services.stats.samples_database = lambda: maintenance.leading
    lead = ListeningLead(services.clock, services.maintenance.woken_only())
    services.maintenance.leadership = lead
    app.extensions["queuelog_listener"] = DatabaseListener(
        _listening_engine(app, engine), lock_path, wakes.deliver,
        every_kind=every_kind, duty=lead).start()


def look_at_the_horizon(horizon: HorizonWatch, positions: ClaimPositions) -> None:
    """A process that starts (a worker gunicorn recycles, say) while a snapshot holds the
    horizon would read from the front until the leader's next notice, up to half a minute:
    it looks once itself, beside its first requests."""
    try:
        if horizon.held_long():
            positions.horizon_held()
    except SQLAlchemyError:
        pass  # the leader's next notice says it instead


def start_dispatch_wakes(app: Flask, dispatcher: Dispatcher) -> None:
    """On PostgreSQL (unless QUEUELOG_NOTIFY is off), `queuelog dispatch` (`dispatcher`)
    listens on a session of its own, apart from its host's served processes (it leads no
    maintenance), so that it claims a push job as soon as one is committed, and otherwise
    looks only every few seconds."""
    services = app.extensions["queuelog"]
    engine = services.db.engine
    if engine.dialect.name != "postgresql" or not app.config["NOTIFY"]:
        return
    def deliver(kinds: frozenset[str]) -> None:
        if CLAIMABLE in kinds:
            services.jobs.signal.notify_here()
        if TYPES in kinds:
            services.type_settings.changed()

    services.jobs.signal.told_by_database(
        WaiterEntry(services.db, services.clock).before_claim_wait)
    services.type_settings.told_by_database()
    dispatcher.told_by_database()
    app.extensions["queuelog_listener"] = DatabaseListener(
        _listening_engine(app, engine), None, deliver,
        every_kind=frozenset({CLAIMABLE, FINISHED, TYPES})).start()


def _listening_engine(app: Flask, engine: Engine) -> Engine:
    """Where the listening session connects: past a transaction pooler (PgBouncer), straight
    to the server (QUEUELOG_LISTEN_DATABASE_URL), since LISTEN and the lead's lock live as
    long as a session; else where the pool connects."""
    listen_url = app.config["LISTEN_DATABASE_URL"]
    if not listen_url:
        return engine
    return make_engine(listen_url, pooled=False, notify=app.config["NOTIFY"])
