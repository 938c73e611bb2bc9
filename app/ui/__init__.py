"""The dashboard (docs/DASHBOARD.md): server-rendered pages for admins under /ui/."""

from __future__ import annotations

from flask import Flask

from app.ui.present import register_filters
from app.ui.security import init_security
from app.ui.session import DashboardSessionInterface


def init_ui(app: Flask) -> None:
    app.session_interface = DashboardSessionInterface()
    init_security(app)
    register_filters(app)
    from app.ui import (  # noqa: F401  (their pages register on the blueprint)
        failure_pages,
        live,
        routes,
        search,
    )
    from app.ui.forms import SEARCH_CHARS
    from app.ui.pages import bp

    app.jinja_env.globals["search_chars"] = SEARCH_CHARS
    live.init_live(app)
    app.register_blueprint(bp)
