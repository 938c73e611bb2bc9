"""Graphs of jobs, the pure part: which item of a request depends on which (refs and ids),
the checks a graph must pass (refs unique, no dependency twice, no cycle, in a batch no ref
of a later item), and the status each new job is born with. No SQL, no HTTP.

A dependency is either an existing job's id (an int) or the `ref` of another item of the
same request (a str). POST /jobs is a graph of one item; /jobs/batch items name earlier
items only (a batch is stored in its order); /workflows items may name any item.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from app.core.errors import ValidationFailed
from app.core.statuses import TERMINAL_STATUSES, JobStatus

Ref = int | str


@dataclass(frozen=True, slots=True)
class Dependency:
    """One dependency of an item, resolved: an existing job (`job_id`) or an item of the
    same request (`item`, its position)."""

    job_id: int | None = None
    item: int | None = None


@dataclass(frozen=True, slots=True)
class GraphItem:
    """What an item of a request says of its place in the graph."""

    ref: str | None
    depends_on: tuple[Ref, ...]
    cancel_on_failure: bool


@dataclass(frozen=True, slots=True)
class Birth:
    """The status a new job is stored with, and the dependency that decided a cancel."""

    status: JobStatus
    cancelled_by: Dependency | None = None


def field(prefix: str | None, position: int, name: str) -> str:
    return name if prefix is None else f"{prefix}.{position}.{name}"


def resolve_graph(items: Sequence[GraphItem], *, prefix: str | None,
                  earlier_only: bool) -> list[list[Dependency]]:
    """Each item's dependencies, resolved; ValidationFailed naming the field of every item
    that breaks a rule (a ref given twice, a dependency named twice, a ref no item has, a
    later item in a batch), and for a workflow the refs on a cycle."""
    errors: dict[str, list[str]] = {}
    position_of: dict[str, int] = {}
    for position, item in enumerate(items):
        if item.ref is None:
            continue
        if item.ref in position_of:
            errors[field(prefix, position, "ref")] = [
                f"Ref {item.ref!r} is used by item {position_of[item.ref]} already."]
        else:
            position_of[item.ref] = position
    resolved: list[list[Dependency]] = []
    for position, item in enumerate(items):
        seen: set[Ref] = set()
        deps: list[Dependency] = []
        problems: list[str] = []
        for ref in item.depends_on:
            if ref in seen:
                problems.append(f"{ref!r} is named twice.")
                continue
            seen.add(ref)
            if isinstance(ref, int):
                deps.append(Dependency(job_id=ref))
            elif ref not in position_of:
                problems.append(f"No item has the ref {ref!r}.")
            elif position_of[ref] == position:
                problems.append(f"An item cannot depend on itself ({ref!r}).")
            elif earlier_only and position_of[ref] > position:
                problems.append(f"{ref!r} names a later item; a batch names earlier items "
                                "only (POST /workflows takes any order).")
            else:
                deps.append(Dependency(item=position_of[ref]))
        if problems:
            errors[field(prefix, position, "depends_on")] = problems
        resolved.append(deps)
    if errors:
        raise ValidationFailed("Some refs or dependencies are not valid; nothing was stored.",
                               errors=errors)
    if not earlier_only:
        cycle = find_cycle(resolved)
        if cycle:
            refs = [items[position].ref or str(position) for position in cycle]
            path = " → ".join([*refs, refs[0]])
            raise ValidationFailed(f"The jobs' dependencies form a cycle: {path}.",
                                   errors={prefix or "depends_on": [f"A cycle: {path}."]})
    return resolved


def topological_order(deps: Sequence[Sequence[Dependency]]) -> list[int]:
    """The items' positions, each after the items it depends on (the graph has no cycle)."""
    dependents: dict[int, list[int]] = {}
    waiting = [0] * len(deps)
    for position, item_deps in enumerate(deps):
        for dep in item_deps:
            if dep.item is not None:
                dependents.setdefault(dep.item, []).append(position)
                waiting[position] += 1
    ready = [position for position, count in enumerate(waiting) if count == 0]
    order: list[int] = []
    while ready:
        position = ready.pop()
        order.append(position)
        for dependent in dependents.get(position, ()):
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                ready.append(dependent)
    return order


