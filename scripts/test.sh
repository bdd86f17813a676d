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
# Two phases, each with the caller's arguments (tests/conftest.py says which test goes where):
# the tests that may share the machine on 3 workers, then the lab and clock-bound ones alone.
# Three on 2 cores: those tests wait on sockets and child processes part of the time, so 2
# workers kept 1.4 cores busy (478 s) and 3 keep 1.9 (312 s, the same tests passing).
# The workers take whole modules (loadscope), so a module's collector or cluster starts once.
# A phase that selects nothing (exit 5) is fine when the other ran tests; with -x or
# --maxfail a failed first phase ends the run, as does Ctrl-C (exit 2, also xdist's -x).
# The log ends with the serial phase's durations and summary, then both phases' summaries.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
codes=()
for phase in parallel serial; do
  workers=()
  [ "$phase" = parallel ] && workers=(-n 3 --dist loadscope)
  set +e
  .venv/bin/python -m pytest -q "${workers[@]}" --phase="$phase" "$@" | tee "$logs/$phase"
  code=${PIPESTATUS[0]}
  set -e
  codes+=("$code")
  if ((code == 2)) || { ((code != 0 && code != 5)) && [[ " $* " =~ \ (-x|--exitfirst|--maxfail) ]]; }; then
    break  # interrupted, or told to stop at the first failures
  fi
done
for phase in parallel serial; do
  [ -s "$logs/$phase" ] && echo "$phase phase: $(tail -n 1 "$logs/$phase")"
done
status=5
for code in "${codes[@]}"; do
  if ((code != 0 && code != 5)); then
    exit "$code"
  fi
  ((code == 0)) && status=0
done
exit "$status"
