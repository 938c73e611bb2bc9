"""Where a workflow page draws each job and each dependency: a layered layout, left to right.

A job's layer (its column) is its longest dependency path within the workflow, so that every
arrow points right; within a column the jobs are ordered to cross few arrows, by the mean
position of the jobs they are linked to (the barycenter heuristic, a few sweeps both ways);
an arrow that spans columns runs along a lane of its own between the boxes of each column it
passes (Sugiyama's dummy nodes).
Pure geometry: no Flask, no markup. The template (ui/_workflow_graph.html) turns a Drawing
into SVG with Jinja's autoescaping, so that a producer's refs are never markup there either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

# A drawing past this many jobs is no longer readable on a page: the table alone shows them.
MAX_DRAWN_JOBS = 200
# Nor past this many waypoints (an arrow's passage through a column): a dense graph (each job
# after the hundred before it) would have hundreds of thousands, and take seconds to lay out.
MAX_WAYPOINTS = 2000

NODE_WIDTH = 184
NODE_HEIGHT = 46
COLUMN_GAP = 76  # room for the arrows between two columns
ROW_GAP = 14
# An arrow passing a column runs along a lane this high between its boxes.
WAYPOINT_HEIGHT = 6
# Arrows leaving or reaching one side of a box are this far apart (closer when many), and
# this far from its corners at least.
PORT_GAP = 11
PORT_MARGIN = 8
MARGIN = 12
# A ref longer than this is cut (with "…") in its box; the box's tooltip has all of it.
LABEL_CHARS = 22
# Sweeps of the barycenter ordering (each: forward by dependencies, back by dependents).
_SWEEPS = 3


@dataclass(frozen=True, slots=True)
class GraphJob:
    """A job as the drawing needs it; `depends_on` may name jobs outside the workflow (they
    are not drawn)."""

    id: int
    ref: str
    type: str | None  # None: retention removed it
    status: str
    depends_on: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PlacedJob:
    """A job's box: its top left corner, its column and its place in that column."""

    job: GraphJob
    layer: int
    row: int
    x: float
    y: float
    label: str  # the ref as it fits in the box

    @property
    def title(self) -> str:
        kind = "" if self.job.type is None else f", {self.job.type}"
        return f"{self.job.ref} (job {self.job.id}{kind}): {self.job.status}"


@dataclass(frozen=True, slots=True)
class Arrow:
    """A dependency: from the dependency's box to the dependent's, as an SVG path."""

    source: int
    target: int
    path: str


@dataclass(frozen=True, slots=True)
class Drawing:
    width: float
    height: float
    jobs: tuple[PlacedJob, ...]
    arrows: tuple[Arrow, ...]


def layers_of(jobs: Sequence[GraphJob]) -> dict[int, int]:
    """Each job's layer: 0 for a job that depends on no job of the workflow, else one more
    than its furthest dependency's. A cycle cannot be stored (the API refuses one); should
    one be given, its jobs are put after all the others rather than refused."""
    known = {job.id for job in jobs}
    inside = {job.id: [dep for dep in dict.fromkeys(job.depends_on) if dep in known]
              for job in jobs}
    dependents: dict[int, list[int]] = {job.id: [] for job in jobs}
    for job_id, deps in inside.items():
        for dep in deps:
            dependents[dep].append(job_id)
    # Kahn's order: a job is placed once each of its dependencies is.
    missing = {job_id: len(deps) for job_id, deps in inside.items()}
    ready = [job.id for job in jobs if missing[job.id] == 0]
    layer: dict[int, int] = {}
    while ready:
        job_id = ready.pop()
        layer[job_id] = max((layer[dep] + 1 for dep in inside[job_id]), default=0)
        for follower in dependents[job_id]:
            missing[follower] -= 1
            if missing[follower] == 0:
                ready.append(follower)
    after = max(layer.values(), default=-1) + 1
    for job in jobs:
        layer.setdefault(job.id, after)
    return layer


