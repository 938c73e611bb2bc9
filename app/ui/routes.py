"""Thin handlers of the dashboard's pages: read the session's admin, call the services the
JSON API calls, render a template (or redirect after a form)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flask import flash, redirect, request, url_for
from marshmallow import ValidationError
from werkzeug.exceptions import BadRequest, NotFound
from werkzeug.wrappers import Response

from app.core.callers import Role
from app.core.errors import QueueError
from app.history.explain import ReasonCode
from app.history.schemas import (
    represent_attempt,
    represent_event,
    represent_explanation,
    represent_worker,
)
from app.jobs.domain.cursor import encode_cursor
from app.jobs.domain.transitions import Transition
from app.jobs.web.requests import BulkSchema
from app.schedules.schemas import represent_schedule
from app.stats.models import Series
from app.types.schemas import represent_type
from app.ui import job_views as views
from app.ui import session as ui_session
from app.ui import throttle
from app.ui.charts import Period, window
from app.ui.forms import (
    JOB_FILTER_STATUSES,
    KEY_MODE_CHOICES,
    NEWEST_FIRST,
    REFRESH_ON,
    SCHEDULED,
    WORKFLOW_FILTER_STATUSES,
    FormInvalid,
    chart_filters,
    job_filters,
    key_modes_patch,
    limits_patch,
    workflow_filters,
)
from app.ui.graph_drawing import NODE_HEIGHT, NODE_WIDTH, GraphJob, draw, why_not_drawn
from app.ui.pages import act as _act
from app.ui.pages import bp
from app.ui.pages import queue_services as _services
from app.ui.pages import render_page as _page
from app.ui.pages import signed_in as _caller
from app.ui.search import error_match
from app.web.problems import flatten_errors
from app.workflows.schemas import represent_summary, represent_workflow

JOBS_PER_PAGE = 50
_bulk_schema = BulkSchema()
SCHEDULES_PER_PAGE = JOBS_PER_PAGE
WORKFLOWS_PER_PAGE = JOBS_PER_PAGE
BLOCKED_KEYS_SHOWN = 50
# A bulk action's confirmation counts the jobs it would find up to this many.
BULK_COUNT_CAP = 10_000


@bp.route("/sign-in", methods=["GET", "POST"])
def sign_in() -> Response | tuple[str, int]:
    if request.method == "GET":
        return _page("sign_in.html", signed_out="signed_out" in request.args)
    address = request.remote_addr or "unknown"
    wait = throttle.retry_after(address)
    if wait is not None:
        page, status = _page("sign_in.html", 429,
                             refused=f"Too many failed sign-ins: try again in {wait} s.")
        return Response(page, status, headers={"Retry-After": str(wait)})
    token = request.form.get("token", "").strip()
    key = _services().keys.key_for_token(token) if token else None
    if key is None:
        throttle.count_failure(address)
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
    # Said by the address, not a flash: the session that could carry one has just ended.
    return redirect(url_for("ui.sign_in", signed_out=1))


@bp.get("/")
def overview() -> tuple[str, int]:
    services = _services()
    charts = _charts_asked()
    types = [represent_type(view) for view in services.types.list_types()]
    blocked = [views.blocked_shown(turn)
               for turn in services.types.blocked_keys(BLOCKED_KEYS_SHOWN)]
    # Counted and listed in two reads: the total said is never less than the rows shown.
    blocked_total = max(len(blocked), sum(shown["blocked_keys"] for shown in types))
    series = _series_of([None, *(shown["type"] for shown in types)], charts["period"])
    return _page("overview.html", types=types, blocked_keys=blocked,
                 oldest_claimable=views.oldest_claimable_text(types),
                 blocked_total=blocked_total, **_schedules_shown(),
                 workers=[represent_worker(worker) for worker in services.history.workers()],
                 totals=series[0], per_type=series[1:], **charts,
                 **views.horizon_shown(services.horizon.report()))


@bp.get("/types/<job_type>")
def job_type(job_type: str) -> tuple[str, int]:
    """A type's settings, as the types page shows them, and its charts over the period."""
    charts = _charts_asked()
    # An unknown type is a NotFound (QueueError): the dashboard's 404 page.
    shown = represent_type(_services().types.get_type(job_type))
    return _page("type.html", type=shown, series=_series_of([job_type], charts["period"])[0],
                 **charts)


