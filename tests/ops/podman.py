"""The project's Dockerfile built and run with podman, as root, with no image registry.

The base image is Debian made with debootstrap from the mirror apt uses on this host and
imported into podman; it is kept (as a podman image, and as a tarball in CACHE_DIR) for later
runs. The image installs wheels built here from a copy of the checkout, so its build needs
no package index either. runc, not crun: crun fails on these hosts' hybrid cgroups.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = Path("/var/cache/queuelog-tests")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
RUN_FLAGS = ("--runtime", "runc", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096")
COMMAND_TIMEOUT_SECONDS = 900


def run(argv: list[str], *, check: bool = True, timeout: float = COMMAND_TIMEOUT_SECONDS,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command; a failure raises with the command's own words."""
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                            stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {result.returncode}:\n"
                             f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def podman(*args: str, check: bool = True,
           timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run(["podman", *args], check=check, timeout=timeout)


def debian_suite() -> str:
    """The host's Debian release (its python3 is then the one the wheels are built for)."""
    release = dict(re.findall(r'^(\w+)="?([^"\n]*)"?$', Path("/etc/os-release").read_text(),
                              re.M))
    return release.get("VERSION_CODENAME", "bookworm") if release.get("ID") == "debian" \
        else "bookworm"


def debian_mirror(suite: str) -> str:
    """The first mirror apt's sources name for `suite` (deb822 or one-line), else Debian's."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for source in sources:
        if not source.is_file():
            continue
        text = source.read_text(errors="replace")
        if source.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = {name.lower(): value.split() for name, value in
                          re.findall(r"^([A-Za-z-]+):[ \t]*(.*)$", stanza, re.M)}
                if ("deb" in fields.get("types", []) and suite in fields.get("suites", [])
                        and fields.get("uris")):
                    return fields["uris"][0]
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", " ", line).split()
                if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
                    return words[1]
    return DEFAULT_MIRROR


def base_image() -> str:
    """A podman image of Debian with python3 and its venv module: the one already imported,
    else the cached tarball imported, else a fresh debootstrap (cached when possible)."""
    suite = debian_suite()
    name = f"localhost/queuelog-test-base:{suite}"
    if podman("image", "exists", name, check=False).returncode == 0:
        return name
    tarball = CACHE_DIR / f"debian-{suite}-python3.tar"
    if not tarball.exists():
        _debootstrap(suite, tarball)
    podman("import", str(tarball), name, timeout=COMMAND_TIMEOUT_SECONDS)
    return name


def _debootstrap(suite: str, tarball: Path) -> None:
    with contextlib.suppress(OSError):
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
    if not os.access(CACHE_DIR, os.W_OK):
        raise AssertionError(f"{CACHE_DIR} cannot be written: the container test runs as root")
    with tempfile.TemporaryDirectory(dir=CACHE_DIR, prefix="debootstrap-") as work:
        root = Path(work) / "root"
        run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv", suite,
             str(root), debian_mirror(suite)])
        partial = Path(work) / "base.tar"
        run(["tar", "-C", str(root), "-cf", str(partial), "."])
        partial.replace(tarball)  # whole or absent, should another run read it


def copy_checkout(directory: Path) -> None:
    """The checkout's files (tracked, and new ones not ignored), copied into `directory`: a
    build from the copy sees nothing an earlier build left in the checkout (build/lib)."""
    listed = run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT).stdout
    for relative in filter(None, listed.split("\0")):
        source = ROOT / relative
        if source.is_file():
            (directory / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, directory / relative)


def build_context(directory: Path) -> Path:
    """A copy of the checkout (copy_checkout) and, in wheels/, the wheels of the server (which
    carries the client's package) and its dependencies, built by this Python (as the
    Dockerfile says: `pip wheel --wheel-dir wheels .`)."""
    copy_checkout(directory)
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", "wheels", "."],
        cwd=directory)
    return directory


def python_version(image: str) -> str:
    return podman("run", "--rm", *RUN_FLAGS, "--entrypoint", "python3", image, "-c",
                  "import sys; print('%d.%d' % sys.version_info[:2])").stdout.strip()


@contextlib.contextmanager
def built_image(context: Path, base: str) -> Iterator[str]:
    """The image built from the context over `base`, removed afterwards. Docker's format,
    not OCI's, so that the HEALTHCHECK is kept."""
    name = f"localhost/queuelog-test:{uuid.uuid4().hex[:12]}"
    podman("build", *RUN_FLAGS, "--format", "docker", "--build-arg", f"BASE_IMAGE={base}",
           "--tag", name, str(context), timeout=COMMAND_TIMEOUT_SECONDS)
    try:
        yield name
    finally:
        podman("rmi", "--force", name, check=False)
