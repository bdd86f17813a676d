"""What the store's window reads cost (issue 29 point 2): this tree against a git revision.

    .venv/bin/python bench/store_reads.py --hosts 1024 --seconds 3 --against main

Stores ``--seconds`` of the collector_bench agents' fleet (one ~910-row batch per host per
window second) through the store's own insert path, in commits of 128 batches, one DuckDB
thread, then times each read the collector makes of the windows table (best of ``--repeat``,
wall ms; one thread, so wall is CPU):

- ``flow totals``: ``/v1/flows``'s period aggregate over every stored second, and ``with the
  cut``: less the host-seconds of a stall rule that marks some (the audit's read);
- ``host stalls``: that rule's query;
- ``pair history``: one NIC pair's per-second buckets over the period;
- ``look-back``: the clock round's read of the period without paths (``windows_between``);
- ``triangulation window``: one generation without hulls (``window_at``);
- ``first seen``: each host's first window (``first_window_per_host``).

``--against REV`` runs the same script under that revision's tree (as collector_bench's
``--against``) on the same batches and prints the ratio this tree / REV per read.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from collector_bench import AGENT_BATCH_ROWS, Fleet, make_batches, revision_env
from fleetlens.api.store import StallRule, Store

GROUP = 128
# marks the host-seconds losing more than the fleet's typical 5e-5 of their probes
RULE = StallRule(loss=5e-5, spread=1e-3, max_share=1.0)


def best_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def measure(work: Path, hosts: int, seconds: int, repeat: int) -> dict[str, float]:
    fleet = Fleet(hosts)
    batches = make_batches(seconds * hosts * AGENT_BATCH_ROWS, AGENT_BATCH_ROWS, 1, hosts, fleet)
    store = Store(work / "reads.duckdb", threads=1)
    for i in range(0, len(batches), GROUP):
        store.insert_windows_raw(pa.concat_tables([t for _, t in batches[i : i + GROUP]]))
    first = batches[0][1]
    lo = first["start_ns"][0].as_py()
    hi = lo + seconds * 10**9
    src, dst = first["src_nic"][0].as_py(), first["dst_nic"][0].as_py()
    stalls = store.host_stalls(lo, hi, RULE)
    cut = stalls.filter(stalls["excluded"])
    out = {
        "flow totals": best_ms(lambda: store.flow_totals(lo, hi), repeat),
        "flow totals with the cut": best_ms(lambda: store.flow_totals(lo, hi, cut), repeat),
        "host stalls": best_ms(lambda: store.host_stalls(lo, hi, RULE), repeat),
        "pair history": best_ms(lambda: store.pair_series(src, dst, lo, hi, 10**9), repeat),
        "look-back (no paths)": best_ms(
            lambda: store.windows_between(lo, hi, without=("path",)), repeat
        ),
        "triangulation window (no hulls)": best_ms(
            lambda: store.window_at(lo, without=("hull_t_ns", "hull_owd_ns")), repeat
        ),
        "first seen": best_ms(lambda: store.first_window_per_host(lo - 1), repeat),
    }
    store.close()
    print(f"  {len(batches)} batches, {len(batches) * AGENT_BATCH_ROWS:,} rows, "
          f"{len(cut)} host-seconds cut", file=sys.stderr)  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--hosts", type=int, default=1024)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--against", metavar="REV")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the REV run
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        mine = measure(work, a.hosts, a.seconds, a.repeat)
        if a.json:
            print(json.dumps(mine))
            return 0
        old: dict[str, float] = {}
        if a.against:
            env = {**os.environ, **revision_env(a.against, work)}
            env["PYTHONPATH"] += os.pathsep + str(Path(__file__).parent)  # collector_bench
            argv = ["--hosts", str(a.hosts), "--seconds", str(a.seconds), "--repeat",
                    str(a.repeat), "--json"]  # fmt: skip
            got = subprocess.run([sys.executable, __file__, *argv], env=env, check=True,
                                 capture_output=True, text=True).stdout  # fmt: skip
            old = json.loads(got.splitlines()[-1])
    for name, ms in mine.items():
        line = f"{name:<34} {ms:9.1f} ms"
        if name in old:
            line += f"   {a.against}: {old[name]:9.1f} ms   ratio this tree / {a.against} "
            line += f"{ms / old[name]:.2f}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
