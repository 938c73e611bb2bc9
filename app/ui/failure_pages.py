"""The dashboard's failures page (docs/DASHBOARD.md): the failure groups, and a group's retry,
which a page of its own confirms first with the count it takes."""

from __future__ import annotations

from typing import Any

from flask import request, url_for
from marshmallow import ValidationError
from werkzeug.exceptions import NotFound
from werkzeug.wrappers import Response

from app.core.fingerprint import FINGERPRINT_PATTERN
from app.core.limits import BULK_JOBS
from app.core.statuses import JobStatus
from app.history.failure_schemas import represent_detail
from app.jobs.web.requests import BulkSchema
from app.ui import job_views as views
from app.ui.forms import FormInvalid, failure_filters
from app.ui.pages import act, bp, queue_services, render_page, signed_in

# The failures page's groups, most recently seen first, each with its chart and newest jobs
# (one read transaction): the API's default page of groups.
FAILURE_GROUPS_SHOWN = 50
_bulk_schema = BulkSchema()


@bp.get("/failures")
def failures() -> tuple[str, int]:
    """Failure groups (docs/OPERATIONS.md), most recently seen first: each with its failed
    attempts per hour over the last day, its newest jobs, its jobs failed now and a link to
    the retry of those."""
    services = queue_services()
    job_types = sorted(services.types.job_types)
    try:
        filters = failure_filters(request.args)
    except FormInvalid as invalid:
        return render_page("failures.html", 400, groups=[], filters={}, job_types=job_types,
                           messages=invalid.messages)
    job_type = filters.get("type")
    shown = [represent_detail(detail) for detail in services.failures.overview(
        job_type=job_type, limit=FAILURE_GROUPS_SHOWN)]
    return render_page("failures.html", groups=shown, job_types=job_types, messages={},
                       filters=filters)


@bp.get("/failures/<job_type>/<fingerprint>/retry")
def confirm_failure_group_retry(job_type: str, fingerprint: str) -> tuple[str, int]:
    """Ask before a group's retry: the group, and how many of its jobs the retry takes (its
    jobs failed now, at most BULK_JOBS.max); the dashboard's 404 page for no such group."""
    if not FINGERPRINT_PATTERN.fullmatch(fingerprint):
        raise NotFound("No such failure group.")
    # No such group kept: a NotFound (QueueError), the dashboard's 404 page.
    group = represent_detail(queue_services().failures.detail(job_type, fingerprint))
    return render_page("failure_retry.html", group=group, limit=BULK_JOBS.max,
                       filtered=bool(request.args.get("filtered")))


@bp.post("/failures/<job_type>/<fingerprint>/retry")
def retry_failure_group(job_type: str, fingerprint: str) -> Response:
    """Send the group's failed jobs (those whose last attempt failed with its fingerprint)
    back to pending, as POST /jobs/retry-many with the fingerprint does."""
    try:
        filters: dict[str, Any] = _bulk_schema.load(
            {"fingerprint": fingerprint, "type": job_type, "status": JobStatus.FAILED.value,
             "limit": BULK_JOBS.max})
    except ValidationError:
        raise NotFound("No such failure group.") from None
    # The page came filtered by type only when it showed this group's type.
    back = url_for("ui.failures", type=job_type if request.form.get("filtered") else None)
    return act(lambda: queue_services().jobs.retry_many(signed_in(), filters),
               views.retried_said, back)
