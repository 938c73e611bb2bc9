"""Fault injection for tests/faults: every fault the suite causes is caused here, so a reader
sees in one place what each test does to the machine (issue 36)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest


def unavailable(what: str, reason: str) -> NoReturn:
    """A fault this machine cannot cause: skipped on a workstation, a failure in CI (CI=true),
    where .ci/run runs as root on a machine with mount, loop devices and PostgreSQL's binaries,
    so a missing tool there is a broken CI, not a reason to prove less."""
    message = f"{what}: {reason}"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


# --- Private PostgreSQL clusters: restart, shutdown, killed backends, a held snapshot ---
POSTGRES_BIN = Path("/usr/lib/postgresql/15/bin")
POSTGRES_USER = "postgres"
PG_CTL_TIMEOUT_SECONDS = 60


def postgres_unavailable() -> str | None:
    """Why a private cluster cannot be made here, or None when it can."""
    if not (POSTGRES_BIN / "initdb").exists():
        return f"no PostgreSQL binaries in {POSTGRES_BIN}"
    if os.geteuid() == 0:
        try:
            subprocess.run(["runuser", "-u", POSTGRES_USER, "--", "true"], check=True,
                               capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return f"running as root without a usable '{POSTGRES_USER}' user for runuser"
    return None


class PrivatePostgres:
    """A PostgreSQL cluster of the tests' own, made with the machine's binaries in a temporary
    directory, listening on loopback on a free port: the one the fault tests restart, shut
    down and cut, never the machine's shared cluster, which other tests use meanwhile.

    initdb and postgres refuse to run as root, so as root every command runs as the
    `postgres` user (runuser), in a directory that user owns.
    """

    def __init__(self, port: int | None = None) -> None:
        from tests.servers import free_port

        self.port = port or free_port()
        # Not under pytest's tmp_path: its parents are root's 0700 directories, which the
        # postgres user could not enter.
        self.directory = Path(tempfile.mkdtemp(prefix="queuelog-faults-pg-"))
        self.data = self.directory / "data"
        self.log_path = self.directory / "postgres.log"
        self._as_root = os.geteuid() == 0
        self._template: str | None = None  # a migrated database the others are copies of
        if self._as_root:
            shutil.chown(self.directory, POSTGRES_USER, POSTGRES_USER)

    # -- commands ----------------------------------------------------------------------------

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        argv = [str(POSTGRES_BIN / tool), *args]
        if self._as_root:
            argv = ["runuser", "-u", POSTGRES_USER, "--", *argv]
        return subprocess.run(argv, check=check, capture_output=True, text=True,
                                  timeout=PG_CTL_TIMEOUT_SECONDS + 30, cwd=self.directory)

    def ctl(self, action: str, *args: str) -> None:
        done = self._run("pg_ctl", action, "-D", str(self.data), "-l", str(self.log_path),
                         "-w", "-t", str(PG_CTL_TIMEOUT_SECONDS), *args, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl {action} failed ({done.returncode}): "
                               f"{done.stdout}{done.stderr}\n{self.log_tail()}")

    def init(self) -> PrivatePostgres:
        self._run("initdb", "-D", str(self.data), "-U", POSTGRES_USER, "-A", "trust",
                  "-E", "UTF8", "--no-sync", "--no-instructions")
        settings = {
            "port": str(self.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.directory}'",
            # Two servers of 4 workers, each with a pool and its overflow, plus the tests.
            "max_connections": "300",
            "shared_buffers": "'32MB'",
            # The tests never crash the machine, only PostgreSQL: a commit is written to the
            # WAL before it is acknowledged (synchronous_commit stays on), and the OS keeps it
            # when PostgreSQL dies, so skipping fsync loses nothing here and saves the disk.
            "fsync": "off",
            "full_page_writes": "off",
            "log_min_messages": "warning",
        }
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# tests/faults/inject.py\n")
            conf.writelines(f"{name} = {value}\n" for name, value in settings.items())
        return self

    def start(self) -> None:
        self.ctl("start")

    def stop(self, mode: str = "fast") -> None:
        """pg_ctl stop -m smart|fast|immediate (fast: every session cut, a clean shutdown;
        immediate: a crash, recovered from the WAL at the next start)."""
        self.ctl("stop", "-m", mode)

    def restart(self, mode: str = "fast") -> None:
        self.ctl("restart", "-m", mode)

    def running(self) -> bool:
        return self._run("pg_ctl", "status", "-D", str(self.data), check=False).returncode == 0

    def destroy(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
            if self.running():
                self.stop("immediate")
        shutil.rmtree(self.directory, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- databases ---------------------------------------------------------------------------

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{POSTGRES_USER}@127.0.0.1:{self.port}/{database}"

    def _connect(self, database: str = "postgres"):  # -> psycopg.Connection
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.port, user=POSTGRES_USER,
                               dbname=database, autocommit=True, connect_timeout=10)

    def create_database(self, migrated: bool = True) -> str:
        """A new database (migrated to the newest revision: a copy of a template migrated
        once, quicker than migrating each); its SQLAlchemy URL."""
        from app.storage.migrations import upgrade

        if migrated and not self._template:
            self._template = self.create_database(migrated=False).rpartition("/")[2]
            upgrade(self.url(self._template))
        name = f"queuelog_faults_{uuid.uuid4().hex[:12]}"
        template = f' TEMPLATE "{self._template}"' if migrated else ""
        with self._connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}"{template}')
        return self.url(name)

    def kill_backends(self, database: str) -> int:
        """pg_terminate_backend of every session of `database` but this one; how many."""
        with self._connect() as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) "
                "FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
                "AND backend_type = 'client backend'", (database,)).fetchone()
        return int(row[0]) if row else 0

    @contextlib.contextmanager
    def hold_xmin(self, database: str) -> Iterator[int]:
        """A REPEATABLE READ transaction in `database`, idle with its snapshot, for as long as
        the block runs: its xmin is the horizon below which no row version a later update or
        delete left behind can be removed, so SKIP LOCKED scans meet ever more dead rows.
        Yields the holding backend's pid."""
        conn = self._connect(database)
        try:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            # The first statement takes the snapshot (and sets backend_xmin).
            conn.execute("SELECT count(*) FROM jobs")
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            yield int(pid)
        finally:
            with contextlib.suppress(Exception):
                conn.execute("ROLLBACK")
            conn.close()