def dependency_first(deps: Sequence[Sequence[Dependency]],
                     aliases: Mapping[int, int]) -> list[int]:
    """The items' positions in request order, except that each item comes after the items it
    depends on (pulled forward, in their own request order). Stored in this order, a job's
    id is above the ids of everything it waits for, which is what an ordered key needs:
    its turns go in id order, so a turn never falls to a job whose dependency waits behind
    it (docs/WORKFLOWS.md). `aliases`: items that are an earlier item's job (position →
    that item's); the graph, aliases followed, has no cycle."""
    placed: set[int] = set()
    order: list[int] = []
    for start in range(len(deps)):
        # Iterative depth-first: a chain of a thousand items is no recursion limit.
        stack: list[tuple[int, int]] = [(start, 0)]
        while stack:
            position, next_dep = stack.pop()
            if position in placed:
                continue
            item_deps = deps[position]
            while next_dep < len(item_deps):
                dep = item_deps[next_dep]
                next_dep += 1
                if dep.item is None:
                    continue
                target = aliases.get(dep.item, dep.item)
                if target not in placed:
                    stack.append((position, next_dep))
                    stack.append((target, 0))
                    break
            else:
                placed.add(position)
                order.append(position)
    return order


def find_cycle(deps: Sequence[Sequence[Dependency]]) -> list[int]:
    """The positions on one cycle among the items, in dependency order; [] when none."""
    ordered = set(topological_order(deps))
    if len(ordered) == len(deps):
        return []
    # Every item left out of the order is on a cycle or depends on one: following the
    # dependencies among them from any of them must come back to a position seen already.
    start = next(position for position in range(len(deps)) if position not in ordered)
    path: list[int] = []
    index_in_path: dict[int, int] = {}
    position = start
    while position not in index_in_path:
        index_in_path[position] = len(path)
        path.append(position)
        position = next(dep.item for dep in deps[position]
                        if dep.item is not None and dep.item not in ordered)
    return list(reversed(path[index_in_path[position]:]))


def born(statuses: Sequence[tuple[Dependency, str]], cancel_on_failure: bool) -> Birth:
    """The status of a new job whose dependencies are in these statuses now: cancelled when
    one failed or was cancelled and it cancels on failure, waiting while one is unfinished,
    else pending (every dependency finished: applied at once)."""
    if cancel_on_failure:
        for dep, status in statuses:
            if status in (JobStatus.FAILED, JobStatus.CANCELLED):
                return Birth(JobStatus.CANCELLED, dep)
    if any(status not in TERMINAL_STATUSES for _dep, status in statuses):
        return Birth(JobStatus.WAITING)
    return Birth(JobStatus.PENDING)


def due_at_birth(run_at: int, deps: Sequence[Dependency], ended_at: Mapping[int, int]) -> int:
    """When a job born pending because the jobs it names have ended (`ended_at`: each ended
    one's id, its end) is due: no earlier than the last of those ends. The enqueue read its
    clock before it waited for their locks, and one may have ended meanwhile, stamped later;
    a claim must not take the job and record its attempt before a dependency's end (as a
    release never lets it)."""
    return max([run_at, *(ended_at.get(dep.job_id, run_at) for dep in deps
                          if dep.job_id is not None)])


def statuses_at_birth(deps: Sequence[Sequence[Dependency]], items: Sequence[GraphItem],
           existing: Mapping[int, str], fixed: Mapping[int, str],
           aliases: Mapping[int, int]) -> dict[int, Birth]:
    """The birth of each new item, in dependency order: an existing job's status is
    `existing[id]`; an item that met a stored job (a replay, a unique twin) stands for that
    job's status, `fixed[position]`; an item that met an earlier item's new job (`aliases`:
    position → the earlier position) for that item's birth; a new item for its own."""
    # A dependency on an alias is one on the item it met, so that item is decided first.
    deps = [[Dependency(item=aliases[dep.item])
             if dep.item is not None and dep.item in aliases else dep
             for dep in item_deps] for item_deps in deps]
    if find_cycle(deps):
        raise ValidationFailed(
            "Items that name one job (by idempotency or unique key) close a cycle of "
            "dependencies.", errors={"jobs": ["A cycle through items that are one job."]})
    status_of: dict[int, str] = dict(fixed)
    decided: dict[int, Birth] = {}
    for position in topological_order(deps):
        if position in fixed or position in aliases:
            continue
        statuses = [(dep, existing[dep.job_id] if dep.job_id is not None
                     else status_of[dep.item or 0]) for dep in deps[position]]
        birth = born(statuses, items[position].cancel_on_failure)
        decided[position] = birth
        status_of[position] = birth.status.value
    return decided
