"""How the dashboard shows values: times in UTC with their age, durations, JSON as text.
Every filter returns plain text; the templates' autoescaping makes it safe to show."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from flask import Flask, current_app

from app.core.clock import MICROS, parse_rfc3339
from app.core.limits import LIMITS
from app.ui.charts import chart_totals, depth_chart, failures_chart, throughput_chart

_UNITS = ((86_400, "d"), (3600, "h"), (60, "min"), (1, "s"))


def utc(moment: str | None) -> str:
    """An RFC 3339 time (as the API writes it) as `2026-11-30 14:55:12 UTC`."""
    if not moment:
        return "—"
    return f"{moment[:10]} {moment[11:19]} UTC"


def in_zone(moment: str | None, zone: str) -> str:
    """An RFC 3339 time in an IANA time zone, as `2026-12-01 03:00:00 CET`."""
    if not moment:
        return "—"
    local = datetime.fromtimestamp(parse_rfc3339(moment) / MICROS, ZoneInfo(zone))
    return local.strftime("%Y-%m-%d %H:%M:%S %Z")


def duration(seconds: float | None) -> str:
    """A span of time in its largest unit or two: `45 s`, `3 min`, `2 h 5 min`."""
    if seconds is None:
        return "—"
    whole = int(seconds)
    if whole < 1:
        return f"{seconds:.1f} s" if seconds > 0 else "0 s"
    parts = []
    for size, unit in _UNITS:
        if whole >= size:
            parts.append(f"{whole // size} {unit}")
            whole %= size
        if len(parts) == 2:
            break
    return " ".join(parts)


def age(moment: str | None) -> str:
    """How long ago (or how far ahead) an RFC 3339 time is, by the service's clock."""
    if not moment:
        return ""
    now = current_app.extensions["queuelog"].clock.now_us()
    seconds = (now - parse_rfc3339(moment)) / MICROS
    if abs(seconds) < 1:
        return "just now"
    return f"{duration(seconds)} ago" if seconds > 0 else f"in {duration(-seconds)}"


def last_line(text: str | None) -> str:
    """The last line with something on it: of a traceback, the exception and its message."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def json_text(value: Any) -> str:
    """A JSON value as indented text (non-ASCII as it is)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


def limits(shown_type: dict[str, Any]) -> str:
    """A type's flow control in words, as GET /types shows the type: `none`, or e.g.
    `5 running · 2 per key · 2.5/s, burst 4`."""
    parts = []
    if shown_type["max_running"] is not None:
        parts.append(f"{shown_type['max_running']} running")
    if shown_type["max_running_per_key"] is not None:
        parts.append(f"{shown_type['max_running_per_key']} per key")
    if shown_type["rate_per_second"] is not None:
        parts.append(f"{shown_type['rate_per_second']:g}/s, burst {shown_type['burst']}")
    return " · ".join(parts) or "none"


def circuit_text(shown_type: dict[str, Any]) -> str:
    """A type's circuit breaker in words (docs/FLOW-CONTROL.md), as GET /types shows it:
    `off`, or e.g. `closed · opens at 50% failed of at least 20 attempts in 60 s, probes
    after 30 s`; where it stands and since when is the template's."""
    circuit = shown_type["circuit"]
    if circuit is None:
        return "off"
    return (f"opens at {circuit['failure_ratio']:.0%} failed of at least "
            f"{circuit['min_attempts']} attempts in {circuit['window_seconds']} s, probes after "
            f"{circuit['cooldown_seconds']} s")


def retry_budget_text(shown_type: dict[str, Any]) -> str:
    """`off`, or e.g. `0.2 per first attempt + 10 retries per 60 s`."""
    budget = shown_type["retry_budget"]
    if budget is None:
        return "off"
    return (f"{budget['ratio']:g} per first attempt + {budget['minimum']} retries per "
            f"{budget['window_seconds']} s")


def counts_text(counts: dict[str, int]) -> str:
    """Jobs by status in words, the statuses with none left out: `3 waiting · 1 running`."""
    return " · ".join(f"{n} {status}" for status, n in counts.items() if n) or "no jobs"


def percent(progress: dict[str, Any] | None) -> str:
    """A job's progress (as the API shows it) as a whole percentage, `42 %`, rounded down so
    that 100 % means done; "" when it says no share (no counts, or a total of 0)."""
    if not progress or progress["done"] is None or not progress["total"]:
        return ""
    return f"{progress['done'] * 100 // progress['total']} %"


