"""Huygens sync on the simulator: accuracy per scenario and solve cost, with baselines.

Prints, for a fleet of N hosts (1 NIC each, 8 peers):

- per window, host p99 |offset error| (common mode removed, as in tests/sync) per scenario:
  software or hardware stamps, the simulator's default fabric (each link direction with its
  own fixed delay, i.e. path asymmetry no two-way method can see) or symmetric minimum delays
  (the Huygens assumption, as in the tests), with and without temperature-like drift steps;
- per window, pairwise-only vs network-effect p99 of the edge offset differences;
- with drift steps on: the steady hosts' p99 per window, and the hosts whose drift stepped
  into or out of a window (the transient) apart, with their worst error;
- solve time per window, and the edge fit vectorized vs one HiGHS LP per edge (the obvious
  implementation) on the same window, with the ratio.

    nice -n 15 .venv/bin/python bench/sync_sim.py [--hosts 1024] [--seconds 3] [--only TEXT]
        [--no-speed]
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
from sync_helpers import centered_errors, drift_transients, p99, per_window_p99, run_sync

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


def accuracy(spec: str, seconds: float, only: str | None) -> None:
    topo = from_spec(spec)
    print("per window, ns: host p99 |offset error| (common mode removed); edge p99 |error| of")
    print("the offset differences, pairwise-only (each edge's own fit) and after the network")
    print("effect; hosts whose drift stepped into or out of the window (> 80 ppb change of the")
    print("window-mean drift: a bent clock no line per window follows) scored apart\n")
    for name, kw in SCENARIOS:
        if only and only not in name:
            continue
        run = run_sync(topo, seconds, seed=7, peers=8, **kw)
        per = [
            np.percentile(centered_errors(e, t), 99)
            for e, t in zip(run.est, run.truth, strict=True)
        ]
        print(f"{name}  (whole run: pairwise {p99(run.pairwise):.1f}, network "
              f"{p99(run.network):.1f})")  # fmt: skip
        _row("host p99", per)
        _row("edge p99 pairwise-only", per_window_p99(run.pairwise))
        _row("edge p99 network effect", per_window_p99(run.network))
        if kw.get("temp_step_rate", 1.0) and len(run.est) > 2:
            _transients(run)
        print()


def _row(label: str, vals) -> None:
    print(f"  {label:26s} " + " ".join(f"{v:6.1f}" for v in vals))


def _transients(run) -> None:
    """Steady hosts per window, and the drift-step transient apart (see the header)."""
    bent = drift_transients(run)
    steady, hit, after = [], [], []
    for w in range(bent.shape[0]):
        err = run.est[w] - run.truth[w]
        err = np.abs(err - np.nanmean(err[~bent[w]]))
        steady.append(np.percentile(err[~bent[w]], 99))
        hit.append(err[bent[w]])
        if w:
            after.append(err[bent[w - 1] & ~bent[w]])
    _row("host p99, steady hosts", steady)
    hit, after = np.concatenate(hit), np.concatenate(after)
    print(f"  transient: {hit.size} host-windows of {bent.size} "
          f"({bent.sum(axis=1).min()}-{bent.sum(axis=1).max()} hosts per window), "
          f"|error| p50 {np.median(hit):.1f} max {hit.max():.1f}; the window after: "
          f"{after.size} hosts, max {after.max() if after.size else float('nan'):.1f}")  # fmt: skip


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
    ap.add_argument("--only", help="scenarios whose name contains this text")
    ap.add_argument("--no-speed", action="store_true", help="accuracy only")
    args = ap.parse_args()
    leaves = max(2, args.hosts // 32)
    spec = f"leafspine:hosts={args.hosts},nics=1,leaves={leaves},spines=4"
    print(f"fleet: {spec}, 8 peers per NIC, {args.seconds:g} s of 1 s windows\n")
    accuracy(spec, args.seconds, args.only)
    if not args.no_speed:
        speed(spec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
