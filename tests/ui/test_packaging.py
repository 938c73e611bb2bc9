"""The dashboard's templates and stylesheet travel in the built distribution: CI installs the
project without -e and runs the tests against the installed package, where a file missing from
package_data (include_package_data is off) would be a 500 on every page."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.ops.podman import copy_checkout
from tests.servers import REPO_ROOT

UI_FILES = sorted(
    str(path.relative_to(REPO_ROOT))
    for folder in ("templates", "static")
    for path in (REPO_ROOT / "app" / "ui" / folder).rglob("*") if path.is_file())


def test_the_dashboard_has_templates_a_stylesheet_and_one_script() -> None:
    assert "app/ui/static/ui.css" in UI_FILES
    assert "app/ui/templates/ui/base.html" in UI_FILES
    # The live pages' script, and no other (docs/DASHBOARD.md, "Live pages").
    assert [name for name in UI_FILES if name.endswith(".js")] == ["app/ui/static/live.js"]


@pytest.mark.slow
def test_the_built_wheel_carries_every_template_and_the_stylesheet(tmp_path: Path) -> None:
    checkout, wheels = tmp_path / "checkout", tmp_path / "wheels"
    copy_checkout(checkout)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
         "--wheel-dir", str(wheels), str(checkout)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("queuelog-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = set(archive.namelist())
    missing = [name for name in UI_FILES if name not in shipped]
    assert not missing, f"not in the wheel (setup.cfg [options.package_data]): {missing}"
