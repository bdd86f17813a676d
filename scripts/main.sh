#!/usr/bin/env bash
# FleetLens's main job on the embedded defaults: build the lab fabric (8 hosts × 2 NICs,
# 4 leaves, 2 spines), show its status, prove all-pairs reachability, tear it down.
# Runs as root (network namespaces); safe to run twice. Extra arguments go to 'lab up'.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
LAB=${FLEETLENS_LAB:-fl}

fleetlens lab --name "$LAB" down >/dev/null  # leftovers of an earlier, interrupted run
trap 'fleetlens lab --name "$LAB" down' EXIT
fleetlens lab --name "$LAB" up "$@"
fleetlens lab --name "$LAB" status
fleetlens lab --name "$LAB" ping
