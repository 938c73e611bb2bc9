"""The live pages' JSON twins (docs/DASHBOARD.md, "Live pages"): the overview, a type's
page, a job's page and the failures page each have one under /ui/live/, which the script
app/ui/static/live.js polls to keep the page's figures current without a reload. Each reads
what its page reads, from the same services and their cached snapshots, and never more (the
failures page's twin only the groups' rows, not their charts). Session-authenticated as the
pages are: without a live admin session a twin answers 401 (app/ui/pages.py), and the
script stops."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from flask import Flask, jsonify
from flask import request as flask_request
from werkzeug.exceptions import BadRequest
from werkzeug.wrappers import Response

from app.core.clock import to_rfc3339
from app.history.failure_schemas import represent_group
from app.types.schemas import represent_type
from app.ui import job_views as views
from app.ui import live_figures as live
from app.ui.failure_pages import FAILURE_GROUPS_SHOWN
from app.ui.forms import FormInvalid, failure_filters
from app.ui.pages import JSON_ENDPOINTS, bp, queue_services, signed_in

# How often the script asks, at most, while the page is shown and the twin answers.
POLL_SECONDS = 5


def _answer(shape: str, figures: dict[str, Any]) -> Response:
    now = queue_services().clock.now_us()
    return jsonify({"shape": shape, "figures": figures, "read_at": to_rfc3339(now)})


View = TypeVar("View", bound=Callable[..., Response])


def _json_route(rule: str) -> Callable[[View], View]:
    """A GET route of the blueprint that answers JSON: its refusals too (pages.py)."""
    def register(view: View) -> View:
        JSON_ENDPOINTS.add(f"{bp.name}.{view.__name__}")
        return bp.get(rule)(view)
    return register


@_json_route("/live/overview")
def live_overview() -> Response:
    types = [represent_type(view) for view in queue_services().types.list_types()]
    return _answer(live.overview_shape(types), live.overview_figures(types))


@_json_route("/live/types/<job_type>")
def live_type(job_type: str) -> Response:
    # An unknown type is a NotFound: answered 404 (as JSON, pages.py).
    shown = represent_type(queue_services().types.get_type(job_type))
    return _answer(live.type_shape(shown), live.type_figures(shown))


@_json_route("/live/jobs/<id:job_id>")
def live_job(job_id: int) -> Response:
    services, caller = queue_services(), signed_in()
    found = services.jobs.get_job(caller, job_id)
    extras = services.jobs.extras_of([found])
    shown = views.shown(found, controls=extras.controls)
    attempts = len(services.history.attempts(caller, job_id))
    cancel_request = views.cancel_request(shown, extras.controls.get(job_id))
    return _answer(live.job_shape(shown, attempts, cancel_request), live.job_figures(shown))


@_json_route("/live/failures")
def live_failures() -> Response:
    try:
        filters = failure_filters(flask_request.args)
    except FormInvalid as invalid:
        said = "; ".join(f"{name}: {' '.join(texts)}" for name, texts in invalid.messages.items())
        raise BadRequest(f"These filters cannot be used: {said}") from None
    groups = [represent_group(group) for group in queue_services().failures.groups(
        job_type=filters.get("type"), limit=FAILURE_GROUPS_SHOWN)]
    return _answer(live.failures_shape(groups), live.failures_figures(groups))


def init_live(app: Flask) -> None:
    live.init_shapes(app)
    app.jinja_env.globals["live_poll_seconds"] = POLL_SECONDS
