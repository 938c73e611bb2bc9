"""What a benchmark script prints: its options, its tables and targets, and the report it
hands to run_all.py."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def parse_options(description: str, argv: Sequence[str] | None = None,
                  default_repeats: int = 3,
                  add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
                  ) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    if add_arguments is not None:  # a script's own options
        add_arguments(parser)
    parser.add_argument("--smoke", action="store_true",
                        help="a few hundred jobs, one repeat: checks the script still runs")
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"times each figure is measured (default {default_repeats}, "
                             "1 with --smoke)")
    parser.add_argument("--report", type=Path, default=None,
                        help="also write the report as JSON here (run_all.py reads it)")
    options = parser.parse_args(argv)
    if options.repeats is None:
        options.repeats = 1 if options.smoke else default_repeats
    if options.repeats < 1:
        parser.error("--repeats must be at least 1")
    return options


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def add(self, *cells: Any) -> None:
        self.rows.append([str(cell) for cell in cells])

    def markdown(self) -> str:
        lines = [f"**{self.title}**", "", "| " + " | ".join(self.columns) + " |",
                 "|" + "|".join("---" for _ in self.columns) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines)

    def text(self) -> str:
        widths = [max(len(column), *(len(row[i]) for row in self.rows))
                  for i, column in enumerate(self.columns)]
        def line(cells: Sequence[str]) -> str:
            return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
        out = [self.title, line(self.columns), line(["-" * w for w in widths])]
        out += [line(row) for row in self.rows]
        return "\n".join(out)


@dataclass
class Target:
    name: str
    goal: str
    measured: str
    met: bool

    @property
    def verdict(self) -> str:
        return "met" if self.met else "NOT met"


@dataclass
class Report:
    """One script's section of RESULTS.md: what it measured, how, and against which goals."""

    title: str
    command: str
    smoke: bool
    repeats: int
    tables: list[Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def targets_table(self) -> Table:
        table = Table("Targets", ["target", "goal", "measured: median [min-max]", "verdict"])
        for target in self.targets:
            table.add(target.name, target.goal, target.measured, target.verdict)
        return table

    def markdown(self) -> str:
        parts = [f"## {self.title}", "",
                 f"`{self.command}` — {self.repeats} repeat(s)"
                 f"{', smoke sizes' if self.smoke else ''}, {self.seconds:.0f} s.", ""]
        for table in self.tables:
            parts += [table.markdown(), ""]
        if self.targets:
            parts += [self.targets_table().markdown(), ""]
        parts += [f"- {note}" for note in self.notes]
        return "\n".join(parts).rstrip() + "\n"

    def text(self) -> str:
        parts = [f"== {self.title} ({self.repeats} repeat(s){', smoke' if self.smoke else ''},"
                 f" {self.seconds:.0f} s)"]
        parts += [table.text() for table in self.tables]
        if self.targets:
            parts.append(self.targets_table().text())
        if self.notes:
            parts.append("\n".join(f"* {note}" for note in self.notes))
        return "\n\n".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "markdown": self.markdown(),
                "targets": [target.__dict__ | {"verdict": target.verdict}
                            for target in self.targets]}


def run_script(measure: Callable[[argparse.Namespace], Report], doc: str | None,
               argv: Sequence[str] | None = None,
               add_arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    """A benchmark script's main: its options (and its own, `add_arguments`), its
    measurements, its printed report."""
    options = parse_options((doc or "").splitlines()[0], argv, add_arguments=add_arguments)
    started = time.monotonic()
    finish(measure(options), options, started)


def finish(report: Report, options: argparse.Namespace, started: float) -> None:
    """Print the report and, when asked, write it for run_all.py."""
    report.seconds = time.monotonic() - started
    print(report.text(), flush=True)
    if options.report is not None:
        options.report.write_text(json.dumps(report.to_json(), indent=1))


def load_note(load: tuple[float, float, float], where: str = "a shared 2-core machine") -> str:
    """The report's note of the machine's load average when the measuring began
    (os.getloadavg()): the figures' ranges read against it."""
    return (f"Load average at the start (1, 5, 15 min): {load[0]:.2f}, {load[1]:.2f}, "
            f"{load[2]:.2f} ({where}).")
