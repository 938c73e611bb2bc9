"""The dashboard's charts of the queue over time (docs/OPERATIONS.md): a stats Series as inline SVG,
drawn here on the server so that the pages need no script and the CSP stays as strict as it is.

Each chart says what it shows in words as well as in shapes: the whole chart's <title> and
aria-label sum it up ("email: 120 enqueued, 118 completed, 2 failed in the last hour"), the
page shows its totals as text beside it (`chart_totals`), and each bucket is a group whose
<title> says its values ("14:03 — 12 enqueued, 11 completed, 1 failed"): the browser's
tooltip, a screen reader's name, what the tests read.

Every value is drawn across its own bucket's width, where it happened: counts as bars, and
the enqueued jobs and the pending depth as steps (a level held over the bucket's span), not
as lines between the buckets' centres, which drew a burst in one bucket as a hairline spike
leaning into the bucket before it. The value axis is scaled to a round number above the
busiest bucket, with a label at each of a few round ticks (0, 50, 100, 150).
Colours are presentation attributes (fill=, stroke=): the CSP allows no style attribute, and
presentation attributes are no style. Every text is escaped (Markup.format), type names included.
Output depends on the series alone: the same series draws the same bytes.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from markupsafe import Markup

from app.core.clock import to_rfc3339
from app.stats.models import Bucket, Series, Step


class Period(enum.StrEnum):
    """The span the dashboard's charts show, as ?period= names it."""

    HOUR = "hour"
    DAY = "day"


# Each period's bucket width and number of buckets: the last hour by minute, the last day by
# hour.
PERIODS: dict[Period, tuple[Step, int]] = {Period.HOUR: (Step.MINUTE, 60),
                                           Period.DAY: (Step.HOUR, 24)}


