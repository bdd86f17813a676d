# Sourced first by the scripts that need root (network namespaces, Debian packages), with the
# caller's arguments: as root it does nothing; otherwise it runs the caller again through sudo,
# or says to run it as root (a fresh Debian machine has no sudo).
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    exec sudo -- env ${PYTHON:+"PYTHON=$PYTHON"} bash "$0" "$@"
  fi
  echo "$(basename "$0"): needs root (network namespaces, Debian packages): run it as root" >&2
  exit 1
fi
