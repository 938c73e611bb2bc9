"""What a live page (docs/DASHBOARD.md, "Live pages") shows that changes by itself: its
figures by element, as the page's template writes them (the same filters make the same
text), and its shape, a digest of what a figure cannot follow (a row more or less, a status
that brings other buttons): the page carries the digest it was drawn with, and a JSON twin
that answers another one makes the script offer a reload rather than rebuild the page.

A figure is text, or {"text", "href"} (a count that is a link while it is not 0), {"text",
"class"} (a status, coloured by its class), {"time", "text", "age"} (a moment, as the `when`
macro writes it; None: "—") or {"value", "max", "text"} (a <progress> element)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from flask import Flask, url_for

from app.ui.job_views import oldest_claimable_text
from app.ui.present import age, counts_text, oldest_claimable, percent, type_state, utc

# The overview's counts by status, in its columns' order; those that are links to the jobs
# list while they are not 0.
COUNTED = ("waiting", "pending", "scheduled", "running", "suspended", "completed", "failed",
           "cancelled")
LINKED = frozenset({"waiting", "suspended", "failed"})

Figures = dict[str, Any]


def _digest(shape: Any) -> str:
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def moment(at: str | None) -> dict[str, str] | None:
    """A time as the `when` macro writes it: in UTC and its age."""
    return None if not at else {"time": at, "text": utc(at), "age": f"({age(at)})"}


# -- the overview: each type's row of the types table -------------------------------------------

def overview_figures(types: Sequence[Mapping[str, Any]]) -> Figures:
    figures: Figures = {"oldest_claimable": oldest_claimable_text(types)}
    for shown in types:
        name, counts = shown["type"], shown["counts"]
        for status in COUNTED:
            count = counts[status]
            figures[f"type/{name}/{status}"] = (
                {"text": str(count),
                 "href": url_for("ui.jobs", type=name, status=status) if count else None}
                if status in LINKED else str(count))
        figures[f"type/{name}/oldest"] = oldest_claimable(shown)
        state, held = type_state(shown)
        figures[f"type/{name}/state"] = {
            "text": state, "class": "paused" if held else "",
            "href": url_for("ui.job_type", job_type=name)
            if held and not shown["paused"] else None}
        figures[f"type/{name}/last_claim"] = moment(shown["last_claim_at"])
    return figures


def overview_shape(types: Iterable[Mapping[str, Any]]) -> str:
    return _digest(["overview", [(shown["type"], shown["paused"]) for shown in types]])


# -- a type's page ------------------------------------------------------------------------------

def type_figures(shown: Mapping[str, Any]) -> Figures:
    circuit = shown["circuit_state"]
    figures: Figures = {
        "jobs": {"text": counts_text(shown["counts"]),
                 "href": url_for("ui.jobs", type=shown["type"])},
        "oldest": oldest_claimable(shown),
        "last_claim": moment(shown["last_claim_at"])}
    if circuit is not None:
        figures["circuit_state"] = {"text": circuit["state"].replace("_", "-"),
                                    "class": _circuit_class(circuit["state"])}
    return figures


def _circuit_class(state: str) -> str:
    return f"circuit-{state}" + ("" if state == "closed" else " paused")


def type_shape(shown: Mapping[str, Any]) -> str:
    circuit = shown["circuit_state"] or {}
    return _digest(["type", shown["type"], shown["paused"], circuit.get("state"),
                    circuit.get("since"), shown["blocked_keys"] > 0])


# -- a job's page --------------------------------------------------------------------------------

def job_figures(job: Mapping[str, Any]) -> Figures:
    figures: Figures = {
        "status": {"text": job["status"], "class": f"status-{job['status']}"},
        "retries": f"{job['retry_count']} of {job['max_retries']}",
        "claimed": moment(job["claimed_at"]),
        "lease": moment(job["lease_expires_at"]),
        "updated": moment(job["updated_at"])}
    progress = job.get("progress")
    if progress:
        figures["progress_at"] = moment(progress["at"])
        if progress["message"]:
            figures["progress_message"] = progress["message"]
        if progress["done"] is not None:
            figures["progress_count"] = f"{progress['done']} / {progress['total']}"
            if progress["total"]:
                figures["progress"] = {"value": progress["done"], "max": progress["total"],
                                       "text": percent(progress)}
                figures["progress_share"] = f"({percent(progress)})"
    return figures


def job_shape(job: Mapping[str, Any], attempts: int, cancel_request: Any) -> str:
    """A new status (other buttons, an error or a result), a new attempt, progress drawn
    another way (counts, a total, a message) or a cancel asked are a change of shape."""
    progress = job.get("progress") or {}
    return _digest(["job", job["id"], job["status"], attempts, bool(progress),
                    progress.get("done") is not None, bool(progress.get("total")),
                    bool(progress.get("message")), cancel_request is not None])


# -- the failures page: each group's row ----------------------------------------------------------

def group_key(group: Mapping[str, Any]) -> str:
    return f"group/{group['type']}/{group['fingerprint']}"


def failures_figures(groups: Iterable[Mapping[str, Any]]) -> Figures:
    figures: Figures = {}
    for group in groups:
        key = group_key(group)
        figures |= {f"{key}/count": f"{group['count']:,}",
                    f"{key}/jobs_failed": f"{group['jobs_failed']:,}",
                    f"{key}/sample": group["sample"]}
    return figures


def failures_shape(groups: Iterable[Mapping[str, Any]]) -> str:
    """The groups shown, whatever their order (a group failing again moves up: its counts
    follow it; a group new to the page is a change of shape)."""
    return _digest(["failures", sorted(group_key(group) for group in groups)])


def init_shapes(app: Flask) -> None:
    """The shapes, for the templates to mark their pages with: `live_shape.job(job, ...)`."""
    app.jinja_env.globals["live_shape"] = {
        "overview": overview_shape, "type": type_shape, "job": job_shape,
        "failures": failures_shape}