def order_layers(jobs: Sequence[GraphJob], layer: dict[int, int]) -> list[list[int]]:
    """The jobs' ids column by column, each column ordered to cross few arrows: the first
    column in the order given, then each job by the mean place of what it is linked to.

    An arrow that spans columns gets a waypoint in each column it passes (a negative id,
    see waypoints_of), placed like a job, so that it runs between the boxes, not across
    them."""
    columns, links = _columns_with_waypoints(jobs, layer)
    given = {job_id: index for index, job_id in enumerate(
        job_id for column in columns for job_id in column)}
    linked_before: dict[int, list[int]] = {job_id: [] for job_id in given}
    linked_after: dict[int, list[int]] = {job_id: [] for job_id in given}
    for source, target in links:
        linked_before[target].append(source)
        linked_after[source].append(target)

    def centred(column: list[int]) -> dict[int, float]:
        # Columns are drawn centred on one line, so a place is measured from the middle.
        middle = (len(column) - 1) / 2
        return {job_id: row - middle for row, job_id in enumerate(column)}

    def reorder(column: list[int], linked: dict[int, list[int]],
                place: dict[int, float]) -> list[int]:
        def key(job_id: int) -> tuple[float, int]:
            seen = [place[other] for other in linked[job_id] if other in place]
            # A job linked to nothing placed yet keeps its place among the others.
            here = sum(seen) / len(seen) if seen else place.get(job_id, 0.0)
            return here, given[job_id]
        return sorted(column, key=key)

    for _ in range(_SWEEPS):
        place: dict[int, float] = {}
        for index, column in enumerate(columns):
            if index > 0:
                columns[index] = reorder(column, linked_before, place | centred(column))
            place |= centred(columns[index])
        for index in range(len(columns) - 2, -1, -1):
            following = centred(columns[index + 1])
            columns[index] = reorder(columns[index], linked_after,
                                     following | centred(columns[index]))
    return columns


def waypoints_of(jobs: Sequence[GraphJob], layer: dict[int, int]
                 ) -> dict[tuple[int, int], list[int]]:
    """The waypoints of each arrow (dependency, dependent) that spans columns, in the order
    it passes them: negative ids, numbered in the order the jobs and their depends_on
    come."""
    found: dict[tuple[int, int], list[int]] = {}
    next_id = -1
    for job in jobs:
        for dep in dict.fromkeys(job.depends_on):
            if dep not in layer or job.id == dep:
                continue
            span = range(layer[dep] + 1, layer[job.id])
            found[dep, job.id] = list(range(next_id, next_id - len(span), -1))
            next_id -= len(span)
    return found


def _columns_with_waypoints(jobs: Sequence[GraphJob], layer: dict[int, int]
                            ) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """Each column's jobs in the order given then its waypoints, and every link between
    adjacent columns (an arrow's pieces)."""
    columns: list[list[int]] = [[] for _ in range(max(layer.values(), default=-1) + 1)]
    for job in jobs:
        columns[layer[job.id]].append(job.id)
    links: list[tuple[int, int]] = []
    for (dep, target), points in waypoints_of(jobs, layer).items():
        for offset, point in enumerate(points):
            columns[layer[dep] + 1 + offset].append(point)
        chain = [dep, *points, target]
        links.extend(pairwise(chain))
    return columns, links


def label_of(ref: str) -> str:
    return ref if len(ref) <= LABEL_CHARS else ref[:LABEL_CHARS - 1] + "…"


def why_not_drawn(jobs: Sequence[GraphJob]) -> str | None:
    """Why these jobs are too many to draw readably, or None when they are not."""
    if len(jobs) > MAX_DRAWN_JOBS:
        return (f"{len(jobs)} jobs are more than a readable drawing holds "
                f"(at most {MAX_DRAWN_JOBS}).")
    layer = layers_of(jobs)
    passages = sum(max(layer[job.id] - layer[dep] - 1, 0)
                   for job in jobs for dep in dict.fromkeys(job.depends_on) if dep in layer)
    if passages > MAX_WAYPOINTS:
        return (f"its dependencies cross columns {passages} times, more than a readable "
                f"drawing holds (at most {MAX_WAYPOINTS}).")
    return None