def database_of(url: str) -> str:
    """The database name of a SQLAlchemy URL."""
    from sqlalchemy.engine import make_url

    name = make_url(url).database
    assert name, url
    return name

# --- The host: a small or read-only filesystem, a stepped wall clock ---
# Imported here, below the other section, by the rule of one section per helper.

HOST_COMMAND_TIMEOUT_SECONDS = 30
_MIB = 1024 * 1024


def run(*argv: str) -> str:
    """Run a command of the machine's (mount, losetup, …); its stderr in the error."""
    done = subprocess.run(list(argv), capture_output=True, text=True,
                                timeout=HOST_COMMAND_TIMEOUT_SECONDS)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): "
                           f"{done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def umount(directory: Path) -> None:
    """Unmount, lazily when something still holds it open (a test that failed before it
    stopped its server): the directory is detached at once either way."""
    try:
        run("umount", str(directory))
    except RuntimeError:
        run("umount", "-l", str(directory))


def mount_unavailable() -> str | None:
    """Why this process cannot mount a filesystem (tmpfs), or None when it can."""
    if os.geteuid() != 0:
        return "mounting a filesystem needs root (CAP_SYS_ADMIN)"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "no mount/umount command"
    probe = Path(tempfile.mkdtemp(prefix="queuelog-faults-probe-"))
    try:
        run("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe))
        umount(probe)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return f"cannot mount a tmpfs here: {exc}"
    finally:
        probe.rmdir()
    return None


def loop_unavailable() -> str | None:
    """Why an ext4 image cannot be mounted on a loop device here, or None when it can."""
    reason = mount_unavailable()
    if reason:
        return reason
    for tool in ("losetup", "mkfs.ext4", "e2fsck"):
        if shutil.which(tool) is None:
            return f"no {tool} command (e2fsprogs, util-linux)"
    if not Path("/dev/loop-control").exists():
        return "no loop devices (/dev/loop-control)"
    return None


class SmallFilesystem:
    """A tmpfs of `size_bytes` on a directory of its own: the disk a SQLite database fills.

    fill() leaves it full (a filler file takes every free byte), free() gives the space
    back. A tmpfs cannot be remounted read-only while a file on it is open for writing (the
    kernel answers EBUSY, and a SQLite database is always open so): read_only() is for a
    filesystem nobody writes to; LoopFilesystem makes a live one read-only."""

    def __init__(self, size_bytes: int = 8 * _MIB) -> None:
        self.size_bytes = size_bytes
        self.path = Path(tempfile.mkdtemp(prefix="queuelog-faults-fs-"))
        self.filler = self.path / "filler"
        self.mounted = False

    def mount(self) -> SmallFilesystem:
        run("mount", "-t", "tmpfs", "-o", f"size={self.size_bytes},mode=0755",
                  "tmpfs", str(self.path))
        self.mounted = True
        return self

    def free_bytes(self) -> int:
        stats = os.statvfs(self.path)
        return stats.f_bavail * stats.f_frsize

    def fill(self) -> int:
        """Take every free byte (a filler file written until ENOSPC); the bytes taken."""
        taken = 0
        chunk = b"\0" * 65536
        descriptor = os.open(self.filler, os.O_WRONLY | os.O_CREAT
                                   | os.O_APPEND, 0o600)
        try:
            for size in (65536, 4096, 512, 1):  # a short write fills up to the last block
                try:
                    while True:
                        taken += os.write(descriptor, chunk[:size])
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        return taken

    def free(self) -> None:
        """Give the filler's space back."""
        self.filler.unlink(missing_ok=True)

    def read_only(self) -> None:
        run("mount", "-o", "remount,ro", str(self.path))

    def read_write(self) -> None:
        run("mount", "-o", "remount,rw", str(self.path))

    def unmount(self) -> None:
        if self.mounted:
            umount(self.path)
            self.mounted = False
        with contextlib.suppress(OSError):
            self.path.rmdir()

    def __enter__(self) -> SmallFilesystem:
        return self.mount()

    def __exit__(self, *exc: object) -> None:
        self.unmount()


class LoopFilesystem:
    """An ext4 filesystem in an image file on a loop device, mounted with
    errors=remount-ro, as a server's data disk usually is.

    fail_read_only() makes the kernel turn it read-only as it does after a disk error
    (ext4's trigger_fs_error): every write fails, reads go on. The kernel then refuses to
    make it read-write again while it is mounted (emergency_ro), as in production: the
    operator stops what uses it, checks it and mounts it again (repair()), then restarts
    the service. No journal, so that repair() has nothing to replay."""

    def __init__(self, size_bytes: int = 32 * _MIB) -> None:
        self.size_bytes = size_bytes
        self.work = Path(tempfile.mkdtemp(prefix="queuelog-faults-loop-"))
        self.image = self.work / "disk.img"
        self.path = self.work / "mnt"
        self.path.mkdir()
        self.mounted = False

    def mount(self) -> LoopFilesystem:
        if not self.image.exists():
            with self.image.open("wb") as image:
                image.truncate(self.size_bytes)
            run("mkfs.ext4", "-q", "-F", "-O", "^has_journal", str(self.image))
        run("mount", "-o", "loop,errors=remount-ro", str(self.image), str(self.path))
        self.mounted = True
        return self

    def device(self) -> str:
        return run("findmnt", "-n", "-o", "SOURCE", str(self.path)).strip()

    def read_only_now(self) -> bool:
        options = run("findmnt", "-n", "-o", "OPTIONS", str(self.path)).strip()
        return "ro" in options.split(",") or "emergency_ro" in options.split(",")

    def fail_read_only(self) -> None:
        """The kernel's reaction to a disk error: the filesystem read-only from now on."""
        name = Path(self.device()).name
        Path(f"/sys/fs/ext4/{name}/trigger_fs_error").write_text("queuelog fault test\n")

    def repair(self) -> str:
        """Unmount, check (e2fsck -fy) and mount read-write again; e2fsck's summary. Stop
        every process using it first."""
        umount(self.path)
        self.mounted = False
        done = subprocess.run(["e2fsck", "-fy", str(self.image)], capture_output=True,
                                    text=True, timeout=HOST_COMMAND_TIMEOUT_SECONDS)
        if done.returncode not in (0, 1):  # 1: errors were corrected
            raise RuntimeError(f"e2fsck failed ({done.returncode}): {done.stdout}{done.stderr}")
        self.mount()
        return done.stdout.strip()

    def unmount(self) -> None:
        if self.mounted:
            umount(self.path)
            self.mounted = False
        shutil.rmtree(self.work, ignore_errors=True)

    def __enter__(self) -> LoopFilesystem:
        return self.mount()

    def __exit__(self, *exc: object) -> None:
        self.unmount()


def stepped_clock_unavailable() -> str | None:
    """Why a process cannot be run on a SteppedClock here, or None when it can: a step must
    move its time.time() and leave time.monotonic() alone."""
    directory = Path(tempfile.mkdtemp(prefix="queuelog-faults-clock-"))
    try:
        clock = SteppedClock(directory)
        clock.step(-3600)
        probe = "import time; time.sleep(0.01); print(time.time(), time.monotonic())"
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True,
                                    text=True, timeout=HOST_COMMAND_TIMEOUT_SECONDS,
                                    env={**os.environ, **clock.env()})
        wall, monotonic = (float(value) for value in done.stdout.split())
        if abs(wall - (time.time() - 3600)) > 60:
            return f"the stepped clock did not step time.time() ({done.stderr.strip()})"
        if abs(monotonic - time.monotonic()) > 60:
            return "the stepped clock stepped time.monotonic() too"
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return f"the stepped clock does not work here: {exc}"
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return None


