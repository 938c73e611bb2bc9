"""Finding a job: the search box on every page's header (a job's id jumps to its page; other
text lists the jobs whose errors hold it) and the jobs list's error filter, which matches
the text against the failure groups (a row per type and fingerprint) and lists the jobs with
an attempt in the groups matched, through the attempts' fingerprint index: never a scan of
the jobs' or the attempts' errors."""

from __future__ import annotations

import re
from dataclasses import dataclass

from flask import redirect, request, url_for
from werkzeug.wrappers import Response

from app.core.errors import NotFound
from app.core.limits import JOB_ID
from app.jobs.timeline.failure_repository import FailureGroup
from app.ui.forms import FormInvalid, search_query
from app.ui.pages import bp, queue_services, render_page, signed_in

# The groups an error filter lists the jobs of, the most recently seen first; the page says
# when more match (a longer text narrows them).
MATCHED_GROUPS_MAX = 50
# A job's id as typed: ASCII digits, "#" before them allowed.
_JOB_ID = re.compile(r"#?([0-9]+)")


@dataclass(frozen=True, slots=True)
class ErrorMatch:
    """The failure groups an error text matched and whether more did than are used."""

    text: str
    groups: list[FailureGroup]
    more: bool

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return [(group.type, group.fingerprint) for group in self.groups]


def error_match(text: str, job_type: str | None) -> ErrorMatch:
    groups, more = queue_services().failures.matching(text, job_type=job_type,
                                                     limit=MATCHED_GROUPS_MAX)
    return ErrorMatch(text, groups, more)


@bp.get("/search")
def search() -> Response | tuple[str, int]:
    """A job's id: its page (or "No job N." when there is none); other text: the jobs list
    filtered by that error text; nothing: the jobs list."""
    try:
        text = search_query(request.args)
    except FormInvalid as invalid:
        said = "; ".join(" ".join(texts) for texts in invalid.messages.values())
        return render_page("error.html", 400, title="Search refused",
                           detail=f"The search text cannot be used: {said}")
    if not text:
        return redirect(url_for("ui.jobs"))
    number = _JOB_ID.fullmatch(text)
    if number is None:
        return redirect(url_for("ui.jobs", error=text))
    job_id = int(number.group(1))
    if JOB_ID.min <= job_id <= JOB_ID.max:
        try:
            queue_services().jobs.get_job(signed_in(), job_id)
        except NotFound:
            pass
        else:
            return redirect(url_for("ui.job", job_id=job_id))
    return render_page("error.html", 404, title=f"No job {job_id}",
                       detail=f"No job {job_id}: there is none with that id (or it has been "
                              "removed by retention).")
