"""Prometheus metrics across gunicorn's worker processes: the directory of per-process files,
and the folding of dead workers' files into one archive per kind.

prometheus_client decides when it is imported whether metrics go to per-process files, by
PROMETHEUS_MULTIPROC_DIR; so gunicorn.conf.py calls prepare_directory() while it loads, before
anything imports prometheus_client (a --preload would import the app before on_starting
runs). Each master gets a fresh, empty directory: counts left from an earlier run would be
added to this one's. The application's scrape (app/ops/metrics.py) reads the files.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, MutableMapping

DIRECTORY_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
OWNER_VARIABLE = "QUEUELOG_METRICS_DIR_OWNER"
# Held exclusively while dead workers' files are folded; a scrape holds it shared, so it never
# reads a worker's counts twice or not at all. The name must not end in .db, which is what
# the merge reads.
COMPACTION_LOCK = "compaction.lock"
# Only these kinds add up across processes; queuelog keeps no gauges in worker memory.
_SUMMED_KINDS = ("counter", "histogram")


def prepare_directory(environ: MutableMapping[str, str] = os.environ) -> str:
    """Create this master's metrics directory and name it in the environment the workers
    inherit; returns its path. Called again on HUP (the configuration is read again), it keeps
    the live workers' directory."""
    if (environ.get(OWNER_VARIABLE) == str(os.getpid())
            and os.path.isdir(environ.get(DIRECTORY_VARIABLE, ""))):
        return environ[DIRECTORY_VARIABLE]
    path = tempfile.mkdtemp(prefix="queuelog-metrics-")
    environ[DIRECTORY_VARIABLE] = path
    environ[OWNER_VARIABLE] = str(os.getpid())
    return path


def remove_directory(environ: MutableMapping[str, str] = os.environ) -> None:
    """At the master's exit: its directory goes (a worker never removes it)."""
    if environ.get(OWNER_VARIABLE) == str(os.getpid()):
        shutil.rmtree(environ[DIRECTORY_VARIABLE], ignore_errors=True)


def worker_exited(pid: int, live_pids: set[int],
                  environ: MutableMapping[str, str] = os.environ) -> None:
    """In the master, when a worker has exited: mark it dead for prometheus_client and fold
    the files of every process no longer alive."""
    from prometheus_client import multiprocess

    path = environ[DIRECTORY_VARIABLE]
    multiprocess.mark_process_dead(pid, path)
    compact_dead_workers(path, live_pids)


@contextlib.contextmanager
def _compaction_lock(path: str, wait_seconds: float = 1.0) -> Iterator[bool]:
    """Yields True once the lock is held, False when scrapes held it for `wait_seconds`: the
    master never blocks on a worker for long."""
    with open(os.path.join(path, COMPACTION_LOCK), "a+b") as lock:
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    yield False
                    return
                time.sleep(0.01)
                continue
            yield True
            return


def compact_dead_workers(path: str, live_pids: set[int]) -> int:
    """Fold the counter and histogram files of processes no longer alive into one archive file
    per kind, and delete theirs. Returns how many files were folded.

    Without this, every recycled worker (max_requests) would leave its files behind, and
    every scrape would read all of them: a scrape's cost would grow for as long as the master
    lives.
    """
    # prometheus_client leaves MmapedDict and mark_process_dead unannotated (the ignores below).
    from prometheus_client.mmap_dict import MmapedDict

    folded = 0
    with _compaction_lock(path) as locked:
        if not locked:
            return 0  # the next worker exit folds these too
        for kind in _SUMMED_KINDS:
            dead = []
            for name in glob.glob(os.path.join(path, f"{kind}_*.db")):
                pid = os.path.basename(name)[len(kind) + 1:-3]
                if pid.isdigit() and int(pid) not in live_pids:
                    dead.append(name)
            if not dead:
                continue
            archive = os.path.join(path, f"{kind}_archive.db")
            totals: dict[str, float] = defaultdict(float)
            for name in [archive, *dead] if os.path.exists(archive) else dead:
                values = MmapedDict.read_all_values_from_file(name)  # type: ignore[no-untyped-call]
                for key, value, _timestamp, _pos in values:
                    # A counter's or a histogram bucket's value in one process adds to the
                    # others' (buckets are stored per bucket, not cumulatively).
                    totals[key] += value
            fresh = os.path.join(path, f"{kind}_archive.tmp")
            with contextlib.suppress(FileNotFoundError):
                os.remove(fresh)
            merged = MmapedDict(fresh)  # type: ignore[no-untyped-call]
            try:
                for key, value in totals.items():
                    merged.write_value(key, value, 0.0)  # type: ignore[no-untyped-call]
            finally:
                merged.close()  # type: ignore[no-untyped-call]
            os.replace(fresh, archive)
            for name in dead:
                os.remove(name)
            folded += len(dead)
    return folded