def window(period: Period, now_us: int) -> tuple[int, int, Step]:
    """The period's time span ending with the bucket that holds `now_us` (so that the
    current, unfinished minute or hour is the last bar): (start_us, end_us, step), end
    exclusive, both on bucket boundaries."""
    step, count = PERIODS[period]
    end_us = (now_us // step.micros + 1) * step.micros
    return end_us - count * step.micros, end_us, step


@dataclass(frozen=True, slots=True)
class Size:
    width: int
    height: int


# The overview's totals and a type's own charts; the overview's chart of each type (small).
LARGE = Size(540, 180)
SMALL = Size(340, 110)
# Room around the plot: the value axis' labels on the left, the legend above, the times below.
LEFT, RIGHT, TOP, BOTTOM = 44, 10, 24, 20
# A bar takes this share of its bucket's width; the rest is the gap between bars.
BAR_SHARE = 0.7
MIN_BAR = 1.0
# About how many steps the value axis is cut into (ticks()): a large chart's, a small one's.
TICKS, SMALL_TICKS = 4, 2
# A large chart's time axis is labelled at its start, its end and between them, in quarters.
TIME_TICKS = 4

# The stylesheet's colours (ui.css :root): enqueued in the accent, completed ok, failed bad.
ENQUEUED, COMPLETED, FAILED, PENDING = "#2457c5", "#1e7b34", "#b3261e", "#8a5a00"
AXIS, GRID = "#5b6475", "#d7dbe3"
FONT = "system-ui, -apple-system, Segoe UI, sans-serif"


def throughput_chart(series: Series, *, small: bool = False) -> Markup:
    """Jobs enqueued (steps over a light area), completed and failed (bars, the failed
    stacked on top in red) per bucket."""
    summary = f"{_who(series)}: {chart_totals(series, 'throughput')}"
    top = max((max(b.enqueued, b.completed + b.failed) for b in series.buckets), default=0)
    plot = _Plot(_size(small), len(series.buckets), top)

    def bars(position: int, bucket: Bucket) -> list[Markup]:
        return plot.stack(position, ((bucket.completed, COMPLETED, "completed"),
                                     (bucket.failed, FAILED, "failed")))

    enqueued = [(i, b.enqueued) for i, b in enumerate(series.buckets)]
    return _chart("throughput", series, plot, summary,
                  legend=(("enqueued", ENQUEUED), ("completed", COMPLETED), ("failed", FAILED)),
                  said=lambda b: (f"{b.enqueued} enqueued, {b.completed} completed, "
                                  f"{b.failed} failed"),
                  bars=bars, under=plot.steps(enqueued, ENQUEUED, "enqueued", area=True,
                                              line=False),
                  over=plot.steps(enqueued, ENQUEUED, "enqueued"))


def failures_chart(series: Series, *, small: bool = False) -> Markup:
    """Attempts that failed per bucket (retried or not)."""
    summary = f"{_who(series)}: {chart_totals(series, 'failures')}"
    plot = _Plot(_size(small), len(series.buckets),
                 max((b.failed for b in series.buckets), default=0))
    return _chart("failures", series, plot, summary, legend=(("failed attempts", FAILED),),
                  said=lambda b: f"{b.failed} failed",
                  bars=lambda i, b: plot.stack(i, ((b.failed, FAILED, "failed"),)))


def depth_chart(series: Series, *, small: bool = False) -> Markup:
    """The pending jobs at each bucket's end, as a line; a bucket without a count is a gap in
    it (the line is not drawn through a value nobody took)."""
    counted = [b.pending for b in series.buckets if b.pending is not None]
    summary = f"{_who(series)}: {chart_totals(series, 'depth')}"
    plot = _Plot(_size(small), len(series.buckets), max(counted, default=0))
    return _chart("depth", series, plot, summary, legend=(("pending", PENDING),),
                  said=lambda b: "no count" if b.pending is None else f"{b.pending} pending",
                  over=Markup("").join(plot.steps(run, PENDING, "pending", area=True)
                                       for run in _runs(series.buckets)))


def chart_totals(series: Series, kind: str) -> str:
    """What a chart of `kind` (throughput, failures, depth) sums up, in words, as the page
    shows it beside the chart: `120 enqueued, 118 completed, 2 failed in the last hour`."""
    buckets = series.buckets
    if kind == "throughput":
        return (f"{sum(b.enqueued for b in buckets):,} enqueued, "
                f"{sum(b.completed for b in buckets):,} completed, "
                f"{sum(b.failed for b in buckets):,} failed {_span(series)}")
    if kind == "failures":
        total = sum(b.failed for b in buckets)
        return f"{total:,} failed attempt{_s(total)} {_span(series)}"
    counted = [(b.at_us, b.pending) for b in buckets if b.pending is not None]
    if not counted:
        return f"no count of pending jobs {_span(series)}"
    at, last = counted[-1]
    return (f"{last:,} pending at the last count ({_time(at)}), at most "
            f"{max(p for _, p in counted):,} {_span(series)}")


def _size(small: bool) -> Size:
    return SMALL if small else LARGE


def _runs(buckets: Sequence[Bucket]) -> list[list[tuple[int, int]]]:
    """The depth's stretches of consecutive counted buckets: (position, pending) each."""
    runs: list[list[tuple[int, int]]] = []
    previous = None
    for position, bucket in enumerate(buckets):
        if bucket.pending is None:
            continue
        if previous != position - 1:
            runs.append([])
        runs[-1].append((position, bucket.pending))
        previous = position
    return runs


def ticks(busiest: int, steps: int = TICKS) -> list[int]:
    """The value axis' labelled values for a chart whose busiest bucket is `busiest`: 0 and
    a few round steps (1, 2 or 5 times a power of ten) up to the first at or above it, the
    last of which is the top of the scale. `[0]` alone when every value is 0."""
    if busiest <= 0:
        return [0]
    rough = busiest / steps
    power = 10 ** max(0, len(str(int(rough))) - 1)
    step = next(factor * power for factor in (1, 2, 5, 10) if factor * power >= rough)
    top = -(-busiest // step) * step
    return list(range(0, top + 1, step))


def tick_label(value: int) -> str:
    """A tick's value, short enough for the axis' margin: `950`, `2,500`, `15k`, `1.5M`."""
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 10_000:
        return f"{value / 1000:g}k"
    return f"{value:,}"


class _Plot:
    """Where values go: `count` buckets side by side, 0 at the bottom, the top of the scale
    (`ticks(busiest)`'s last, a round number at or above the busiest value) at the top."""

    def __init__(self, size: Size, count: int, busiest: int) -> None:
        self.ticks = ticks(busiest, SMALL_TICKS if size.height < LARGE.height else TICKS)
        self.size, self.count, self.top = size, count, self.ticks[-1]
        self.x0, self.y0 = LEFT, TOP
        self.width = size.width - LEFT - RIGHT
        self.height = size.height - TOP - BOTTOM
        self.base = self.y0 + self.height
        self.slot = self.width / count if count else 0.0

    def height_of(self, value: int) -> float:
        return value * self.height / self.top if self.top else 0.0

    def bar_height(self, value: int) -> float:
        """A value's bar: at least a pixel, so that one failure beside a thousand completions
        is still there to see."""
        return max(MIN_BAR, self.height_of(value))

    def stack(self, position: int, parts: Sequence[tuple[int, str, str]]) -> list[Markup]:
        """A bucket's bar: each nonzero part on the one before, from the bottom up."""
        width = self.slot * BAR_SHARE
        x = self.x0 + position * self.slot + (self.slot - width) / 2
        drawn, bottom = [], float(self.base)
        for value, colour, name in parts:
            if not value:
                continue
            height = self.bar_height(value)
            bottom -= height
            drawn.append(Markup('<rect class="{}" x="{}" y="{}" width="{}" height="{}" '
                                'fill="{}" data-value="{}"/>').format(
                name, _n(x), _n(bottom), _n(width), _n(height), colour, value))
        return drawn

    def steps(self, points: Sequence[tuple[int, int]], colour: str, name: str,
              area: bool = False, line: bool = True) -> Markup:
        """Consecutive buckets' values as steps: each value a level held across its own
        bucket's width, joined at the buckets' edges (a lone bucket, a level as wide as the
        bucket); with `area`, the space under them filled, lightly, so that a burst in one
        bucket is a bar as wide as the bucket (`line=False`: the area alone, to draw under
        the bars while the line goes over them). A nonzero level is at least MIN_BAR high."""
        if not points:
            return Markup("")
        left = self.x0 + points[0][0] * self.slot
        path = [f"M{_n(left)},{_n(self.level(points[0][1]))}"]
        for position, value in points:
            path.append(f"V{_n(self.level(value))} H{_n(self.x0 + (position + 1) * self.slot)}")
        drawn = " ".join(path)
        parts = []
        if area:
            parts.append(Markup('<path class="{}-area" d="{} V{} H{} Z" fill="{}" '
                                'fill-opacity="0.2" stroke="none" pointer-events="none"/>'
                                ).format(name, drawn, _n(self.base), _n(left), colour))
        if line:
            parts.append(Markup('<path class="{}" d="{}" fill="none" stroke="{}" '
                                'stroke-width="2" stroke-linejoin="round" '
                                'pointer-events="none"/>').format(name, drawn, colour))
        return Markup("").join(parts)

    def level(self, value: int) -> float:
        """Where a step of `value` is drawn: its height, a nonzero one at least MIN_BAR."""
        return self.base - (self.bar_height(value) if value else 0.0)

    def hit(self, position: int) -> Markup:
        """The bucket's whole column, invisible, so that pointing anywhere in it shows its
        tooltip (not only at a bar's few pixels)."""
        return Markup('<rect class="hit" x="{}" y="{}" width="{}" height="{}" fill="#000" '
                      'fill-opacity="0"/>').format(
            _n(self.x0 + position * self.slot), _n(self.y0), _n(self.slot), _n(self.height))


_NOTHING = Markup("")


def _chart(kind: str, series: Series, plot: _Plot, summary: str,
           legend: Sequence[tuple[str, str]], said: Callable[[Bucket], str],
           bars: Callable[[int, Bucket], list[Markup]] | None = None,
           under: Markup = _NOTHING, over: Markup = _NOTHING) -> Markup:
    size = plot.size
    parts = [Markup("<title>{}</title>").format(summary), _legend(legend),
             _axes(series, plot), under]
    if not series.buckets:
        parts.append(Markup('<text x="{}" y="{}" text-anchor="middle" fill="{}">No data</text>')
                     .format(_n(plot.x0 + plot.width / 2), _n(plot.y0 + plot.height / 2), AXIS))
    for position, bucket in enumerate(series.buckets):
        inside = Markup("").join(bars(position, bucket) if bars else [])
        parts.append(Markup('<g class="bucket" role="img" data-at="{}"><title>{} — {}</title>'
                            '{}{}</g>').format(
            to_rfc3339(bucket.at_us), _time(bucket.at_us),
            said(bucket), inside, plot.hit(position)))
    parts.append(over)
    return Markup('<svg xmlns="http://www.w3.org/2000/svg" class="chart chart-{}" '
                  'width="{}" height="{}" viewBox="0 0 {} {}" aria-label="{}" '
                  'font-family="{}" font-size="11">{}</svg>').format(
        kind, size.width, size.height, size.width, size.height, summary, FONT,
        Markup("").join(parts))


def _legend(entries: Sequence[tuple[str, str]]) -> Markup:
    """Swatches and names along the top, each as wide as its name needs (roughly)."""
    drawn, x = [], LEFT
    for name, colour in entries:
        drawn.append(Markup('<rect x="{}" y="7" width="10" height="10" fill="{}"/>'
                            '<text x="{}" y="16" fill="{}">{}</text>').format(
            x, colour, x + 14, AXIS, name))
        x += 14 + 7 * len(name) + 12
    return Markup('<g class="legend" aria-hidden="true">{}</g>').format(Markup("").join(drawn))


def _axes(series: Series, plot: _Plot) -> Markup:
    """The baseline, a grid line at each tick above it and each tick's value (the top one,
    the scale's, of class `max`; 0 alone when every value is 0), the span's first and last
    moments."""
    right = plot.x0 + plot.width
    parts = [Markup('<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}"/>').format(
                 plot.x0, _n(plot.base), right, _n(plot.base), AXIS)]
    for value in plot.ticks:
        y = plot.base - plot.height_of(value)
        if value:
            parts.append(Markup('<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}" '
                                'stroke-dasharray="3 3"/>').format(plot.x0, _n(y), right,
                                                                  _n(y), GRID))
        parts.append(Markup('<text class="{}" x="{}" y="{}" text-anchor="end" fill="{}">{}'
                            '</text>').format(
            "max" if value and value == plot.top else "tick", plot.x0 - 4, _n(y + 4), AXIS,
            tick_label(value)))
    if series.buckets:
        first = series.buckets[0].at_us
        end = series.buckets[-1].at_us + series.step.micros
        wide = series.step is Step.HOUR
        below = plot.size.height - 5
        parts.append(Markup('<text class="start" x="{}" y="{}" fill="{}">{} UTC</text>').format(
            plot.x0, below, AXIS, _time(first, with_date=wide)))
        parts.append(Markup('<text class="end" x="{}" y="{}" text-anchor="end" fill="{}">{} UTC'
                            '</text>').format(
            right, below, AXIS, _time(end, with_date=wide)))
        if plot.size.width >= LARGE.width and len(series.buckets) >= TIME_TICKS:
            # A large chart's quarters too (`08:15`; the middle alone beside the day's wider
            # start and end), each over a mark on the baseline, so that a bar's time reads
            # off the axis and not only from its tooltip.
            count = len(series.buckets)
            for quarter in ((TIME_TICKS // 2,) if wide else range(1, TIME_TICKS)):
                position = quarter * count // TIME_TICKS
                x = _n(plot.x0 + position * plot.slot)
                parts.append(Markup('<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}"/>'
                                    '<text class="time" x="{}" y="{}" text-anchor="middle" '
                                    'fill="{}">{}</text>').format(
                    x, _n(plot.base), x, _n(plot.base + 4), AXIS, x, below, AXIS,
                    _time(series.buckets[position].at_us)))
    return Markup('<g class="axes" aria-hidden="true">{}</g>').format(Markup("").join(parts))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _time(at_us: int, with_date: bool = False) -> str:
    """A moment as its minute (`14:03`), with its day first when asked (`2027-01-15 14:03`)."""
    moment = _EPOCH + timedelta(microseconds=at_us)
    return moment.strftime("%Y-%m-%d %H:%M" if with_date else "%H:%M")


def _who(series: Series) -> str:
    return series.job_type if series.job_type is not None else "All types"


def _span(series: Series) -> str:
    """`in the last hour`, `in the last 24 hours`: the series' buckets, counted in its step."""
    count = len(series.buckets)
    unit = "minute" if series.step is Step.MINUTE else "hour"
    if series.step is Step.MINUTE and count == 60:
        return "in the last hour"
    return f"in the last {unit}" if count == 1 else f"in the last {count} {unit}s"


def _s(count: int) -> str:
    return "" if count == 1 else "s"


def _n(value: float) -> str:
    """A coordinate to two decimals, without trailing zeros: `12.5`, `40`."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text
