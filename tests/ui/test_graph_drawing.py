"""The workflow drawing's layout (app/ui/graph_drawing.py): columns by longest dependency
path, few crossings, every arrow pointing right into its dependent, no two boxes on one
another, and no drawing past the cap."""

from __future__ import annotations

import re

from app.ui.graph_drawing import (
    LABEL_CHARS,
    MAX_DRAWN_JOBS,
    MAX_WAYPOINTS,
    NODE_HEIGHT,
    NODE_WIDTH,
    Drawing,
    GraphJob,
    draw,
    label_of,
    layers_of,
    order_layers,
    why_not_drawn,
)


def job(job_id: int, *depends_on: int, ref: str | None = None,
        status: str = "waiting") -> GraphJob:
    return GraphJob(job_id, ref or f"j{job_id}", "email", status, depends_on)


# contract §15's example: charge, then mail and ship, then done.
ORDER = [job(1, status="pending"), job(2, 1), job(3, 1), job(4, 2, 3)]


def _crossings(columns: list[list[int]], jobs: list[GraphJob]) -> int:
    """Crossing arrows between adjacent columns (the pairs whose ends are in opposite
    orders)."""
    row = {job_id: index for column in columns for index, job_id in enumerate(column)}
    layer = {job_id: n for n, column in enumerate(columns) for job_id in column}
    edges = [(row[dep], row[j.id]) for j in jobs for dep in j.depends_on
             if dep in layer and layer[j.id] == layer[dep] + 1]
    return sum(1 for a in edges for b in edges
               if (a[0] - b[0]) * (a[1] - b[1]) < 0) // 2


def _arrow_ends(path: str) -> tuple[tuple[float, float], tuple[float, float]]:
    numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", path)]
    return (numbers[0], numbers[1]), (numbers[-2], numbers[-1])


def test_a_jobs_layer_is_its_longest_dependency_path() -> None:
    assert layers_of(ORDER) == {1: 0, 2: 1, 3: 1, 4: 2}
    # 5 depends on 1 directly and through 4: it comes after 4, not beside 2.
    assert layers_of([*ORDER, job(5, 1, 4)])[5] == 3


def test_the_order_jobs_were_sent_in_does_not_change_their_layers() -> None:
    assert layers_of(list(reversed(ORDER))) == layers_of(ORDER)


def test_dependencies_outside_the_workflow_are_not_drawn() -> None:
    jobs = [job(10, 3), job(11, 10, 99)]  # 3 and 99 are jobs outside this workflow
    assert layers_of(jobs) == {10: 0, 11: 1}
    drawing = draw(jobs)
    assert drawing is not None
    assert [(a.source, a.target) for a in drawing.arrows] == [(10, 11)]


def test_a_cycle_is_drawn_after_the_rest_rather_than_refused() -> None:
    jobs = [job(1), job(2, 3), job(3, 2)]
    assert layers_of(jobs) == {1: 0, 2: 1, 3: 1}
    assert draw(jobs) is not None


def test_a_column_is_ordered_by_the_places_of_its_jobs_dependencies() -> None:
    # Two chains sent crosswise: a1, b1, then b2 (after b1) before a2 (after a1).
    jobs = [job(1, ref="a1"), job(2, ref="b1"), job(3, 2, ref="b2"), job(4, 1, ref="a2")]
    columns = order_layers(jobs, layers_of(jobs))
    assert _crossings([[1, 2], [3, 4]], jobs) == 1  # as sent
    assert _crossings(columns, jobs) == 0
    assert sorted(map(sorted, columns)) == [[1, 2], [3, 4]]


def test_a_wide_fan_keeps_its_rows_in_the_order_they_were_sent() -> None:
    jobs = [job(1), *(job(n, 1) for n in range(2, 12)), job(12, *range(2, 12))]
    columns = order_layers(jobs, layers_of(jobs))
    assert columns == [[1], list(range(2, 12)), [12]]


