"""Thin handlers of the dashboard's pages: read the session's admin, call the services the
JSON API calls, render a template (or redirect after a form)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, flash, g, redirect, render_template, request, url_for
from flask_wtf.csrf import CSRFError
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response

from app.errors import Problem
from app.history.schemas import (
    represent_attempt,
    represent_event,
    represent_explanation,
    represent_worker,
)
from app.jobs.models import Job
from app.jobs.schemas import represent
from app.keys.models import Caller, Role
from app.schedules.schemas import represent_schedule
from app.types.schemas import represent_type
from app.ui import session as ui_session
from app.ui.forms import FormInvalid, job_filters, limits_patch
from app.ui.security import csrf

bp = Blueprint("ui", __name__, url_prefix="/ui", template_folder="templates",
               static_folder="static")

# The navigation, in order: (endpoint, label). A section is one entry here, its route and
# its template.
SECTIONS = (("ui.overview", "Overview"), ("ui.jobs", "Jobs"), ("ui.types", "Types"),
            ("ui.schedules", "Schedules"))
JOBS_PER_PAGE = 50
SCHEDULES_PER_PAGE = JOBS_PER_PAGE
_OPEN = frozenset({"ui.sign_in", "ui.static"})


@bp.before_request
def _require_session() -> Response | None:
    # Flask-WTF checks only the dashboard's forms: the JSON API's bearer keys are no
    # ambient credential a forged cross-site request could use.
    csrf.protect()
    if request.endpoint in _OPEN:
        return None
    caller = ui_session.signed_in_caller()
    if caller is None:
        return redirect(url_for("ui.sign_in"))
    g.caller = caller
    return None


@bp.context_processor
def _page_context() -> dict[str, Any]:
    return {"sections": SECTIONS, "signed_in": g.get("caller")}


def _services() -> Any:
    return current_app.extensions["queuelog"]


def _caller() -> Caller:
    caller: Caller = g.caller
    return caller


def _page(template: str, status: int = 200, **context: Any) -> tuple[str, int]:
    return render_template(f"ui/{template}", **context), status


@bp.errorhandler(CSRFError)
def _csrf_refused(error: CSRFError) -> tuple[str, int]:
    return _page("error.html", 400, title="Form refused",
                 detail="The form came without a valid CSRF token (or from another site). "
                        "Reload the page and send it again.")


@bp.errorhandler(Problem)
def _problem(error: Problem) -> tuple[str, int]:
    return _page("error.html", error.status, title=error.title, detail=error.detail)


@bp.errorhandler(HTTPException)
def _http_error(error: HTTPException) -> tuple[str, int]:
    status = error.code or 500
    return _page("error.html", status, title=error.name, detail=error.description)


@bp.route("/sign-in", methods=["GET", "POST"])
def sign_in() -> Response | tuple[str, int]:
    if request.method == "GET":
        return _page("sign_in.html")
    token = request.form.get("token", "").strip()
    key = _services().keys.key_for_token(token) if token else None
    if key is None:
        return _page("sign_in.html", 401, refused="That token is unknown or revoked.")
    if key.role != Role.ADMIN:
        return _page("sign_in.html", 403,
                     refused=f"A {key.role} key may not use the dashboard: sign in with an "
                             "admin key.")
    ui_session.sign_in(key.id)
    return redirect(url_for("ui.overview"))


@bp.post("/sign-out")
def sign_out() -> Response:
    ui_session.sign_out()
    flash("Signed out.", "ok")
    return redirect(url_for("ui.sign_in"))


@bp.get("/")
def overview() -> tuple[str, int]:
    services = _services()
    return _page("overview.html",
                 types=[represent_type(view) for view in services.types.list_types()],
                 **_schedules_shown(),
                 workers=[represent_worker(worker) for worker in services.history.workers()])


@bp.get("/jobs")
def jobs() -> tuple[str, int]:
    services = _services()
    try:
        filters = job_filters(request.args)
    except FormInvalid as invalid:
        return _page("jobs.html", 400, jobs=[], filters={}, next_cursor=None,
                     job_types=sorted(services.types.job_types),
                     messages=invalid.messages)
    page, next_cursor = services.jobs.list_jobs(
        _caller(), status=filters.get("status"), job_type=filters.get("type"),
        producer=filters.get("producer"), limit=JOBS_PER_PAGE, cursor=filters.get("cursor"))
    shown = {name: value for name, value in filters.items() if name != "cursor"}
    return _page("jobs.html", jobs=[_shown(job) for job in page],
                 filters=shown, next_cursor=next_cursor, messages={},
                 job_types=sorted(services.types.job_types))


@bp.get("/jobs/<id:job_id>")
def job(job_id: int) -> tuple[str, int]:
    services, caller = _services(), _caller()
    return _page("job.html", job=_shown(services.jobs.get_job(caller, job_id)),
                 attempts=[represent_attempt(a, show_error=True)
                           for a in services.history.attempts(caller, job_id)],
                 events=[represent_event(e) for e in services.history.events(caller, job_id)],
                 explanation=represent_explanation(services.history.explain(caller, job_id)))


def _shown(job: Job) -> dict[str, Any]:
    # As the API shows it to an admin, with the producer too (the API's representation
    # leaves it out: a producer sees only its own jobs).
    return represent(job, show_error=True) | {"producer": job.producer}


@bp.post("/jobs/<id:job_id>/retry")
def retry_job(job_id: int) -> Response:
    return _act(lambda: _services().jobs.retry(_caller(), job_id), "Sent back to pending.",
                url_for("ui.job", job_id=job_id))


@bp.post("/jobs/<id:job_id>/cancel")
def cancel_job(job_id: int) -> Response:
    return _act(lambda: _services().jobs.cancel(_caller(), job_id), "Cancelled.",
                url_for("ui.job", job_id=job_id))


@bp.get("/types")
def types() -> tuple[str, int]:
    return _page("types.html",
                 types=[represent_type(view) for view in _services().types.list_types()])


@bp.post("/types/<job_type>/pause")
def pause_type(job_type: str) -> Response:
    return _change_type(job_type, {"paused": True}, f"{job_type}: paused.")


@bp.post("/types/<job_type>/resume")
def resume_type(job_type: str) -> Response:
    return _change_type(job_type, {"paused": False}, f"{job_type}: resumed.")


@bp.post("/types/<job_type>/limits")
def change_limits(job_type: str) -> Response:
    try:
        patch = limits_patch(request.form)
    except FormInvalid as invalid:
        for name, messages in invalid.messages.items():
            for message in messages:
                flash(f"{job_type}: {name}: {message}", "error")
        return redirect(url_for("ui.types"))
    return _change_type(job_type, patch, f"{job_type}: limits changed.")


def _change_type(job_type: str, patch: dict[str, Any], done: str) -> Response:
    return _act(lambda: _services().types.update_type(job_type, patch), done,
                url_for("ui.types"))


def _act(action: Any, done: str, then: str) -> Response:
    """Run a form's action; its refusal (a 404, a 409) becomes a message on the next page."""
    try:
        action()
    except Problem as refused:
        flash(refused.detail, "error")
    else:
        flash(done, "ok")
    return redirect(then)