def draw(jobs: Sequence[GraphJob]) -> Drawing | None:
    """The workflow's drawing, or None when why_not_drawn says it is too big."""
    if why_not_drawn(jobs) is not None:
        return None
    layer = layers_of(jobs)
    columns = order_layers(jobs, layer)
    # Each column's items from the top: a box, or a waypoint's narrower lane.
    def height(item: int) -> float:
        return (NODE_HEIGHT if item > 0 else WAYPOINT_HEIGHT) + ROW_GAP

    totals = [sum(height(item) for item in column) - ROW_GAP for column in columns]
    tallest = max(totals, default=0)
    step_x = NODE_WIDTH + COLUMN_GAP
    by_id = {job.id: job for job in jobs}
    placed: dict[int, PlacedJob] = {}
    lane: dict[int, float] = {}  # a waypoint's y
    for index, column in enumerate(columns):
        top = MARGIN + (tallest - totals[index]) / 2
        for row, item in enumerate(column):
            if item > 0:
                placed[item] = PlacedJob(by_id[item], index, row, MARGIN + index * step_x,
                                         top, label_of(by_id[item].ref))
            else:
                lane[item] = top + WAYPOINT_HEIGHT / 2
            top += height(item)
    routes = waypoints_of(jobs, layer)
    ends = _ports(placed, lane, routes)
    arrows = tuple(_arrow(placed[dep], placed[target], points, lane, ends[dep, target])
                   for (dep, target), points in routes.items())
    width = 2 * MARGIN + max(len(columns) * step_x - COLUMN_GAP, 0)
    return Drawing(width, 2 * MARGIN + tallest, tuple(placed[job.id] for job in jobs), arrows)


def _ports(placed: dict[int, PlacedJob], lane: dict[int, float],
           routes: dict[tuple[int, int], list[int]]
           ) -> dict[tuple[int, int], tuple[float, float]]:
    """Where each arrow leaves its dependency's right side and reaches its dependent's left
    side (their y): spread over the side in the order of what is at the other end, so that
    arrowheads do not land on one another and arrows do not cross at a box."""
    def y_of(item: int) -> float:
        return lane[item] if item < 0 else placed[item].y + NODE_HEIGHT / 2

    leaving: dict[int, list[tuple[float, tuple[int, int]]]] = {}
    arriving: dict[int, list[tuple[float, tuple[int, int]]]] = {}
    for (dep, target), points in routes.items():
        first, last = (points[0], points[-1]) if points else (target, dep)
        leaving.setdefault(dep, []).append((y_of(first), (dep, target)))
        arriving.setdefault(target, []).append((y_of(last), (dep, target)))

    def spread(ends: dict[int, list[tuple[float, tuple[int, int]]]]
               ) -> dict[tuple[int, int], float]:
        at: dict[tuple[int, int], float] = {}
        for item, arrows in ends.items():
            arrows.sort()
            gap = min(PORT_GAP, (NODE_HEIGHT - 2 * PORT_MARGIN) / max(len(arrows) - 1, 1))
            middle = placed[item].y + NODE_HEIGHT / 2
            for index, (_y, arrow) in enumerate(arrows):
                at[arrow] = middle + (index - (len(arrows) - 1) / 2) * gap
        return at

    out, into = spread(leaving), spread(arriving)
    return {arrow: (out[arrow], into[arrow]) for arrow in routes}


def _arrow(source: PlacedJob, target: PlacedJob, points: list[int], lane: dict[int, float],
           ends: tuple[float, float]) -> Arrow:
    """A curve from the dependency's right side to the dependent's left side (the
    arrowhead's tip lands on it), straight along its lane through each column it passes."""
    x, y = source.x + NODE_WIDTH, ends[0]
    path = [f"M{x:g},{y:g}"]
    for column, point in enumerate(points, start=source.layer + 1):
        left = MARGIN + column * (NODE_WIDTH + COLUMN_GAP)
        path.append(_curve(x, y, left, lane[point]))
        x, y = left + NODE_WIDTH, lane[point]
        path.append(f"L{x:g},{y:g}")
    path.append(_curve(x, y, target.x, ends[1]))
    return Arrow(source.job.id, target.job.id, " ".join(path))


def _curve(x1: float, y1: float, x2: float, y2: float) -> str:
    bend = (x2 - x1) / 2
    return f"C{x1 + bend:g},{y1:g} {x2 - bend:g},{y2:g} {x2:g},{y2:g}"
