"""Huygens sync on the simulator: accuracy per scenario and solve cost, with baselines.

Prints, for a fleet of N hosts (1 NIC each, 8 peers):

- host p99 |offset error| (common mode removed, as in tests/sync) per scenario: software or
  hardware stamps, the simulator's default fabric (each link direction with its own fixed
  delay, i.e. path asymmetry no two-way method can see) or symmetric minimum delays (the
  Huygens assumption, as in the tests), with and without temperature-like drift steps;
- pairwise-only vs network-effect p99 of the edge offset differences;
- solve time per window, and the edge fit vectorized vs one HiGHS LP per edge (the obvious
  implementation) on the same window, with the ratio.

    .venv/bin/python bench/sync_sim.py [--hosts 1024] [--seconds 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sync"))

from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator
from fleetlens.sync import HuygensSync
from fleetlens.sync.edgefit import fit_edges
from sync_helpers import centered_errors, p99, run_sync

from fleetlens.topology import from_spec

SCENARIOS = [
    ("software, symmetric paths", dict(symmetric_paths=True)),
    ("software, default (asymmetric) paths", dict(symmetric_paths=False)),
    ("software, default paths, NIC latencies known", dict(symmetric_paths=False, calibrated=True)),
    ("hardware, symmetric, wander only", dict(ts_source="hardware", temp_step_rate=0.0)),
    ("hardware, symmetric, + temperature steps", dict(ts_source="hardware")),
    ("hardware, default (asymmetric) paths", dict(ts_source="hardware", symmetric_paths=False)),
    (
        "hardware, default paths, NIC latencies known",
        dict(ts_source="hardware", symmetric_paths=False, calibrated=True),
    ),
]


def accuracy(spec: str, seconds: float) -> None:
    topo = from_spec(spec)
    print(f"{'scenario':46s} {'host p99 per window (ns)':>30s} {'pairwise':>9s} {'network':>8s}")
    for name, kw in SCENARIOS:
        run = run_sync(topo, seconds, seed=7, peers=8, **kw)
        per = [
            np.percentile(centered_errors(e, t), 99)
            for e, t in zip(run.est, run.truth, strict=True)
        ]
        cells = " ".join(f"{v:6.1f}" for v in per)
        print(f"{name:46s} {cells:>30s} {p99(run.pairwise):9.1f} {p99(run.network):8.1f}")


def speed(spec: str) -> None:
    topo = from_spec(spec)
    sim = Simulator(topo, SimConfig(peers=8, clock="identity", symmetric_paths=True), seed=7)
    wins = [w.windows.drop(["window"]) for w in sim.stream(3)]
    sync, models, times = HuygensSync(), {}, []
    for w in wins:
        t0 = time.perf_counter()
        models = {m.host_id: m for m in sync(w, topo, models)}
        times.append(time.perf_counter() - t0)
    print(f"\nsolve per window, {len(topo.hosts)} hosts: " + ", ".join(f"{t:.2f} s" for t in times))
    print("  (first window: up to a few passes to put every sender's raw times on one axis)")
    edge_fit_speed(sync)


def edge_fit_speed(sync: HuygensSync) -> None:
    """Vectorized bisection vs one HiGHS LP per edge, on the last window's edges."""
    from scipy.optimize import linprog

    rep = sync.report
    fits = rep.fits
    n = int(fits.a.size)
    rng = np.random.default_rng(0)
    # Rebuild each edge's points from its fitted line: same shapes as the real window.
    sizes_u, sizes_l = fits.n_up, fits.n_low
    edge = np.repeat(np.arange(n), sizes_u + sizes_l)
    upper = np.concatenate([np.r_[np.ones(u, bool), np.zeros(k, bool)]
                            for u, k in zip(sizes_u, sizes_l, strict=True)])  # fmt: skip
    t = rng.uniform(-5e8, 5e8, edge.size)
    d = 1500 + rng.gamma(2.0, 75.0, edge.size)
    y = fits.a[edge] + fits.b[edge] * t + np.where(upper, d, -d)
    t0 = time.perf_counter()
    fit_edges(edge, upper, t, y, n, np.zeros(n))
    vec = time.perf_counter() - t0
    sample = rng.choice(n, min(n, 400), replace=False)
    t0 = time.perf_counter()
    for e in sample:
        m = edge == e
        tu, yu, tl, yl = t[m & upper], y[m & upper], t[m & ~upper], y[m & ~upper]
        a_ub = np.vstack([np.c_[np.ones_like(tu), tu * 1e-9, np.ones_like(tu)],
                          np.c_[-np.ones_like(tl), -tl * 1e-9, np.ones_like(tl)]])  # fmt: skip
        linprog([0, 0, -1], A_ub=a_ub, b_ub=np.r_[yu, -yl], bounds=[(None, None)] * 3)
    lp = (time.perf_counter() - t0) * n / sample.size
    print(f"edge fits, {n} edges: vectorized {vec * 1e3:.0f} ms, one LP per edge "
          f"{lp * 1e3:.0f} ms (timed on {sample.size}, scaled): {lp / vec:.0f}x")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=3)
    args = ap.parse_args()
    leaves = max(2, args.hosts // 32)
    spec = f"leafspine:hosts={args.hosts},nics=1,leaves={leaves},spines=4"
    print(f"fleet: {spec}, 8 peers per NIC, {args.seconds:g} s of 1 s windows\n")
    accuracy(spec, args.seconds)
    speed(spec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
