"""The dashboard's charts of the queue over time (contract §20): the SVG that app/ui/charts.py
draws from a series (pure, read back as XML), and the pages that show them through Flask's
test client on both engines, read as a browser and a screen reader would: by their titles."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.core.clock import MICROS, ManualClock
from app.stats.models import Bucket, Series, Step
from app.ui.charts import (
    BOTTOM,
    LARGE,
    LEFT,
    MIN_BAR,
    RIGHT,
    SMALL,
    TOP,
    Period,
    depth_chart,
    failures_chart,
    throughput_chart,
    ticks,
    window,
)
from app.ui.security import CONTENT_SECURITY_POLICY
from tests.conftest import Api, Key
from tests.ui.conftest import without_live_script

SVG = "{http://www.w3.org/2000/svg}"
# 2027-01-15 08:00 UTC, a minute's (and an hour's) first microsecond: the tests' clock.
EIGHT = 1_800_000_000 * MICROS
MINUTE = 60 * MICROS
PLOT_HEIGHT = LARGE.height - TOP - BOTTOM
PLOT_WIDTH = LARGE.width - LEFT - RIGHT


def _bucket(minute: int, enqueued: int = 0, completed: int = 0, failed: int = 0,
            pending: int | None = 0, claimed: int = 0) -> Bucket:
    return Bucket(EIGHT + minute * MINUTE, enqueued, claimed, completed, failed, pending)


def _parsed(markup: str) -> ET.Element:
    # Our own drawing, well-formed XML (or this raises): no untrusted document.
    return ET.fromstring(str(markup))  # noqa: S314


def _title(element: ET.Element) -> str:
    found = element.find(f"{SVG}title")
    assert found is not None and found.text is not None
    return found.text


def _buckets(svg: ET.Element) -> list[ET.Element]:
    return [g for g in svg.iter(f"{SVG}g") if g.get("class") == "bucket"]


def _rects(group: ET.Element, name: str) -> list[ET.Element]:
    return [rect for rect in group.iter(f"{SVG}rect") if rect.get("class") == name]


# -- the drawing --------------------------------------------------------------------------------

def test_a_throughput_chart_sums_up_its_series_and_says_each_buckets_values() -> None:
    series = Series("email", Step.MINUTE, [_bucket(0, 12, 11, 1), _bucket(1),
                                           _bucket(2, 3, 2, 0)])
    svg = _parsed(throughput_chart(series))
    said = "email: 15 enqueued, 13 completed, 1 failed in the last 3 minutes"
    assert _title(svg) == said and svg.get("aria-label") == said
    assert [_title(g) for g in _buckets(svg)] == [
        "08:00 — 12 enqueued, 11 completed, 1 failed",
        "08:01 — 0 enqueued, 0 completed, 0 failed",
        "08:02 — 3 enqueued, 2 completed, 0 failed"]
    assert _buckets(svg)[0].get("data-at") == "2027-01-15T08:00:00.000000Z"
    texts = {text.get("class"): text.text for text in svg.iter(f"{SVG}text")}
    assert (texts["start"], texts["end"]) == ("08:00 UTC", "08:03 UTC")
    # The busiest bucket is 12: the scale goes to the round 15, labelled at 0, 5, 10, 15.
    assert _axis_labels(svg) == ["0", "5", "10", "15"] and texts["max"] == "15"


def _axis_labels(svg: ET.Element) -> list[str]:
    """The value axis' labels, from the bottom up."""
    return [text.text or "" for text in svg.iter(f"{SVG}text")
            if text.get("class") in ("tick", "max")]


@pytest.mark.parametrize("busiest,labelled", [
    (1, [0, 1]), (3, [0, 1, 2, 3]), (8, [0, 2, 4, 6, 8]), (12, [0, 5, 10, 15]),
    (200, [0, 50, 100, 150, 200]), (1234, [0, 500, 1000, 1500])])
