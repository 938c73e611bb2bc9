"""The shipped gunicorn settings (queuelog_gunicorn/conf.py, what `queuelog serve` passes to
gunicorn's -c; the checkout's gunicorn.conf.py is a one-line import of it), loaded the way
gunicorn loads a file: its settings, their environment
overrides, its metrics directory; and the folding of dead workers' metrics files
(queuelog_gunicorn/multiprocess.py)."""

from __future__ import annotations

import fcntl
import os
import runpy
import tempfile
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gunicorn.config import Config
from gunicorn.workers.gthread import ThreadWorker
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.mmap_dict import MmapedDict, mmap_key

from app.ops.metrics import WorkerFilesCollector
from queuelog_gunicorn.multiprocess import COMPACTION_LOCK, compact_dead_workers
from queuelog_gunicorn.worker import BufferingThreadWorker
from tests.ops.scrape import Scrape
from tests.servers import REPO_ROOT

ISOLATED = ("PROMETHEUS_MULTIPROC_DIR", "QUEUELOG_METRICS_DIR_OWNER", "QUEUELOG_BIND", "PORT",
            "GUNICORN_WORKERS", "GUNICORN_THREADS", "GUNICORN_MAX_REQUESTS")
# Names in the file that are not gunicorn settings.
HELPERS = {"annotations", "Any", "configured_binds"}


@pytest.fixture
def load_conf(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., dict[str, Any]]:
    for name in ISOLATED:
        # setenv first, so that monkeypatch puts back the variable's absence afterwards even
        # though the file itself writes to os.environ.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def load(**env: str) -> dict[str, Any]:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return runpy.run_path(str(REPO_ROOT / "queuelog_gunicorn" / "conf.py"))

    return load


def test_every_name_is_a_gunicorn_setting_with_a_valid_value(
        load_conf: Callable[..., dict[str, Any]]) -> None:
    conf = load_conf()
    cfg = Config()
    settings = {name: value for name, value in conf.items()
                if not name.startswith("_") and name not in HELPERS
                and not isinstance(value, types.ModuleType)}
    unknown = set(settings) - set(cfg.settings)
    assert not unknown, f"not gunicorn settings (typos?): {unknown}"
    for name, value in settings.items():
        cfg.set(name, value)  # gunicorn's own validation
    # gthread's worker, reading whole requests before a thread sees them.
    assert issubclass(cfg.worker_class, ThreadWorker)
    assert cfg.worker_class is BufferingThreadWorker
    assert cfg.preload_app is False
    assert cfg.accesslog is None
    assert cfg.max_requests_jitter > 0
    assert cfg.graceful_timeout > 20  # longer than the longest long poll


def test_sizes_and_address_come_from_the_environment(
        load_conf: Callable[..., dict[str, Any]]) -> None:
    conf = load_conf(GUNICORN_WORKERS="3", GUNICORN_THREADS="32", GUNICORN_MAX_REQUESTS="7",
                     QUEUELOG_BIND="127.0.0.1:9001,127.0.0.1:9002")
    assert (conf["workers"], conf["threads"], conf["max_requests"]) == (3, 32, 7)
    assert conf["bind"] == ["127.0.0.1:9001", "127.0.0.1:9002"]


def test_the_address_defaults_to_loopback_and_follows_port(
        load_conf: Callable[..., dict[str, Any]]) -> None:
    assert load_conf()["bind"] == ["127.0.0.1:8000"]
    assert load_conf(PORT="5000")["bind"] == ["0.0.0.0:5000"]


def test_each_master_gets_a_fresh_metrics_directory_kept_across_reloads(
        load_conf: Callable[..., dict[str, Any]], tmp_path: Path) -> None:
    conf = load_conf()
    path = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    assert path.parent == tmp_path and path.is_dir() and not any(path.iterdir())
    (path / "counter_1.db").write_bytes(b"")

    load_conf()  # a HUP reads the file again in the same master
    assert Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]) == path
    assert (path / "counter_1.db").exists()

    conf["on_exit"](None)
    assert not path.exists()


# -- folding dead workers' files -----------------------------------------------------------

COUNTER = ("queuelog_jobs_enqueued", "queuelog_jobs_enqueued_total", [], [])
HISTOGRAM = "queuelog_http_request_duration_seconds"


def write_worker_file(path: Path, kind: str, pid: int | str, enqueued: float,
                      fast: float = 0, slow: float = 0) -> None:
    values = MmapedDict(str(path / f"{kind}_{pid}.db"))
    if kind == "counter":
        values.write_value(mmap_key(*COUNTER, "Jobs stored."), enqueued, 0.0)
    else:
        for le, count in (("0.1", fast), ("1.0", slow)):
            values.write_value(mmap_key(HISTOGRAM, HISTOGRAM + "_bucket", ["route", "le"],
                                        ["/jobs", le], "Latency."), count, 0.0)
        values.write_value(mmap_key(HISTOGRAM, HISTOGRAM + "_sum", ["route"], ["/jobs"],
                                    "Latency."), fast * 0.05 + slow * 0.5, 0.0)
    values.close()


def scrape_files(path: Path) -> Scrape:
    registry = CollectorRegistry()
    registry.register(WorkerFilesCollector(str(path)))
    return Scrape(generate_latest(registry).decode())


def figures(scrape: Scrape) -> tuple[float, ...]:
    return (scrape.value("queuelog_jobs_enqueued_total"),
            scrape.value(HISTOGRAM + "_bucket", route="/jobs", le="0.1"),
            scrape.value(HISTOGRAM + "_bucket", route="/jobs", le="1.0"),
            scrape.value(HISTOGRAM + "_count", route="/jobs"),
            round(scrape.value(HISTOGRAM + "_sum", route="/jobs"), 6))


def test_dead_workers_files_fold_into_one_archive_and_the_totals_stay(tmp_path: Path) -> None:
    path = tmp_path / "metrics"
    path.mkdir()
    for pid, (enqueued, fast, slow) in {101: (3, 2, 1), 102: (5, 4, 0), 103: (7, 1, 6)}.items():
        write_worker_file(path, "counter", pid, enqueued)
        write_worker_file(path, "histogram", pid, enqueued, fast, slow)
    before = figures(scrape_files(path))
    assert before == (15, 7, 14, 14, round(7 * 0.05 + 7 * 0.5, 6))

    assert compact_dead_workers(str(path), {103}) == 4

    assert sorted(p.name for p in path.glob("*.db")) == [
        "counter_103.db", "counter_archive.db", "histogram_103.db", "histogram_archive.db"]
    assert figures(scrape_files(path)) == before

    # A later exit adds to the archive rather than replacing it.
    write_worker_file(path, "counter", 104, 10)
    assert compact_dead_workers(str(path), {103}) == 1
    assert scrape_files(path).value("queuelog_jobs_enqueued_total") == 25
    assert sorted(p.name for p in path.glob("counter_*.db")) == [
        "counter_103.db", "counter_archive.db"]


def test_folding_waits_for_no_scrape_and_leaves_the_files_for_the_next_exit(
        tmp_path: Path) -> None:
    path = tmp_path / "metrics"
    path.mkdir()
    write_worker_file(path, "counter", 101, 3)
    with open(path / COMPACTION_LOCK, "a+b") as scrape_in_progress:
        fcntl.flock(scrape_in_progress, fcntl.LOCK_SH)
        assert compact_dead_workers(str(path), set()) == 0
        assert (path / "counter_101.db").exists()
    assert compact_dead_workers(str(path), set()) == 1
    assert scrape_files(path).value("queuelog_jobs_enqueued_total") == 3
