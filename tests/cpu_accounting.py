"""Where the suite's CPU goes, file by file, listed at the end of a run beside pytest's slowest
durations.

On a machine the run keeps busy (scripts/test.sh runs four processes on two cores), a test's
duration says more about what ran beside it than about what it costs: a test that sleeps on a
lease takes a minute and costs nothing, one that boots servers takes as long and holds a core.
What shortens the run is less CPU. Each test's is the CPU time of its pytest process and of
the processes it started and waited for (the servers it stopped, the scripts it ran), from its
setup to its teardown; a session fixture's cost falls on the first test that uses it.
PostgreSQL's backends are not counted: they belong to the server, shared by every process.
"""

from __future__ import annotations

import resource
from collections import Counter
from collections.abc import Generator
from typing import Any

import pytest

PROPERTY = "cpu_seconds"
FILES_LISTED = 20
_STARTED = pytest.StashKey[float]()
_per_file: Counter[str] = Counter()


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_STARTED] = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "teardown" and _STARTED in item.stash:
        report.user_properties.append((PROPERTY, _cpu_seconds() - item.stash[_STARTED]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """In the process that reports (the controller, under pytest-xdist)."""
    if report.when != "teardown":
        return
    for name, value in report.user_properties:
        if name == PROPERTY:
            _per_file[report.nodeid.split("::", 1)[0]] += float(value)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _per_file:
        return
    total = sum(_per_file.values())
    terminalreporter.write_sep(
        "=", f"CPU by file, the {FILES_LISTED} costliest (of {total:.0f} CPU-s in all)")
    for path, seconds in _per_file.most_common(FILES_LISTED):
        terminalreporter.write_line(f"{seconds:8.1f}s {100 * seconds / total:5.1f}%  {path}")