def test_the_value_axis_is_cut_at_round_ticks_up_to_the_first_above_the_busiest(
        busiest: int, labelled: list[int]) -> None:
    assert ticks(busiest) == labelled


def test_an_axis_labels_big_values_short_and_a_chart_of_zeros_says_0_once() -> None:
    busy = _parsed(throughput_chart(Series("email", Step.MINUTE, [_bucket(0, 12_000)])))
    assert _axis_labels(busy) == ["0", "5,000", "10k", "15k"]
    idle = _parsed(depth_chart(Series("email", Step.HOUR, [_bucket(0, pending=0)] * 24)))
    assert _axis_labels(idle) == ["0"]


def test_bars_are_as_high_as_their_values_the_failed_stacked_on_the_completed() -> None:
    series = Series("email", Step.MINUTE, [_bucket(0, 4, 6, 2), _bucket(1, 1, 3, 0),
                                           _bucket(2, 5)])
    first, second, third = _buckets(_parsed(throughput_chart(series)))
    # The busiest bucket (6 completed + 2 failed) is at the top of the scale (8).
    unit = PLOT_HEIGHT / 8
    (completed,), (failed,) = _rects(first, "completed"), _rects(first, "failed")
    assert float(completed.get("height", "")) == pytest.approx(6 * unit, abs=0.01)
    assert float(failed.get("height", "")) == pytest.approx(2 * unit, abs=0.01)
    assert float(failed.get("y", "")) + float(failed.get("height", "")) == pytest.approx(
        float(completed.get("y", "")), abs=0.01)
    assert float(failed.get("y", "")) == pytest.approx(TOP, abs=0.01)
    # Failures are drawn in a colour of their own.
    assert failed.get("fill") != completed.get("fill")
    assert [r.get("data-value") for r in _rects(second, "completed")] == ["3"]
    assert _rects(second, "failed") == [] and _rects(third, "completed") == []


def test_one_failure_beside_a_thousand_completions_is_still_a_visible_bar() -> None:
    series = Series("email", Step.MINUTE, [_bucket(0, 0, 1000, 1)])
    (failed,) = _rects(_buckets(_parsed(throughput_chart(series)))[0], "failed")
    assert float(failed.get("height", "")) >= MIN_BAR


def _steps(svg: ET.Element, name: str) -> list[list[tuple[float, float, float]]]:
    """Each step path of `name` as its levels: (left, right, y) of each horizontal run."""
    drawn = []
    for path in svg.iter(f"{SVG}path"):
        if path.get("class") != name:
            continue
        moves = re.findall(r"([MVH])([\d.]+)(?:,([\d.]+))?", path.get("d", ""))
        x, y, levels = float(moves[0][1]), float(moves[0][2]), []
        for command, value, _ in moves[1:]:
            if command == "V":
                y = float(value)
            else:
                levels.append((x, float(value), y))
                x = float(value)
        drawn.append(levels)
    return drawn


def test_the_enqueued_jobs_are_a_step_across_each_buckets_own_width() -> None:
    series = Series(None, Step.MINUTE, [_bucket(0, 2), _bucket(1, 0), _bucket(2, 4)])
    svg = _parsed(throughput_chart(series))
    [levels] = _steps(svg, "enqueued")
    slot, base = PLOT_WIDTH / 3, TOP + PLOT_HEIGHT
    assert levels == [pytest.approx((LEFT + i * slot, LEFT + (i + 1) * slot, y), abs=0.01)
                      for i, y in enumerate((base - PLOT_HEIGHT / 2, base, TOP))]
    assert _title(svg).startswith("All types: 6 enqueued")