# Loaded (as sitecustomize) by every Python process started with SteppedClock.env(): its
# time.time() and time.time_ns(), which app/core/clock.py, the request logs and the traces
# read, add the offset in the file, read again whenever the file is replaced. Not
# libfaketime: the one Debian 12 ships (0.9.10) breaks Python 3.11 when it leaves monotonic
# time alone (time.sleep fails with EINVAL, wolfcw/libfaketime#426, and every thread
# hand-off waits ~60 ms: 100 enqueues took 8.6 s instead of 0.4 s), and faking monotonic
# time as well would step the clock gunicorn times its workers with and the service times
# its waits with, which no real step of the wall clock moves.
_CLOCK_SHIM = """\
import os
import time

_path = os.environ.get("QUEUELOG_FAULTS_CLOCK_OFFSET_FILE")
if _path:
    _real_time_ns = time.time_ns
    _seen = [None, 0]  # the file's identity, the offset in ns

    def _offset_ns():
        try:
            stat = os.stat(_path)
        except OSError:
            return _seen[1]
        identity = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if identity != _seen[0]:
            with open(_path, encoding="ascii") as offset:
                _seen[1] = int(offset.read().strip() or 0) * 1_000_000_000
            _seen[0] = identity
        return _seen[1]

    def _time_ns():
        return _real_time_ns() + _offset_ns()

    def _time():
        return _time_ns() / 1e9

    time.time_ns = _time_ns
    time.time = _time
"""
OFFSET_FILE_VARIABLE = "QUEUELOG_FAULTS_CLOCK_OFFSET_FILE"


