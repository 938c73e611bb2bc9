"""The dashboard's blueprint and what every page of it shares: the signed-in admin (a page
without one goes to the sign-in), the page context (navigation, auto-refresh), the error
pages, and the form action's answer (a message on the next page). The pages themselves are in
app/ui/routes.py, the search in app/ui/search.py, the live pages' JSON twins in app/ui/live.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from flask import (
    Blueprint,
    current_app,
    flash,
    g,
    jsonify,
    redirect,
    render_template,
    request,
    url_for,
)
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound
from werkzeug.wrappers import Response

from app.core.callers import Caller
from app.core.errors import QueueError
from app.ui import session as ui_session
from app.ui.security import CSRFRefused, check_csrf
from app.web.problems import problem_type_of

bp = Blueprint("ui", __name__, url_prefix="/ui", template_folder="templates",
               static_folder="static")

# The navigation, in order: (endpoint, label). A section is one entry here, its route and
# its template.
SECTIONS = (("ui.overview", "Overview"), ("ui.jobs", "Jobs"), ("ui.failures", "Failures"),
            ("ui.workflows", "Workflows"), ("ui.types", "Types"), ("ui.schedules", "Schedules"))
_OPEN = frozenset({"ui.sign_in", "ui.static"})
# How often a page asked to refresh itself (?refresh=on) reloads, by a <meta> refresh: no
# script, so the CSP stays as it is.
REFRESH_SECONDS = 10
# The routes that answer JSON (the live pages' twins, app/ui/live.py): their refusals are JSON
# too, and without a session a 401 (the script stops), not the sign-in page.
JSON_ENDPOINTS: set[str] = set()


@bp.before_request
def _require_session() -> Response | None:
    check_csrf()
    if request.endpoint in _OPEN:
        return None
    caller = ui_session.signed_in_caller()
    if caller is None:
        if request.endpoint in JSON_ENDPOINTS:
            return _json_error(401, "Signed out", "No dashboard session (signed out, expired, "
                                                  "or its key revoked): sign in again.")
        return redirect(url_for("ui.sign_in"))
    g.caller = caller
    return None


def _json_error(status: int, title: str, detail: str | None) -> Response:
    answer = jsonify({"title": title, "detail": detail, "sign_in": url_for("ui.sign_in")})
    answer.status_code = status
    return answer


@bp.context_processor
def _page_context() -> dict[str, Any]:
    return {"sections": SECTIONS, "signed_in": g.get("caller"), "this_page": this_page,
            "refresh_seconds": REFRESH_SECONDS}


def this_page(**changed: str | None) -> str:
    """This page's address with its query string as it came but for `changed` (a None
    removes the parameter): the auto-refresh and period links keep every filter."""
    args = request.args.to_dict(flat=False)
    for name, value in changed.items():
        if value is None:
            args.pop(name, None)
        else:
            args[name] = [value]
    # Encoded here, not by url_for: a parameter named like one of its own (`_external`,
    # `_scheme`) is only text to keep.
    path = url_for(request.endpoint or "ui.overview", **(request.view_args or {}))
    return f"{path}?{urlencode(args, doseq=True)}" if args else path


def queue_services() -> Any:
    return current_app.extensions["queuelog"]


def signed_in() -> Caller:
    caller: Caller = g.caller
    return caller


def render_page(template: str, status: int = 200, **context: Any) -> tuple[str, int]:
    return render_template(f"ui/{template}", **context), status


def _error_page(status: int, title: str, detail: str | None) -> Response | tuple[str, int]:
    if request.endpoint in JSON_ENDPOINTS:
        return _json_error(status, title, detail)
    return render_page("error.html", status, title=title, detail=detail)


@bp.errorhandler(CSRFRefused)
def _csrf_refused(error: CSRFRefused) -> Response | tuple[str, int]:
    return _error_page(400, "Form refused",
                       "The form came without a valid CSRF token (or from another site). "
                       "Reload the page and send it again.")


@bp.errorhandler(QueueError)
def _problem(error: QueueError) -> Response | tuple[str, int]:
    kind = problem_type_of(error)
    return _error_page(kind.status, kind.title, error.detail)


@bp.errorhandler(HTTPException)
def _http_error(error: HTTPException) -> Response | tuple[str, int]:
    return _error_page(error.code or 500, error.name, error.description)


@bp.before_app_request
def _dashboard_routing_error() -> Response | None:
    """A path under /ui/ that no page has (or an id that is no id: /ui/jobs/abc), or a page
    asked with a method it does not take, is the dashboard's own error page, not the JSON
    API's problem: a routing failure never reaches the blueprint's handlers, as no route of
    it matched."""
    error = request.routing_exception
    if (not isinstance(error, (NotFound, MethodNotAllowed))
            or not ui_session.is_dashboard(request.path)):
        return None
    # Nor do the blueprint's session check and page context run: the page asks itself, so
    # that a signed-in admin still has the navigation.
    g.caller = ui_session.signed_in_caller()
    page = render_template("ui/error.html", **_page_context(), title=error.name,
                           detail=error.description)
    return Response(page, error.code, headers=error.get_headers())


def act(action: Callable[[], Any], done: str | Callable[[Any], str], then: str) -> Response:
    """Run a form's action; its refusal (a 404, a 409) becomes a message on the next page.
    `done` is the message of its success, or makes it from what the action returned."""
    try:
        answer = action()
    except QueueError as refused:
        flash(refused.detail, "error")
    else:
        flash(done if isinstance(done, str) else done(answer), "ok")
    return redirect(then)
