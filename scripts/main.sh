#!/usr/bin/env bash
# FleetLens's main job on the embedded defaults: `fleetlens demo` on the lab fabric (8 hosts ×
# 2 NICs, 4 leaves, 2 spines) with the DuckDB collector — sync, localize an injected fault,
# a LinkPass transfer across a pulled NIC — then everything is torn down.
# Runs as root (network namespaces; through sudo when run as a user); safe to run twice.
# Extra arguments go to 'demo' (e.g. --keep, --json, --fault delay --fault-value 200).
set -euo pipefail
source "$(dirname "$0")/root.sh"
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
exec fleetlens demo "$@"
