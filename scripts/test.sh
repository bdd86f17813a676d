#!/usr/bin/env bash
# Sets up and runs the whole test suite, as root (through sudo when run as a user) so the
# network-namespace tests run too.
# Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "$0")/root.sh"
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# The layering contract and the type checker read the installed layout (fleetlens/api/...),
# which the package-dir mapping only makes at install time: they run in a mirror of it.
root=$PWD
tree=$(.venv/bin/python scripts/package_tree.py)
(cd "$tree" && "$root/.venv/bin/lint-imports" --no-cache "$root/pyproject.toml")
(cd "$tree" && "$root/.venv/bin/mypy" --config-file "$root/pyproject.toml" \
  --cache-dir "$root/build/mypy-cache" -p fleetlens)
.venv/bin/mypy --cache-dir build/mypy-cache ext/linkpass/harness
exec .venv/bin/python -m pytest -q "$@"
