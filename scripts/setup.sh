#!/usr/bin/env bash
# Installs everything FleetLens needs on a fresh Debian machine, as root (through sudo when
# run as a user); safe to run twice.
# Debian packages only when one is missing; a venv in .venv with the project installed
# editable with every role and the dev tools (which builds the Cython fast path); the LinkPass
# plugin when its sources exist.
set -euo pipefail
source "$(dirname "$0")/root.sh"
cd "$(dirname "$0")/.."

APT_PACKAGES=(iproute2 nftables iptables procps util-linux gcc make python3-dev python3-venv prometheus docker-compose)
PYTHON=${PYTHON:-python3}

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[all,dev]'

if [ -f ext/linkpass/Makefile ]; then
  make -s -C ext/linkpass
fi
echo "setup: ready ($(.venv/bin/fleetlens --version))"