def _charts_asked() -> dict[str, Any]:
    """The period (default: the last hour) and auto-refresh a page with charts was asked
    for; a 400 page saying what is wrong for a query string it cannot use."""
    try:
        filters = chart_filters(request.args)
    except FormInvalid as invalid:
        said = "; ".join(f"{name}: {' '.join(texts)}" for name, texts in invalid.messages.items())
        raise BadRequest(f"These filters cannot be used: {said}") from None
    return {"period": Period(filters.get("period", Period.HOUR)),
            "auto_refresh": filters.get("refresh") == REFRESH_ON}


def _series_of(job_types: list[str | None], period: Period) -> list[Series]:
    """Each type's stats over the period (None: every type's, summed), in the order asked."""
    services = _services()
    start_us, end_us, step = window(period, services.clock.now_us())
    return [services.stats.series(name, start_us=start_us, end_us=end_us, step=step)
            for name in job_types]


@bp.get("/jobs")
def jobs() -> tuple[str, int]:
    services = _services()
    try:
        filters = job_filters(request.args)
    except FormInvalid as invalid:
        return _page("jobs.html", 400, jobs=[], filters={}, next_cursor=None,
                     previous_cursor=None, job_types=sorted(services.types.job_types),
                     messages=invalid.messages, statuses=JOB_FILTER_STATUSES, bulk=None,
                     paused_types=frozenset())
    status = filters.get("status")
    backward = "before" in filters
    # The error text matches failure groups; the jobs are those with an attempt in them.
    matched = error_match(filters["error"], filters.get("type")) if "error" in filters else None
    page, following = services.jobs.list_jobs(
        _caller(), status=None if status == SCHEDULED else status,
        scheduled=status == SCHEDULED, job_type=filters.get("type"),
        producer=filters.get("producer"), tag=filters.get("tag"), limit=JOBS_PER_PAGE,
        cursor=filters.get("before") if backward else filters.get("cursor"),
        newest_first=filters.get("order", NEWEST_FIRST) == NEWEST_FIRST, backward=backward,
        failure_groups=None if matched is None else matched.pairs)
    # Going backwards, `following` leads further back and the page we came from is next;
    # going forwards, a page reached through a cursor has one before it.
    if backward:
        previous_cursor, next_cursor = following, encode_cursor(page[-1].id) if page else None
    else:
        next_cursor = following
        previous_cursor = encode_cursor(page[0].id) if page and "cursor" in filters else None
    shown = {name: value for name, value in filters.items() if name not in ("cursor", "before")}
    # The page's progress, cancel requests and tags in one read each, not one per job.
    extras = services.jobs.extras_of(page)
    return _page("jobs.html", jobs=[views.shown(job, controls=extras.controls, tags=extras.tags,
                                                   waiting_for=extras.waiting_for)
                                    for job in page],
                 filters=shown, next_cursor=next_cursor, previous_cursor=previous_cursor,
                 messages={}, auto_refresh=filters.get("refresh") == REFRESH_ON,
                 job_types=sorted(services.types.job_types), statuses=JOB_FILTER_STATUSES,
                 bulk=_bulk_actions(shown), paused_types=services.types.paused_types(),
                 error_match=matched)


def _bulk_actions(filters: dict[str, str]) -> list[str]:
    """The bulk actions the jobs page offers for its filters: those the API's bulk routes
    can take (a type and a status; neither a producer, a tag, an error text nor `scheduled`),
    and only those that start from the status filtered on."""
    if any(name in filters for name in ("producer", "tag", "error")) \
            or filters.get("status") == SCHEDULED:
        return []
    status = filters.get("status")
    return [action for action, transition in _BULK.items()
            if status is None or status in {s.value for s in transition.from_statuses}]


