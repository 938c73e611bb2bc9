#!/bin/sh
# The serving worker (queuelog_gunicorn/worker.py) overrides gunicorn's gthread worker and
# leans on its internals (docs/OPERATIONS.md, "Slow clients"), so it is tested against every
# gunicorn release setup.cfg admits, not only the newest, which .venv-test holds: each other
# release gets a venv of its own with the project installed beside it, and the worker's tests
# run there. Arguments go to pytest. Run after scripts/test.sh (which makes .venv-test).
set -eu
cd "$(dirname "$0")/.."
requirement=$(.venv-test/bin/python - <<'PY'
import configparser
cfg = configparser.ConfigParser()
cfg.read("setup.cfg")
lines = cfg["options"]["install_requires"].splitlines()
print(next(line.strip() for line in lines if line.strip().startswith("gunicorn")))
PY
)
installed=$(.venv-test/bin/python -c 'import gunicorn; print(gunicorn.__version__)')
releases=$(.venv-test/bin/python - "$requirement" <<'PY'
import re, subprocess, sys
from packaging.requirements import Requirement
requirement = Requirement(sys.argv[1])
listing = subprocess.run([sys.executable, "-m", "pip", "index", "versions", requirement.name],
                         capture_output=True, text=True, check=True).stdout
versions = re.search(r"Available versions: (.*)", listing).group(1).split(", ")
print(" ".join(v for v in versions if requirement.specifier.contains(v)))
PY
)
echo "gunicorn releases admitted by \"$requirement\": $releases (installed: $installed)"
for release in $releases; do
  [ "$release" = "$installed" ] && continue
  venv=$(mktemp -d)/venv
  python3 -m venv "$venv"
  # setuptools packs whatever an earlier build left in build/lib into the wheel it makes.
  rm -rf build client/build
  "$venv/bin/python" -m pip install --quiet ".[test]" "gunicorn==$release"
  echo "gunicorn $release:"
  "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/ops/test_slow_clients.py \
    tests/ops/test_serving_worker.py tests/ops/test_framing.py tests/test_problem_types.py "$@"
  rm -rf "$(dirname "$venv")"
done