def test_a_burst_in_the_last_hour_of_the_day_is_as_wide_as_its_hour() -> None:
    # 200 jobs enqueued in the current hour of a day's chart, none before: the last bucket's
    # whole width at 200, not a line leaning from the hour before's centre.
    series = Series("pdf", Step.HOUR, [
        Bucket(EIGHT + hour * 3600 * MICROS, 200 if hour == 23 else 0, 0, 0, 0,
               200 if hour == 23 else None) for hour in range(24)])
    slot = PLOT_WIDTH / 24
    [levels] = _steps(_parsed(throughput_chart(series)), "enqueued")
    assert levels[-1] == pytest.approx((LEFT + 23 * slot, LEFT + 24 * slot, TOP), abs=0.01)
    assert all(y == pytest.approx(TOP + PLOT_HEIGHT) for _, _, y in levels[:-1])
    # Its depth, counted in that hour alone: a bar as wide as the hour, filled.
    depth = _parsed(depth_chart(series))
    assert _steps(depth, "pending") == [[pytest.approx((LEFT + 23 * slot, LEFT + 24 * slot, TOP),
                                                       abs=0.01)]]
    assert [p for p in depth.iter(f"{SVG}path") if p.get("class") == "pending-area"]
    assert slot > 20  # pixels: a bar to see, not a hairline


def test_a_depth_chart_leaves_a_gap_where_no_count_was_taken() -> None:
    series = Series("pdf", Step.MINUTE, [_bucket(0, pending=3), _bucket(1, pending=5),
                                         _bucket(2, pending=None), _bucket(3, pending=None),
                                         _bucket(4, pending=2), _bucket(5, pending=None)])
    svg = _parsed(depth_chart(series))
    # Two stretches: 08:00-08:01 and 08:04 alone (a step as wide as its bucket), nothing
    # drawn across the gap. The busiest is 5: the scale's top is 6.
    slot, base = PLOT_WIDTH / 6, TOP + PLOT_HEIGHT
    assert _steps(svg, "pending") == [
        [pytest.approx((LEFT, LEFT + slot, base - PLOT_HEIGHT * 3 / 6), abs=0.01),
         pytest.approx((LEFT + slot, LEFT + 2 * slot, base - PLOT_HEIGHT * 5 / 6), abs=0.01)],
        [pytest.approx((LEFT + 4 * slot, LEFT + 5 * slot, base - PLOT_HEIGHT * 2 / 6),
                       abs=0.01)]]
    assert [_title(g) for g in _buckets(svg)] == [
        "08:00 — 3 pending", "08:01 — 5 pending", "08:02 — no count", "08:03 — no count",
        "08:04 — 2 pending", "08:05 — no count"]
    assert _title(svg) == ("pdf: 2 pending at the last count (08:04), at most 5 in the last "
                           "6 minutes")


def test_a_depth_chart_without_any_count_says_so() -> None:
    series = Series("pdf", Step.MINUTE, [_bucket(0, pending=None)] * 3)
    svg = _parsed(depth_chart(series))
    assert _title(svg) == "pdf: no count of pending jobs in the last 3 minutes"
    assert not [p for p in svg.iter(f"{SVG}path") if p.get("class") == "pending"]


def test_a_failures_chart_counts_failed_attempts() -> None:
    series = Series("sync", Step.HOUR, [
        Bucket(EIGHT + hour * 3600 * MICROS, 0, 0, 0, hour % 3, None) for hour in range(24)])
    svg = _parsed(failures_chart(series))
    assert _title(svg) == "sync: 24 failed attempts in the last 24 hours"
    groups = _buckets(svg)
    assert len(groups) == 24 and _title(groups[2]) == "10:00 — 2 failed"
    assert [len(_rects(g, "failed")) for g in groups[:3]] == [0, 1, 1]
    texts = {text.get("class"): text.text for text in svg.iter(f"{SVG}text")}
    assert (texts["start"], texts["end"]) == ("2027-01-15 08:00 UTC", "2027-01-16 08:00 UTC")
    # Its middle between them (the day's dates leave no room for its quarters), so that a
    # bar's hour reads off the axis.
    assert [text.text for text in svg.iter(f"{SVG}text") if text.get("class") == "time"] == [
        "20:00"]