# The failures page's chart of a group's last day: one bar an hour, scaled to its busiest.
BAR_WIDTH, BAR_GAP, CHART_HEIGHT = 5, 1, 24


def hourly_chart(hourly: list[dict[str, Any]]) -> dict[str, Any]:
    """A failure group's failed attempts per hour (as GET /failures/{type}/{fingerprint}
    shows them, oldest first) as an SVG bar chart's geometry: its size and its bars, each
    with its place, its height and its words (`2027-01-15 08:00 UTC: 3 failed attempts`).
    An hour without any is a 1-pixel line, so that every hour is there to point at."""
    busiest = max((hour["count"] for hour in hourly), default=0)
    bars = []
    for position, hour in enumerate(hourly):
        count = hour["count"]
        height = max(1, round(CHART_HEIGHT * count / busiest)) if busiest else 1
        bars.append({"x": position * (BAR_WIDTH + BAR_GAP), "y": CHART_HEIGHT - height,
                     "width": BAR_WIDTH, "height": height, "count": count,
                     "hour": hour["hour"],
                     "label": f"{utc(hour['hour'])[:16]} UTC: {count} failed "
                              f"attempt{'' if count == 1 else 's'}"})
    return {"width": max(0, len(bars) * (BAR_WIDTH + BAR_GAP) - BAR_GAP),
            "height": CHART_HEIGHT, "bars": bars,
            "counts": ", ".join(str(bar["count"]) for bar in bars)}


def waits_for(waiting_for: Mapping[str, Any]) -> str:
    """What a suspended job waits for, in words (docs/WAITS.md): `the event order.paid, key
    1001, until 2027-01-15 08:00:00 UTC` (until: its timeout); a sleep's `until …`."""
    until = utc(waiting_for.get("until"))
    if waiting_for.get("kind") == "event":
        key = waiting_for.get("key")
        return (f"the event {waiting_for.get('event')}{f', key {key}' if key else ''}, "
                f"until {until} at most")
    if waiting_for.get("kind") == "token":
        return f"its waitpoint token's answer, until {until} at most"
    return f"until {until}"


def type_state(shown: Mapping[str, Any]) -> tuple[str, bool]:
    """A type's state in a word or two, and whether it holds jobs back: `paused`, `circuit
    open` or `circuit half-open` (docs/FLOW-CONTROL.md), else `active` (a closed circuit is
    the usual state). The overview and its live figures write it so."""
    circuit = shown["circuit_state"]
    if shown["paused"]:
        return "paused", True
    if circuit is not None and circuit["state"] != "closed":
        return f"circuit {circuit['state'].replace('_', '-')}", True
    return "active", False


def oldest_claimable(shown: Mapping[str, Any]) -> str:
    """A type's oldest claimable job (as GET /types shows the type): its age, or for a paused
    type none, with how long its oldest due job has waited (the overview, the type's page
    and their live figures write it so)."""
    waited = shown["oldest_claimable_age_seconds"]
    if not shown["paused"]:
        return duration(waited)
    return "none: paused" + ("" if waited is None
                             else f" (its oldest due job waits {duration(waited)})")


def register_filters(app: Flask) -> None:
    for name, fn in (("utc", utc), ("age", age), ("duration", duration), ("waits_for", waits_for),
                     ("json_text", json_text), ("limits", limits), ("counts_text", counts_text),
                     ("circuit_text", circuit_text), ("retry_budget_text", retry_budget_text),
                     ("last_line", last_line), ("in_zone", in_zone), ("percent", percent),
                     ("hourly_chart", hourly_chart), ("chart_totals", chart_totals),
                     ("oldest_claimable", oldest_claimable), ("type_state", type_state)):
        app.add_template_filter(fn, name)
    # The queue over time as SVG (app/ui/charts.py): `{{ series|throughput_chart(small=true) }}`.
    for name, draw in (("throughput_chart", throughput_chart),
                       ("failures_chart", failures_chart), ("depth_chart", depth_chart)):
        app.add_template_filter(draw, name)
    # The limits' bounds, from their one home, for the forms' inputs to offer:
    # `{{ bounds.TYPE_LIMIT.max }}` (the `limits` filter shows a type's settings).
    app.jinja_env.globals.update(bounds={limit.name: limit for limit in LIMITS})
