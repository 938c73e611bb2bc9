"""A change committed in one process wakes the requests waiting in this host's others
(app/jobs/wake/host_wake.py): the sibling gunicorn workers need not wait for their next peek."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.jobs.wake import host_wake
from app.jobs.wake.host_wake import HostWake, wake_directory
from app.jobs.wake.waiting import JobSignal
from app.storage.engine import database_identity

# Far longer than any wake takes: a wait that lasts it has not been woken.
NEVER_SECONDS = 30.0
REPOSITORY = Path(__file__).resolve().parents[2]


@pytest.fixture
def directory(tmp_path: Path) -> Iterator[str]:
    # Under the temp directory, as the app's is: a pytest path can be too long for a socket.
    path = wake_directory(str(tmp_path / "queuelog.sqlite3"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def send_from_another_process(directory: str, *kinds: str) -> None:
    code = ("import sys; from app.jobs.wake.host_wake import HostWake;"
            " wake = HostWake(sys.argv[1]); [wake.send(kind) for kind in sys.argv[2:]]")
    subprocess.run([sys.executable, "-c", code, directory, *kinds], check=True,
                   cwd=REPOSITORY, timeout=60)


def test_a_wake_from_another_process_wakes_the_waiters_of_its_kind(directory):
    host = HostWake(directory)
    claimable, finished = JobSignal(host, "claimable"), JobSignal(host, "finished")
    with claimable.watching(), finished.watching():
        seen_claimable, seen_finished = claimable.generation, finished.generation

        send_from_another_process(directory, "claimable")

        assert claimable.wait(seen_claimable, timeout=NEVER_SECONDS)
        assert finished.generation == seen_finished  # another kind's waiters stay asleep


def test_a_process_whose_requests_stopped_waiting_gives_its_socket_back(directory,
                                                                       monkeypatch):
    monkeypatch.setattr(host_wake, "LINGER_SECONDS", 0.0)
    monkeypatch.setattr(host_wake, "_IDLE_CHECK_SECONDS", 0.05)
    signal = JobSignal(HostWake(directory), "claimable")
    with signal.watching():
        assert len(os.listdir(directory)) == 1  # bound while a request may wait

    deadline = time.monotonic() + NEVER_SECONDS
    while os.path.exists(directory) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(directory)  # its socket gone, and the empty directory with it

    with signal.watching():  # the next waiting request binds again
        seen = signal.generation
        send_from_another_process(directory, "claimable")
        assert signal.wait(seen, timeout=NEVER_SECONDS)


def test_a_socket_left_by_a_killed_process_is_removed_by_the_next_sender(directory):
    os.makedirs(directory, mode=0o700)
    left = os.path.join(directory, "999999.1")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(left)
    dead.close()  # its file stays, as after kill -9

    HostWake(directory).send("claimable")

    assert not os.path.exists(left)


def test_a_directory_others_may_write_to_is_not_used(directory, caplog):
    os.makedirs(directory)
    os.chmod(directory, 0o777)  # noqa: S103 - the mistake under test
    host = HostWake(directory)
    signal = JobSignal(host, "claimable")

    with caplog.at_level(logging.WARNING, logger="app.jobs.wake.host_wake"), signal.watching():
        seen = signal.generation
        assert os.listdir(directory) == []  # nothing bound there
        signal.notify()  # still wakes this process's own waiters
        assert signal.wait(seen, timeout=NEVER_SECONDS)
    assert "polling only" in caplog.text


def test_an_app_hears_another_process_finishing_and_enqueueing(app):
    # The app wires both signals to its database's directory: what another gunicorn worker
    # of the same database sends reaches this one's waiting claims and reads.
    jobs = app.extensions["queuelog"].jobs
    directory = wake_directory(database_identity(app.config["DATABASE_URL"]))
    with jobs.signal.watching():
        seen = jobs.signal.generation
        send_from_another_process(directory, "claimable")
        assert jobs.signal.wait(seen, timeout=NEVER_SECONDS)


def test_a_directory_others_may_write_to_gets_no_wake_sent_into_it(directory):
    os.makedirs(directory)
    os.chmod(directory, 0o777)  # noqa: S103 - the mistake under test
    planted = os.path.join(directory, "999999.1")  # another user's socket, say
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(planted)
    listener.setblocking(False)
    try:
        HostWake(directory).send("claimable")

        with pytest.raises(BlockingIOError):
            listener.recv(16)  # nothing was sent into it
    finally:
        listener.close()


def test_a_temporary_directory_too_deep_for_a_socket_falls_back_to_tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / ("deep" * 20)))
    chosen = wake_directory(str(tmp_path / "queuelog.sqlite3"))
    assert os.path.dirname(chosen) == "/tmp"
    try:
        signal = JobSignal(HostWake(chosen), "claimable")
        with signal.watching():
            seen = signal.generation
            send_from_another_process(chosen, "claimable")
            assert signal.wait(seen, timeout=NEVER_SECONDS)
    finally:
        shutil.rmtree(chosen, ignore_errors=True)


def test_a_directory_too_deep_for_a_socket_is_said_once_and_waits_peek(tmp_path, caplog):
    too_long = str(tmp_path / ("x" * 120))
    host = HostWake(too_long)
    signal = JobSignal(host, "claimable")

    with caplog.at_level(logging.WARNING, logger="app.jobs.wake.host_wake"):
        for _ in range(3):
            with signal.watching():
                seen = signal.generation
                signal.notify()  # this process's own waiters are still woken
                assert signal.wait(seen, timeout=NEVER_SECONDS)
        host.send("claimable")
    assert not os.path.exists(too_long)
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 1 and "polling only" in said[0] and "TMPDIR" in said[0]


def test_a_bind_that_failed_for_want_of_a_resource_stops_receiving_not_sending(
        directory, monkeypatch, caplog):
    monkeypatch.setattr(host_wake, "_BIND_RETRY_SECONDS", 0.0)
    listening = JobSignal(HostWake(directory), "claimable")
    starved = HostWake(directory)
    bind, failures = starved._bind, [OSError(24, "Too many open files")]  # as at `ulimit -n`

    def bind_once_out_of_descriptors() -> socket.socket:
        if failures:
            raise failures.pop()
        return bind()

    monkeypatch.setattr(starved, "_bind", bind_once_out_of_descriptors)
    with caplog.at_level(logging.WARNING, logger="app.jobs.wake.host_wake"), \
            listening.watching(), JobSignal(starved, "claimable").watching():
        seen = listening.generation
        starved.send("claimable")  # still tells the others
        assert listening.wait(seen, timeout=NEVER_SECONDS)
    assert "Too many open files" in caplog.text

    recovered = JobSignal(starved, "claimable")
    with recovered.watching():  # the retry's time has come: this wait binds
        seen = recovered.generation
        send_from_another_process(directory, "claimable")
        assert recovered.wait(seen, timeout=NEVER_SECONDS)