def test_every_text_is_escaped_and_no_style_or_script_is_drawn() -> None:
    hostile = "<script>alert('x')</script>&\""
    series = Series(hostile, Step.MINUTE, [_bucket(0, 1, 1, 0, 1)])
    for draw in (throughput_chart, failures_chart, depth_chart):
        markup = str(draw(series))
        assert "<script" not in markup and "style=" not in markup
        svg = _parsed(markup)
        assert _title(svg).startswith(f"{hostile}: ") and svg.get("aria-label") == _title(svg)


def test_an_empty_series_is_a_chart_that_says_no_data() -> None:
    for draw in (throughput_chart, failures_chart, depth_chart):
        svg = _parsed(draw(Series("email", Step.MINUTE, [])))
        assert _buckets(svg) == []
        assert "No data" in [text.text for text in svg.iter(f"{SVG}text")]


def test_a_large_hours_chart_labels_its_quarters_and_a_small_one_its_ends_alone() -> None:
    series = Series("email", Step.MINUTE, [_bucket(minute, 1) for minute in range(60)])
    for small, expected in ((False, ["08:15", "08:30", "08:45"]), (True, [])):
        svg = _parsed(throughput_chart(series, small=small))
        assert [text.text for text in svg.iter(f"{SVG}text")
                if text.get("class") == "time"] == expected


def test_a_series_of_zeros_draws_no_bar_and_a_scale_of_zero() -> None:
    series = Series("email", Step.MINUTE, [_bucket(minute) for minute in range(60)])
    svg = _parsed(throughput_chart(series, small=True))
    assert svg.get("width") == str(SMALL.width)
    assert _title(svg) == "email: 0 enqueued, 0 completed, 0 failed in the last hour"
    assert not [r for g in _buckets(svg) for r in _rects(g, "completed") + _rects(g, "failed")]
    # One 0, at the baseline: not a 0 at the top of the axis too.
    assert _axis_labels(svg) == ["0"]


def test_the_same_series_draws_the_same_bytes() -> None:
    series = Series("email", Step.MINUTE, [_bucket(m, m % 5, m % 3, m % 2, m) for m in range(60)])
    assert throughput_chart(series) == throughput_chart(series)
    assert depth_chart(series) == depth_chart(series)