def test_every_job_has_a_box_and_no_two_boxes_overlap() -> None:
    jobs = [job(n, *(d for d in (n // 2, n // 3) if d >= 1 and d != n)) for n in range(1, 61)]
    drawing = draw(jobs)
    assert isinstance(drawing, Drawing)
    assert [p.job.id for p in drawing.jobs] == list(range(1, 61))
    boxes = [(p.x, p.y) for p in drawing.jobs]
    for index, (x, y) in enumerate(boxes):
        for other_x, other_y in boxes[index + 1:]:
            assert abs(x - other_x) >= NODE_WIDTH or abs(y - other_y) >= NODE_HEIGHT
        assert 0 <= x <= drawing.width - NODE_WIDTH
        assert 0 <= y <= drawing.height - NODE_HEIGHT


def test_every_arrow_runs_from_its_dependencys_right_side_to_its_dependents_left_side(
        ) -> None:
    drawing = draw(ORDER)
    assert drawing is not None
    box = {p.job.id: p for p in drawing.jobs}
    assert sorted((a.source, a.target) for a in drawing.arrows) == [(1, 2), (1, 3), (2, 4),
                                                                    (3, 4)]
    for arrow in drawing.arrows:
        (x1, y1), (x2, y2) = _arrow_ends(arrow.path)
        source, target = box[arrow.source], box[arrow.target]
        assert x1 == source.x + NODE_WIDTH and source.y < y1 < source.y + NODE_HEIGHT
        assert x2 == target.x and target.y < y2 < target.y + NODE_HEIGHT
        assert x2 > x1


def test_arrows_meeting_at_a_box_reach_it_apart_in_the_order_they_come_from() -> None:
    drawing = draw(ORDER)
    assert drawing is not None
    box = {p.job.id: p for p in drawing.jobs}
    into_4 = sorted((box[a.source].y, _arrow_ends(a.path)[1][1]) for a in drawing.arrows
                    if a.target == 4)
    tips = [tip for _source_y, tip in into_4]
    assert len(set(tips)) == 2 and tips == sorted(tips)  # the upper source's arrow above


def test_an_arrow_spanning_columns_runs_between_the_boxes_it_passes() -> None:
    # 5 comes after 4 and after 1, three columns on: 1's arrow passes the columns of 2 and 4.
    jobs = [*ORDER, job(5, 1, 4), job(6, 1), job(7, 6), job(8, 7)]
    drawing = draw(jobs)
    assert drawing is not None
    long = next(a for a in drawing.arrows if (a.source, a.target) == (1, 5))
    lanes = [(float(x), float(y)) for x, y in re.findall(r"L(-?[\d.]+),(-?[\d.]+)", long.path)]
    assert len(lanes) == 2  # one straight piece in each column it passes
    for x, y in lanes:
        column = [p for p in drawing.jobs if p.x + NODE_WIDTH == x]
        assert column and all(not p.y <= y <= p.y + NODE_HEIGHT for p in column)


def test_columns_are_centred_on_one_line() -> None:
    drawing = draw(ORDER)
    assert drawing is not None
    middle = {p.job.id: p.y + NODE_HEIGHT / 2 for p in drawing.jobs}
    assert middle[1] == middle[4] == (middle[2] + middle[3]) / 2


def test_a_long_ref_is_cut_in_its_box_and_whole_in_its_tooltip() -> None:
    ref = "x" * 100
    assert label_of("charge") == "charge"
    assert label_of(ref) == "x" * (LABEL_CHARS - 1) + "…" and len(label_of(ref)) == LABEL_CHARS
    drawing = draw([job(7, ref=ref, status="failed")])
    assert drawing is not None
    assert drawing.jobs[0].title == f"{ref} (job 7, email): failed"


def test_past_the_cap_there_is_no_drawing() -> None:
    chain = [job(1), *(job(n, n - 1) for n in range(2, MAX_DRAWN_JOBS + 1))]
    drawn = draw(chain)
    assert drawn is not None and len(drawn.jobs) == MAX_DRAWN_JOBS
    assert max(p.layer for p in drawn.jobs) == MAX_DRAWN_JOBS - 1
    assert draw([*chain, job(MAX_DRAWN_JOBS + 1)]) is None
    assert why_not_drawn([*chain, job(MAX_DRAWN_JOBS + 1)]) == (
        f"{MAX_DRAWN_JOBS + 1} jobs are more than a readable drawing holds "
        f"(at most {MAX_DRAWN_JOBS}).")


def test_a_graph_whose_arrows_would_cross_too_many_columns_is_not_drawn() -> None:
    # Each job after the 100 before it (the API allows 100 dependencies): 200 such jobs would
    # need some 650,000 waypoints.
    dense = [job(n, *range(max(1, n - 100), n)) for n in range(1, MAX_DRAWN_JOBS + 1)]
    reason = why_not_drawn(dense)
    assert reason is not None and f"at most {MAX_WAYPOINTS}" in reason
    assert draw(dense) is None
    assert why_not_drawn(dense[:20]) is None and draw(dense[:20]) is not None


def test_an_empty_workflow_is_an_empty_drawing() -> None:
    assert draw([]) == Drawing(24, 24, (), ())