# The jobs list's bulk actions, each with the transition its service call makes.
_BULK = {"retry": Transition.RETRY, "cancel": Transition.CANCEL}


@bp.get("/jobs/<action>-many")
def confirm_bulk(action: str) -> tuple[str, int]:
    """Ask before a bulk action: what it takes, in words, and the form that does it."""
    filters = _bulk_filters(action, request.args)
    # How many jobs it would find now, counted up to a cap (each status's partial index).
    found = _services().jobs.count_for_bulk(
        _caller(), _BULK[action], job_type=filters.get("type"), status=filters.get("status"),
        cap=BULK_COUNT_CAP)
    return _page("bulk.html", action=action, filters=filters, found=found,
                 statuses=sorted(s.value for s in _BULK[action].from_statuses
                                 if filters.get("status") in (None, s.value)))


@bp.post("/jobs/<action>-many")
def bulk(action: str) -> Response:
    filters = _bulk_filters(action, request.form)
    caller, service = _caller(), _services().jobs
    run = service.retry_many if action == "retry" else service.cancel_many
    shown = {name: value for name, value in filters.items() if name != "limit"}
    try:
        changed = run(caller, filters)
    except QueueError as refused:
        flash(refused.detail, "error")
    else:
        done = "sent back to pending" if action == "retry" else "cancelled"
        flash(f"{len(changed)} job{'' if len(changed) == 1 else 's'} {done}.", "ok")
    return redirect(url_for("ui.jobs", **shown))


def _bulk_filters(action: str, given: Any) -> dict[str, Any]:
    """The filters a bulk action takes, through the API's own BulkSchema (its limit
    included); a 404 for an action there is none of, a 400 page for filters it refuses."""
    if action not in _BULK:
        raise NotFound()
    wanted = {name: given.get(name, "").strip() for name in ("type", "status")}
    try:
        loaded: dict[str, Any] = _bulk_schema.load(
            {name: value for name, value in wanted.items() if value})
    except ValidationError as error:
        said = "; ".join(f"{name}: {' '.join(texts)}"
                         for name, texts in flatten_errors(error.messages).items())
        raise BadRequest(f"These filters cannot be used: {said}") from None
    return loaded


@bp.get("/jobs/<id:job_id>")
def job(job_id: int) -> tuple[str, int]:
    services, caller = _services(), _caller()
    found = services.jobs.get_job(caller, job_id)
    extras = services.jobs.extras_of([found])
    shown = views.shown(found, extras.dependencies, extras.controls, extras.tags, extras.traces,
                        extras.waiting_for)
    explanation = represent_explanation(services.history.explain(caller, job_id))
    # A failed job that blocks its ordered key may be cancelled too: that passes the turn on.
    blocks_its_key = any(reason["code"] == ReasonCode.KEY_BLOCKED and reason.get("job_id") == job_id
                         for reason in explanation["reasons"])
    return _page("job.html", job=shown, blocks_its_key=blocks_its_key,
                 type_paused=found.type in services.types.paused_types(),
                 workflow_id=services.workflows.workflow_of_job(caller, job_id),
                 attempts=[represent_attempt(a, show_error=True)
                           for a in services.history.attempts(caller, job_id)],
                 events=[views.event_shown(represent_event(e), shown["error"])
                         for e in services.history.events(caller, job_id)],
                 explanation=explanation,
                 cancel_request=views.cancel_request(shown, extras.controls.get(job_id)),
                 attempt_deadline=views.attempt_deadline(found))


@bp.post("/jobs/<id:job_id>/retry")
def retry_job(job_id: int) -> Response:
    return _act(lambda: _services().jobs.retry(_caller(), job_id), "Sent back to pending.",
                url_for("ui.job", job_id=job_id))


