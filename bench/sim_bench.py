"""Simulator throughput at fleet scale, against a straightforward per-probe baseline.

    .venv/bin/python bench/sim_bench.py                 # both scenarios, 10 simulated s
    .venv/bin/python bench/sim_bench.py --scenario leafspine --seconds 2

Scenarios (each in its own child process, pinned to one CPU, so peak RSS is its own):
- leafspine: 1024 hosts x 8 NICs (32 leaves, 8 spines, rail wiring), 16 peers, 10 ms rounds;
- fattree:   k=32 fat-tree, 8192 hosts x 1 NIC, 16 peers, 10 ms rounds.

Figures: setup time (plan + ECMP paths), simulated probe pairs per second of wall time (a
"probe pair" is one coded pair sent by one NIC to one peer in one round), window rows, peak RSS
(ru_maxrss) and tracemalloc-free wall time. Windows are generated in memory and dropped
(no Parquet writing).

Baseline: a straightforward implementation of the same model — a Python loop per probe pair
(ECMP pick per flow from topology.ecmp_paths, per-hop queueing and noise draws with
``random``, clock mapping, purity) and per flow-window nearest-rank ``np.percentile`` +
``records.lower_hull`` + ``Window`` objects — timed on the first ``--baseline-pairs`` peer pairs
of the same plan for one window, and extrapolated linearly to the scenario's probe pairs.
The ratio printed is extrapolated baseline CPU time / measured vectorized CPU time. CPU time
(``time.process_time``) is printed next to wall time because the machine may be shared: wall
time then includes waiting for the CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import subprocess
import sys
import time

import numpy as np

SCENARIOS = {
    "leafspine": "leafspine:hosts=1024,nics=8,leaves=32,spines=8",
    "fattree": "fattree:k=32",
}


def _pin_one_core() -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def run_vectorized(spec: str, seconds: float) -> dict[str, float]:
    from fleetlens.fixtures.sim.engine import Simulator

    from fleetlens.topology import from_spec

    t0 = time.perf_counter()
    sim = Simulator(from_spec(spec), seed=1)
    setup = time.perf_counter() - t0
    rows = 0
    t1, c1 = time.perf_counter(), time.process_time()
    for win in sim.stream(seconds):
        rows += win.windows.num_rows
    run, cpu = time.perf_counter() - t1, time.process_time() - c1
    pairs = sim.probes_per_window() * round(seconds)
    return {
        "setup_s": setup,
        "run_s": run,
        "cpu_s": cpu,
        "probe_pairs": pairs,
        "flows": sim.n_flows,
        "rows": rows,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run_baseline(spec: str, n_pairs: int) -> dict[str, float]:
    """Per-probe Python implementation on a slice of the plan, one window."""
    from fleetlens import plan
    from fleetlens.records import Window, lower_hull, windows_to_table
    from fleetlens.topology import from_spec

    topo = from_spec(spec)
    src, dst = plan.peer_pairs(topo, 16, 0)
    src, dst = src[:n_pairs], dst[:n_pairs]
    ports = plan.port_counts(topo, src, dst)
    base = plan.base_ports(src, 0)
    rnd = random.Random(1)
    link_base = {lk.id: rnd.uniform(500, 1500) for lk in topo.links}
    offset = {h: rnd.uniform(-5e7, 5e7) for h in topo.hosts}
    drift = {h: rnd.uniform(-1e5, 1e5) for h in topo.hosts}
    t0, c0 = time.perf_counter(), time.process_time()
    windows: list[Window] = []
    for s, d, c, b in zip(src.tolist(), dst.tolist(), ports.tolist(), base.tolist(), strict=True):
        sn, dn = topo.nics[s], topo.nics[d]
        paths = topo.ecmp_paths(sn.id, dn.id)
        samples: dict[int, list[tuple[int, int, int, bool]]] = {}
        for r in range(100):  # one window of rounds
            sport = b + r % c
            path = paths[hash((sn.ip, dn.ip, sport, plan.PROBE_DPORT)) % len(paths)]
            tx = r * 10_000_000 + 1000.0
            q0 = q1 = 0.0
            for lk in path:
                if rnd.random() < 0.1:
                    q0 += rnd.expovariate(1 / 2000)
                    q1 += q0 * rnd.lognormvariate(0, 0.5)
                q0 += link_base[lk]
                q1 += link_base[lk]
            so, do = offset[sn.host], offset[dn.host]
            sd, dd = drift[sn.host] * 1e-9, drift[dn.host] * 1e-9
            tx0 = round(tx + so + sd * tx - rnd.gammavariate(2, 75))
            tx1 = round(tx + 10_000 + so + sd * tx - rnd.gammavariate(2, 75))
            rx0 = round(tx + q0 + do + dd * tx + rnd.gammavariate(2, 75))
            rx1 = round(tx + 10_000 + q1 + do + dd * tx + rnd.gammavariate(2, 75))
            pure = abs((rx1 - rx0) - (tx1 - tx0)) <= 800
            samples.setdefault(sport, []).append((tx0, rx0 - tx0, rx0 - tx0, pure))
        for sport, pts in samples.items():
            arr = np.array(pts, dtype=np.int64)
            owd = arr[:, 2].astype(float)
            pure = arr[:, 3].astype(bool)
            hull = lower_hull(arr[pure, 0], arr[pure, 1])
            p50, p99 = np.percentile(owd, [50, 99], method="inverted_cdf")  # nearest rank
            windows.append(
                Window(sn.id, dn.id, sport, 0, 10**9, 2 * len(pts), 2 * len(pts),
                       int(pure.sum()), float(owd.min()), float(p50), float(p99),
                       float(owd.max()), arr[pure, 0][hull].tolist(), arr[pure, 1][hull].tolist())
            )  # fmt: skip
    windows_to_table(windows)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"pairs": len(src) * 100, "elapsed_s": elapsed, "cpu_s": cpu, "rows": len(windows)}


def _child(args: list[str]) -> dict[str, float]:
    cmd = [sys.executable, __file__, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--baseline-pairs", type=int, default=400)
    p.add_argument("--child", choices=["vectorized", "baseline"], help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        _pin_one_core()
        if a.child == "vectorized":
            res = run_vectorized(a.spec, a.seconds)
        else:
            res = run_baseline(a.spec, a.baseline_pairs)
        print(json.dumps(res))
        return 0
    names = list(SCENARIOS) if a.scenario == "all" else [a.scenario]
    print(f"one CPU per run; {a.seconds:g} simulated s; baseline on {a.baseline_pairs} pairs")
    for name in names:
        spec = SCENARIOS[name]
        base = _child(["--child", "baseline", "--spec", spec,
                       "--baseline-pairs", str(a.baseline_pairs)])  # fmt: skip
        vec = _child(["--child", "vectorized", "--spec", spec, "--seconds", str(a.seconds)])
        rate = vec["probe_pairs"] / vec["run_s"]
        cpu_rate = vec["probe_pairs"] / vec["cpu_s"]
        base_rate = base["pairs"] / base["cpu_s"]
        extrap = vec["probe_pairs"] / base_rate
        print(f"\n{name}: {spec}")
        print(f"  flows {vec['flows']:,}  window rows {vec['rows']:,}  "
              f"probe pairs {vec['probe_pairs']:,}")  # fmt: skip
        print(f"  setup {vec['setup_s']:.1f} s   run {vec['run_s']:.1f} s wall "
              f"({rate / 1e6:.2f} M probe pairs/s), {vec['cpu_s']:.1f} s CPU "
              f"({cpu_rate / 1e6:.2f} M/s)   peak RSS {vec['peak_rss_mb']:.0f} MB")  # fmt: skip
        print(f"  26 M probe pairs: {26e6 / rate:.1f} s wall, {26e6 / cpu_rate:.1f} s CPU")
        print(f"  baseline (per-probe Python): {base_rate / 1e3:.1f} k pairs/s CPU "
              f"-> {extrap / 60:.1f} min CPU extrapolated; "
              f"ratio {extrap / vec['cpu_s']:.0f}x (CPU time)")  # fmt: skip
        if not math.isfinite(rate):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
