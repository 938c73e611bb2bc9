"""Where the dispatcher shows its push origins' figures (app/dispatch/adaptive.py): the
push_origins rows GET /types reads, and the queuelog_push_concurrency gauge. A thread of its
own writes them, so that no claim or delivery waits for the write, each origin's when its
figure changed, at most once every RECORD_SECONDS."""

from __future__ import annotations

import logging
import threading

from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from app.core.clock import Clock
from app.core.errors import ServiceUnavailable
from app.dispatch.adaptive import OriginLimits
from app.dispatch.metrics import DispatchMetrics
from app.storage.engine import Database
from app.types.origin_repository import OriginFigure, OriginRepository

log = logging.getLogger(__name__)

RECORD_SECONDS = 1.0


class FigureRecorder:
    def __init__(self, db: Database, clock: Clock, limits: OriginLimits,
                 metrics: DispatchMetrics) -> None:
        self.db = db
        self.clock = clock
        self.limits = limits
        self.metrics = metrics
        self._written: dict[str, OriginFigure] = {}
        self._failing = False

    def run(self, stopping: threading.Event) -> None:
        """Record every RECORD_SECONDS until `stopping`, then once more."""
        while not stopping.wait(RECORD_SECONDS):
            self.record()
        self.record()

    def record(self) -> None:
        """Write the figures that changed since they were last written."""
        changed = [figure for figure in self.limits.figures()
                   if self._written.get(figure.origin) != figure]
        if not changed:
            return
        for figure in changed:
            self.metrics.concurrency(figure.origin, figure.concurrency)
        now = self.clock.now_us()

        def save(conn: Connection) -> None:
            OriginRepository(conn).save(changed, now)

        try:
            self.db.run_write(save)
        except (SQLAlchemyError, ServiceUnavailable) as exc:
            # Written again next time: the figures stay changed until a write lands. Said
            # once per outage.
            if not self._failing:
                log.warning("dispatch: the push origins' figures were not written (%s); "
                            "trying again every %g s", type(exc).__name__, RECORD_SECONDS)
            self._failing = True
            return
        except Exception:
            log.exception("dispatch: writing the push origins' figures failed")
            return
        self._failing = False
        self._written.update((figure.origin, figure) for figure in changed)
