"""Run every benchmark, each in its own process, and write bench/RESULTS.md: the machine
notes, every target with its verdict, and each script's tables.

    PYTHONPATH=. python bench/run_all.py [--smoke] [--repeats N] [--only storage,depth]
                                         [--output PATH]

`make bench` runs it. With --smoke and no --output it prints the document instead of
replacing RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/run_all.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import ROOT
from bench.machine import machine_notes

BENCH = Path(__file__).resolve().parent
# Cheapest first: a broken environment shows before the long runs.
SCRIPTS = ["costs", "storage", "depth", "http_single", "http_events", "http_batch",
           "await_latency", "peers", "peer_servers", "pgboss", "memory", "flow", "workflows",
           "keys", "heartbeat", "reserve", "enqueue_options", "retention", "failures", "tags",
           "over_time", "dashboard", "push", "backlog", "bloat", "long_transaction", "wakes",
           "waits", "protection"]


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run every benchmark; write RESULTS.md.")
    parser.add_argument("--smoke", action="store_true", help="smoke sizes, one repeat")
    parser.add_argument("--repeats", type=int, default=None, help="passed to every script")
    parser.add_argument("--only", default=",".join(SCRIPTS),
                        help=f"comma-separated subset of {', '.join(SCRIPTS)}")
    parser.add_argument("--output", type=Path, default=None,
                        help="where to write the results (default bench/RESULTS.md; "
                             "with --smoke, standard output)")
    options = parser.parse_args(argv)
    options.only = [name.strip() for name in options.only.split(",") if name.strip()]
    unknown = set(options.only) - set(SCRIPTS)
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    if options.output is None and not options.smoke:
        options.output = BENCH / "RESULTS.md"
    return options


def run_script(name: str, options: argparse.Namespace, directory: str) -> dict | None:
    report_path = Path(directory) / f"{name}.json"
    argv = [sys.executable, str(BENCH / f"{name}.py"), "--report", str(report_path)]
    if options.smoke:
        argv.append("--smoke")
    if options.repeats is not None:
        argv += ["--repeats", str(options.repeats)]
    print(f"\n### {name}: {' '.join(argv[1:])}", flush=True)
    status = subprocess.run(argv, cwd=ROOT, check=False).returncode
    if status != 0 or not report_path.exists():
        return None
    return json.loads(report_path.read_text())


def document(reports: dict[str, dict | None], notes: list[tuple[str, str]],
             options: argparse.Namespace, seconds: float) -> str:
    lines = [
        "# queuelog benchmarks",
        "",
        f"Written by `python bench/run_all.py{' --smoke' if options.smoke else ''}` "
        f"(`make bench`) on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC in {seconds / 60:.0f} "
        "minutes. Every figure is the median of the repeats with [min-max]; every ratio "
        "compares two things measured in the same run, in turns, because the machine is "
        "shared with other work and its absolute speed drifts.",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        *[f"| {name} | {value} |" for name, value in notes],
        "",
        "## Targets",
        "",
        "| benchmark | target | goal | measured | verdict |",
        "|---|---|---|---|---|",
    ]
    for name, report in reports.items():
        if report is None:
            lines.append(f"| {name} | (the script failed; see its output) | | | failed |")
            continue
        for target in report["targets"]:
            lines.append(f"| {name} | {target['name']} | {target['goal']} | "
                         f"{target['measured']} | {target['verdict']} |")
    lines.append("")
    for name, report in reports.items():
        if report is None:
            lines += [f"## {name}", "", "The script failed in this run.", ""]
        else:
            lines += [report["markdown"]]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    started = time.monotonic()
    notes = machine_notes()
    reports: dict[str, dict | None] = {}
    with tempfile.TemporaryDirectory(prefix="queuelog-bench-reports-") as directory:
        for name in options.only:
            reports[name] = run_script(name, options, directory)
    text = document(reports, notes, options, time.monotonic() - started)
    if options.output is None:
        print(text)
    else:
        options.output.write_text(text)
        print(f"\nwrote {options.output}")
    failed = [name for name, report in reports.items() if report is None]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
