"""Benchmarks: each script starts what it measures beside its baseline and prints a table."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# An editable install in a shared venv may point at another checkout; these scripts measure
# the code of the tree they live in (and use its tests/servers.py to launch servers).
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