class SteppedClock:
    """The wall clock of the Python processes started with env(), stepped at will, as
    `date -s` or an NTP step would step the host's: step() moves their time.time() and
    time.time_ns() at once, all together (they read the offset from one file), and leaves
    time.monotonic() alone, as a real step does (gunicorn's arbiter times its workers with
    it, the service its waits)."""

    def __init__(self, directory: Path) -> None:
        self.offset_file = directory / "clock-offset"
        self.shim = directory / "clock-shim"
        self.shim.mkdir(exist_ok=True)
        (self.shim / "sitecustomize.py").write_text(_CLOCK_SHIM)
        self.offset_seconds = 0
        self._write()

    def env(self, pythonpath: str = "") -> dict[str, str]:
        """The variables a process needs to run on this clock; `pythonpath`, the
        PYTHONPATH it would have otherwise (the shim goes first)."""
        return {OFFSET_FILE_VARIABLE: str(self.offset_file),
                "PYTHONPATH": os.pathsep.join(
                    part for part in (str(self.shim), pythonpath) if part)}

    def step(self, seconds: int) -> None:
        """Step the clock by `seconds` (negative: back)."""
        self.offset_seconds += int(seconds)
        self._write()

    def now(self) -> float:
        """The stepped processes' time.time()."""
        return time.time() + self.offset_seconds

    def _write(self) -> None:
        # Written aside and renamed in: a process reading it never sees half a number.
        part = self.offset_file.with_suffix(".part")
        part.write_text(f"{self.offset_seconds:+d}\n")
        os.replace(part, self.offset_file)