@bp.post("/jobs/<id:job_id>/cancel")
def cancel_job(job_id: int) -> Response:
    return _act(lambda: _services().jobs.cancel(_caller(), job_id), views.cancel_said,
                url_for("ui.job", job_id=job_id))


@bp.get("/types")
def types() -> tuple[str, int]:
    return _page("types.html",
                 types=[represent_type(view) for view in _services().types.list_types()],
                 key_mode_choices=KEY_MODE_CHOICES)


@bp.post("/types/<job_type>/pause")
def pause_type(job_type: str) -> Response:
    return _change_type(job_type, {"paused": True}, f"{job_type}: paused.")


@bp.post("/types/<job_type>/resume")
def resume_type(job_type: str) -> Response:
    return _change_type(job_type, {"paused": False}, f"{job_type}: resumed.")


@bp.post("/types/<job_type>/limits")
def change_limits(job_type: str) -> Response:
    return _change_type_by_form(job_type, limits_patch, f"{job_type}: limits changed.")


@bp.post("/types/<job_type>/keys")
def change_key_modes(job_type: str) -> Response:
    return _change_type_by_form(job_type, key_modes_patch, f"{job_type}: key modes changed.")


def _change_type_by_form(job_type: str, read: Callable[[Mapping[str, str]], dict[str, Any]],
                         done: str) -> Response:
    """Change a type as its form asks; a form it cannot use changes nothing and comes back
    as messages on the types page, by field."""
    try:
        patch = read(request.form)
    except FormInvalid as invalid:
        for name, messages in invalid.messages.items():
            for message in messages:
                flash(f"{job_type}: {name}: {message}", "error")
        return redirect(url_for("ui.types"))
    return _change_type(job_type, patch, done)


def _change_type(job_type: str, patch: dict[str, Any], done: str) -> Response:
    return _act(lambda: _services().types.update_type(job_type, patch), done,
                url_for("ui.types"))


@bp.get("/schedules")
def schedules() -> tuple[str, int]:
    # A cursor this service did not issue is a QueueError: answered by the error page (422).
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


@bp.get("/workflows")
def workflows() -> tuple[str, int]:
    try:
        filters = workflow_filters(request.args)
    except FormInvalid as invalid:
        return _page("workflows.html", 400, workflows=[], filters={}, next_cursor=None,
                     messages=invalid.messages, statuses=WORKFLOW_FILTER_STATUSES)
    # A cursor this service did not issue is a QueueError: answered by the error page (422).
    page, next_cursor = _services().workflows.list(
        _caller(), status=filters.get("status"), limit=WORKFLOWS_PER_PAGE,
        cursor=filters.get("cursor"))
    shown = {name: value for name, value in filters.items() if name != "cursor"}
    return _page("workflows.html", workflows=[represent_summary(view) for view in page],
                 filters=shown, next_cursor=next_cursor, messages={},
                 statuses=WORKFLOW_FILTER_STATUSES)


@bp.get("/workflows/<id:workflow_id>")
def workflow(workflow_id: int) -> tuple[str, int]:
    shown = represent_workflow(_services().workflows.get(_caller(), workflow_id))
    jobs = [GraphJob(job["id"], job["ref"], job["type"], job["status"],
                     tuple(job["depends_on"])) for job in shown["jobs"]]
    not_drawn = why_not_drawn(jobs)
    return _page("workflow.html", workflow=shown, not_drawn=not_drawn,
                 drawing=None if not_drawn else draw(jobs),
                 refs={job.id: job.ref for job in jobs},
                 node_width=NODE_WIDTH, node_height=NODE_HEIGHT)


@bp.post("/workflows/<id:workflow_id>/cancel")
def cancel_workflow(workflow_id: int) -> Response:
    return _act(lambda: _services().workflows.cancel(_caller(), workflow_id),
                "Cancelled its waiting and pending jobs.",
                url_for("ui.workflow", workflow_id=workflow_id))