@bp.get("/schedules")
def schedules() -> tuple[str, int]:
    # A cursor this service did not issue is a Problem: answered by the error page (422).
    return _page("schedules.html", **_schedules_shown(request.args.get("cursor") or None))


def _schedules_shown(cursor: str | None = None) -> dict[str, Any]:
    """A page of schedules (the first, or the one after `cursor`) and the next page's cursor."""
    page, next_cursor = _services().schedules.list_schedules(limit=SCHEDULES_PER_PAGE,
                                                             cursor=cursor)
    return {"schedules": [represent_schedule(s) for s in page], "next_cursor": next_cursor}


@bp.post("/schedules/<name>/pause")
def pause_schedule(name: str) -> Response:
    return _change_schedule(name, {"paused": True}, f"{name}: paused.")


@bp.post("/schedules/<name>/resume")
def resume_schedule(name: str) -> Response:
    return _change_schedule(name, {"paused": False}, f"{name}: resumed.")


@bp.post("/schedules/<name>/delete")
def delete_schedule(name: str) -> Response:
    return _act(lambda: _services().schedules.delete_schedule(name),
                f"{name}: deleted (the jobs it enqueued stay).", url_for("ui.schedules"))


def _change_schedule(name: str, patch: dict[str, Any], done: str) -> Response:
    return _act(lambda: _services().schedules.update_schedule(name, patch), done,
                url_for("ui.schedules"))
