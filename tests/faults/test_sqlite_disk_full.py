"""SQLite's disk full, and its filesystem turned read-only, under load (issue 36).

Disk full: the database (and its -wal, -shm and lock files) on a small tmpfs, which the test
fills to the last byte mid-load. Enqueues (and the runner's claims and reports) answer 503
problems with Retry-After, never a 500 or a hang; reads go on; nothing acknowledged is lost;
once the space is given back everything resumes without a restart, and the file passes
PRAGMA integrity_check.

Read-only: a tmpfs cannot be remounted read-only while SQLite holds its files open for
writing (the kernel answers EBUSY), so the database lives on an ext4 image on a loop device,
mounted errors=remount-ro, and the kernel is made to turn it read-only as it does after a
disk error. Writes answer 503 problems, reads go on. The kernel then refuses to make it
read-write again while it is mounted (emergency_ro), as it would in production: the operator
stops the service, checks the filesystem and mounts it again, and restarts the service. The
test does just that, and finds every acknowledged job there, the file intact, and the load
completing."""

from __future__ import annotations

import shutil
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.faults.conftest import Keys, StartServer
from tests.faults.inject import (
    LoopFilesystem,
    SmallFilesystem,
    loop_unavailable,
    mount_unavailable,
    unavailable,
)
from tests.faults.load import ALLOWED_ERRORS, LoadRun, kind_of

pytestmark = pytest.mark.slow

STEADY_SECONDS = 1.0
FAULT_SECONDS = 2.0
AFTER_SECONDS = 2.0
LEASE_SECONDS = 10
DATABASE_NAME = "queuelog.sqlite3"


def _database_on(directory: Path, template: str) -> str:
    shutil.copyfile(template, directory / DATABASE_NAME)
    return f"sqlite:///{directory / DATABASE_NAME}"


