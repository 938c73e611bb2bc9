"""What the figures were measured on: CPU, memory, disk (the cost of one fsync), versions, and
the commit."""

from __future__ import annotations

import contextlib
import os
import platform
import sqlite3
import statistics
import subprocess
import tempfile
import time
from importlib import metadata
from pathlib import Path

from bench import ROOT
from bench.stats import ms


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _memory_gib() -> str:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    return "unknown"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def fsync_cost_ms(directory: str, samples: int = 100) -> float:
    """Median time of one 4 KiB write + fsync in `directory`: the floor under every durable
    commit measured here."""
    path = os.path.join(directory, "fsync-probe")
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(samples):
            os.write(fd, b"\0" * 4096)
            start = time.perf_counter()
            os.fsync(fd)
            times.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        os.remove(path)
    return ms(statistics.median(times))


def machine_notes(directory: str | None = None) -> list[tuple[str, str]]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                                  text=True, timeout=10, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "?"

    dirty = " (with uncommitted changes)" if git("status", "--porcelain", "--", "app") else ""
    with tempfile.TemporaryDirectory(dir=directory) as probe_dir:
        fsync = fsync_cost_ms(probe_dir)
    packages = ["flask", "werkzeug", "sqlalchemy", "marshmallow", "gunicorn", "alembic",
                "huey", "persist-queue", "litequeue"]
    return [
        ("CPU", f"{_cpu_model()}, {os.cpu_count()} cores"),
        ("memory", _memory_gib()),
        ("OS", f"{platform.system()} {platform.release()}"),
        ("load average at start", " ".join(f"{x:.2f}" for x in os.getloadavg())),
        ("disk", f"one 4 KiB write + fsync: {fsync:.2f} ms (median of 100) in "
                 f"{directory or tempfile.gettempdir()}"),
        ("Python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("SQLite", sqlite3.sqlite_version),
        ("libraries", ", ".join(f"{name} {_version(name)}" for name in packages)),
        ("queuelog", f"{git('rev-parse', '--short', 'HEAD')} on {git('branch', '--show-current')}"
                     f"{dirty}"),
    ]