def test_a_periods_window_ends_with_the_bucket_that_holds_now() -> None:
    now = EIGHT + 90 * MICROS  # 08:01:30
    assert window(Period.HOUR, now) == (EIGHT + 2 * MINUTE - 3600 * MICROS, EIGHT + 2 * MINUTE,
                                        Step.MINUTE)
    start, end, step = window(Period.DAY, now)
    assert (step, end, (end - start) // step.micros) == (Step.HOUR, EIGHT + 3600 * MICROS, 24)


# -- the pages ----------------------------------------------------------------------------------

@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    # The pending depth counted now, not from a snapshot up to 10 s old.
    return {**app_config, "TYPE_COUNTS_MAX_AGE_SECONDS": 0}


def _traffic(api: Api, producer: Key, worker: Key) -> None:
    """Five mails and a PDF enqueued; three mails claimed: two completed, one failed for good
    (so two mails and the PDF are left pending)."""
    for _ in range(5):
        assert api.enqueue(producer, type="email", payload={}, max_retries=0).status_code == 201
    assert api.enqueue(producer, type="pdf", payload={}).status_code == 201
    for outcome in ("complete", "complete", "fail"):
        claimed = api.claim(worker, types=["email"]).get_json()
        act = api.complete if outcome == "complete" else api.fail
        assert act(worker, claimed["id"], lease_token=claimed["lease_token"]).status_code == 200


def _svgs(page: str) -> dict[str, ET.Element]:
    """The page's charts by their titles' subject (`All types`, `email`) and kind."""
    charts = {}
    for markup in re.findall(r"<svg .*?</svg>", page, flags=re.DOTALL):
        svg = _parsed(markup)
        kind = svg.get("class", "").split()[-1].removeprefix("chart-")
        charts[f"{_title(svg).split(':')[0]} {kind}"] = svg
    return charts


def test_the_overview_charts_every_types_traffic_and_each_types_own(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key, app: Flask) -> None:
    _traffic(api, producer, worker)
    app.extensions["queuelog"].stats.sample_depth()
    page = signed_in.get("/ui/")
    assert page.status_code == 200
    charts = _svgs(page.text)
    totals = charts["All types throughput"]
    assert _title(totals) == "All types: 6 enqueued, 2 completed, 1 failed in the last hour"
    assert _title(_buckets(totals)[-1]) == "08:00 — 6 enqueued, 2 completed, 1 failed"
    assert len(_buckets(totals)) == 60
    assert _title(charts["All types depth"]).startswith("All types: 3 pending at the last count")
    assert _title(charts["email throughput"]) == (
        "email: 5 enqueued, 2 completed, 1 failed in the last hour")
    assert _title(charts["pdf throughput"]) == (
        "pdf: 1 enqueued, 0 completed, 0 failed in the last hour")
    assert _title(charts["sync throughput"]).startswith("sync: 0 enqueued")
    said = re.findall(r'</svg><p class="chart-totals">([^<]*)</p>', page.text)
    assert said[:2] == ["6 enqueued, 2 completed, 1 failed in the last hour",
                        "3 pending at the last count (08:00), at most 3 in the last hour"]
    assert said[2:] == ["5 enqueued, 2 completed, 1 failed in the last hour",
                        "1 enqueued, 0 completed, 0 failed in the last hour",
                        "0 enqueued, 0 completed, 0 failed in the last hour"]
    # Each type's chart leads to the type's page.
    assert '<a href="/ui/types/email">email</a>' in page.text
    assert "<script" not in without_live_script(page.text)


def test_the_day_is_charted_by_hour(signed_in: FlaskClient, api: Api, producer: Key,
                                    worker: Key, clock: ManualClock) -> None:
    _traffic(api, producer, worker)
    clock.advance(2 * 3600)  # no longer the last hour's, still the last day's
    charts = _svgs(signed_in.get("/ui/?period=day").text)
    totals = charts["All types throughput"]
    assert _title(totals) == "All types: 6 enqueued, 2 completed, 1 failed in the last 24 hours"
    assert len(_buckets(totals)) == 24
    assert _title(_buckets(totals)[-3]) == "08:00 — 6 enqueued, 2 completed, 1 failed"
    hour = _svgs(signed_in.get("/ui/?period=hour").text)["All types throughput"]
    assert _title(hour).startswith("All types: 0 enqueued")


def test_a_types_page_shows_its_settings_and_its_charts(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key, app: Flask,
        admin: Key, client: FlaskClient) -> None:
    _traffic(api, producer, worker)
    app.extensions["queuelog"].stats.sample_depth()
    client.patch("/types/email", headers=admin.headers, json={"max_running": 5})
    page = signed_in.get("/ui/types/email")
    assert page.status_code == 200
    assert "5 running" in page.text and "2 pending" in page.text
    charts = _svgs(page.text)
    assert set(charts) == {"email throughput", "email failures", "email depth"}
    assert _title(charts["email throughput"]) == (
        "email: 5 enqueued, 2 completed, 1 failed in the last hour")
    assert _title(charts["email failures"]) == "email: 1 failed attempt in the last hour"
    assert _title(charts["email depth"]) == (
        "email: 2 pending at the last count (08:00), at most 2 in the last hour")
    assert _title(_buckets(charts["email failures"])[-1]) == "08:00 — 1 failed"
    # The totals in words under each chart, not only in tooltips.
    totals = re.findall(r'</svg><p class="chart-totals">([^<]*)</p>', page.text)
    assert totals == ["5 enqueued, 2 completed, 1 failed in the last hour",
                      "1 failed attempt in the last hour",
                      "2 pending at the last count (08:00), at most 2 in the last hour"]
    day = _svgs(signed_in.get("/ui/types/email?period=day").text)
    assert _title(day["email throughput"]).endswith("in the last 24 hours")
    # The types page leads here.
    assert '<a href="/ui/types/email">email</a>' in signed_in.get("/ui/types").text


def test_an_unknown_type_or_period_is_the_dashboards_error_page(signed_in: FlaskClient) -> None:
    missing = signed_in.get("/ui/types/nope")
    assert missing.status_code == 404 and 'class="error"' in missing.text
    for page in ("/ui/?period=week", "/ui/types/email?period=", "/ui/?refresh=yes",
                 "/ui/types/email?colour=red", "/ui/jobs?refresh=off", "/ui/jobs?_scheme=x"):
        answer = signed_in.get(page)
        if page.endswith("period="):  # an empty field is left out, as on every page
            assert answer.status_code == 200
            continue
        assert answer.status_code == 400, page
        assert 'class="error"' in answer.text, page
    assert "period: Must be one of: hour, day." in signed_in.get("/ui/?period=week").text


REFRESH = '<meta http-equiv="refresh" content="10">'


@pytest.mark.parametrize("page", ["/ui/", "/ui/types/email", "/ui/jobs"])
def test_auto_refresh_is_opt_in_and_leaves_the_csp_as_it_is(signed_in: FlaskClient,
                                                            page: str) -> None:
    off = signed_in.get(page)
    assert REFRESH not in off.text and ">Auto-refresh: off</a>" in off.text
    on = signed_in.get(f"{page}?refresh=on")
    assert on.status_code == 200 and REFRESH in on.text and ">Auto-refresh: on</a>" in on.text
    assert on.headers["Content-Security-Policy"] == off.headers["Content-Security-Policy"]
    assert on.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert "<script" not in without_live_script(on.text) and "style=" not in on.text


def _link(page: str, label: str) -> str:
    match = re.search(rf'<a href="([^"]+)"[^>]*>{re.escape(label)}</a>', page)
    assert match is not None, label
    return match.group(1).replace("&amp;", "&")


def test_auto_refresh_keeps_the_jobs_pages_filters_and_they_keep_it(
        signed_in: FlaskClient, api: Api, producer: Key) -> None:
    api.enqueue(producer, type="email", payload={})
    filtered = signed_in.get("/ui/jobs?type=email&status=pending&order=oldest").text
    turned_on = _link(filtered, "Auto-refresh: off")
    assert turned_on == "/ui/jobs?type=email&status=pending&order=oldest&refresh=on"
    page = signed_in.get(turned_on).text
    assert REFRESH in page
    # The filters' form carries it on, and the pages' links too.
    start = page.index('<form method="get"')
    form = page[start:page.index("</form>", start)]
    assert '<input type="hidden" name="refresh" value="on">' in form
    assert _link(page, "Auto-refresh: on") == "/ui/jobs?type=email&status=pending&order=oldest"


def test_auto_refresh_and_the_period_keep_each_other(signed_in: FlaskClient) -> None:
    page = signed_in.get("/ui/types/email?period=day").text
    assert _link(page, "Auto-refresh: off") == "/ui/types/email?period=day&refresh=on"
    page = signed_in.get("/ui/types/email?period=day&refresh=on").text
    assert REFRESH in page
    assert _link(page, "last hour") == "/ui/types/email?period=hour&refresh=on"
    assert _link(page, "Auto-refresh: on") == "/ui/types/email?period=day"
    overview = signed_in.get("/ui/?refresh=on").text
    assert _link(overview, "last day") == "/ui/?refresh=on&period=day"