def _integrity(path: Path) -> str:
    connection = sqlite3.connect(path)
    try:
        return str(connection.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        connection.close()


class Probe:
    """Requests of the test's own during the fault, by what they asked and what they got:
    an enqueue (which must fail as a 503 problem with Retry-After, or succeed) and the reads
    (which must answer 200)."""

    def __init__(self, url: str, keys: Keys) -> None:
        self.url = url
        self.producer = {"Authorization": f"Bearer {keys.producer}"}
        self.admin = {"Authorization": f"Bearer {keys.admin}"}
        self.kinds: Counter[str] = Counter()
        self.refusal: requests.Response | None = None

    def round(self, job_id: int, number: int) -> None:
        enqueue = requests.post(f"{self.url}/jobs", headers={
            **self.producer, "Idempotency-Key": f"probe-{number}"},
            json={"type": "pdf", "payload": {}}, timeout=10)
        self.kinds[f"enqueue {kind_of(enqueue)}"] += 1
        if enqueue.status_code >= 500:
            self.refusal = enqueue
        for path in (f"/jobs/{job_id}", "/jobs?limit=20"):
            read = requests.get(self.url + path, headers=self.admin, timeout=10)
            self.kinds[f"read {read.status_code}"] += 1

    def during(self, seconds: float, job_id: int) -> None:
        deadline = time.monotonic() + seconds
        number = 0
        while time.monotonic() < deadline:
            self.round(job_id, number)
            number += 1
            time.sleep(0.1)


def _load(server_url: str, keys: Keys, directory: Path) -> LoadRun:
    return LoadRun(server_url, producer_token=keys.producer, worker_token=keys.worker,
                   admin_token=keys.admin, directory=directory, producers=2,
                   rate_per_producer=20.0, concurrency=4, lease_seconds=LEASE_SECONDS)


def _assert_survived(report: Any, drained: bool, probe: Probe) -> None:
    assert report.lost == 0, report.acknowledged_lost
    assert report.twice == 0, report.completed_twice_while_leased
    assert report.failures == {}, report.summary("failures")
    assert report.worker_failures == {}, report.summary("worker failures")
    assert report.reported_complete_not_completed == []
    assert drained and report.not_completed == {}, report.not_completed
    # The fault was felt, and only as 503 problems: the writes were refused, not hung.
    assert probe.refusal is not None, probe.kinds
    assert probe.refusal.headers["Content-Type"].startswith("application/problem+json")
    assert probe.refusal.headers.get("Retry-After")
    assert probe.refusal.json()["type"].endswith("/storage-unavailable")
    assert set(probe.kinds) <= {"enqueue ok", "enqueue 503-problem-retry-after", "read 200"}, \
        probe.kinds


def test_a_full_disk_refuses_writes_with_503_loses_nothing_and_recovers_by_itself(
        sqlite_template: str, start_server: StartServer, make_keys: Callable[[str], Keys],
        tmp_path: Path) -> None:
    reason = mount_unavailable()
    if reason:
        unavailable("a small filesystem for the disk-full test", reason)
    with SmallFilesystem(size_bytes=16 * 1024 * 1024) as disk:
        url = _database_on(disk.path, sqlite_template)
        keys = make_keys(url)
        server = start_server(url, workers=2, threads=4)
        gunicorn_workers = sorted(server.worker_pids())
        probe = Probe(server.url, keys)
        with _load(server.url, keys, tmp_path) as load:
            load.start()
            load.wait_until_flowing()
            time.sleep(STEADY_SECONDS)
            some_job = next(iter(load.acknowledged.values()))
            with load.fault("disk full"):
                filled = disk.fill()
                probe.during(FAULT_SECONDS, some_job)
                disk.free()
            time.sleep(AFTER_SECONDS)
            after = requests.post(f"{server.url}/jobs", json={"type": "pdf", "payload": {}},
                                  headers=probe.producer, timeout=10)
            load.stop_producing()
            drained = load.drain(timeout=LEASE_SECONDS * 3)
            runners_alive = all(runner.alive() for runner in load.runners)
            report = load.report()
        pids_after = sorted(server.worker_pids())
        stderr = server.stderr()
        server.stop()
        integrity = _integrity(disk.path / DATABASE_NAME)

    report.print(f"sqlite disk full ({filled} bytes filled for {FAULT_SECONDS:.0f} s)")
    print(f"probe during the fault: {dict(probe.kinds)}; integrity_check: {integrity}")

    _assert_survived(report, drained, probe)
    assert after.status_code == 201  # space back: enqueues succeed, no restart
    assert runners_alive
    assert pids_after == gunicorn_workers
    assert integrity == "ok"
    assert "Traceback" not in stderr
    assert "database storage refuses writes (SQLITE_FULL)" in stderr


def test_a_filesystem_turned_read_only_refuses_writes_with_503_and_loses_nothing(
        sqlite_template: str, start_server: StartServer, make_keys: Callable[[str], Keys],
        tmp_path: Path) -> None:
    reason = loop_unavailable()
    if reason:
        unavailable("an ext4 image on a loop device for the read-only test", reason)
    with LoopFilesystem() as disk:
        url = _database_on(disk.path, sqlite_template)
        keys = make_keys(url)
        server = start_server(url, workers=2, threads=4)
        probe = Probe(server.url, keys)
        with _load(server.url, keys, tmp_path) as load:
            load.start()
            load.wait_until_flowing()
            time.sleep(STEADY_SECONDS)
            some_job = next(iter(load.acknowledged.values()))
            with load.fault("read-only filesystem, then the operator's restart"):
                disk.fail_read_only()
                probe.during(FAULT_SECONDS, some_job)
                read_only = disk.read_only_now()
                # What the operator does: stop the service, check and remount the disk,
                # start the service again. Producers and the runner see it refuse
                # connections meanwhile, and carry on with the same idempotency keys.
                restart_began = time.time()
                stderr = server.stderr()
                server.stop()
                stopped_in = time.time() - restart_began
                fsck = disk.repair()
                server.start()
                restart_ended = time.time()
            time.sleep(AFTER_SECONDS)
            load.stop_producing()
            drained = load.drain(timeout=LEASE_SECONDS * 3)
            runners_alive = all(runner.alive() for runner in load.runners)
            report = load.report(allowed_errors=ALLOWED_ERRORS | {"connection"})
            refused_outside = [
                (at, kind) for at, kind in load.answers.error_times
                if kind == "connection" and not restart_began <= at <= restart_ended + 1.0]
        server.stop()
        integrity = _integrity(disk.path / DATABASE_NAME)

    report.print("sqlite read-only filesystem (kernel emergency_ro), then a restart")
    print(f"probe during the fault: {dict(probe.kinds)}; restart "
          f"{restart_ended - restart_began:.1f} s (the graceful stop {stopped_in:.1f} s); "
          f"e2fsck: {fsck.splitlines()[-1]}; integrity_check: {integrity}")

    assert read_only
    _assert_survived(report, drained, probe)
    # Connections were refused only while the service was down for the operator's restart.
    assert refused_outside == []
    assert runners_alive
    assert integrity == "ok"
    assert "Traceback" not in stderr
