#!/usr/bin/env bash
# Sets up and runs the whole test suite (as root, so the network-namespace tests run too).
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest -q "$@"
