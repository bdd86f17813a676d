"""FleetLens triangulation vs 007 and NetBouncer on the same simulated traces (issue 7).

    .venv/bin/python bench/triangulate_accuracy.py                      # small fabric, all
    .venv/bin/python bench/triangulate_accuracy.py --trials 0.1 \
        --topo leafspine:hosts=1024,nics=8,leaves=32,spines=8          # reference fabric

For every scenario: precision / recall / F1 at the scenario's deadline (summed over trials) and
the median time to localize (first window whose reported set equals the truth, counted from
the fault's start) for each method. FleetLens counts subjects in state 'faulty' (links and
switches); the baselines count the links they blame on probe counts summed since the start.
Sub-second scenarios use the simulator's window length (30 ms = 3 probing rounds).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).parent))
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator
from fleetlens.triangulate.engine import Triangulator
from fleetlens.triangulate.paths import PathModel
from fleetlens.triangulate.store import FlowStore
from triangulate_baselines import netbouncer, vote_007

from fleetlens.records import WINDOW_SCHEMA
from fleetlens.topology import Topology, from_spec

METHODS = ("fleetlens", "007", "netbouncer")
STEADY = {"clock": "identity", "max_drift_ppb": 0.0, "drift_walk_ppb": 0.0, "temp_step_rate": 0.0}


@dataclass
class Scenario:
    name: str
    trials: int
    seconds: float
    window_s: float
    start_s: float
    make: object  # (rng, topo) -> (fault specs, truth subjects or None for host-only)
    paths: str = "known"
    sim: dict | None = None


def _fabric(topo: Topology) -> list[str]:
    return [lk.id for lk in topo.links if lk.tier == "fabric"]


def _one(spec: str):
    def make(rng, topo):
        link = rng.choice(_fabric(topo))
        return (spec.format(link=link),), {link}

    return make


def _multi(rng, topo, start=0.0):
    k = int(rng.integers(1, 11))
    bad = rng.choice(_fabric(topo), k, replace=False)
    return tuple(f"{b}:loss={rng.uniform(0.002, 0.02):.4f}:start_s={start}" for b in bad), set(bad)


def _switch(rng, topo):
    sw = rng.choice([s.id for s in topo.switches if s.id.startswith("spine")])
    return (f"{sw}:fail:start_s=1",), {sw}


def _host(rng, topo):
    nic = rng.choice([n.id for n in topo.nics])
    host = nic.split("/")[0]
    kind = rng.integers(3)
    spec = [f"{nic}:drop=0.3:start_s=1", f"{host}:stall:start_s=1,end_s=2.5",
            f"{host}:clock_step_us=1000:start_s=2"][kind]  # fmt: skip
    return (spec,), None


def scenarios(scale: float) -> list[Scenario]:
    def n(k: int) -> int:
        return max(1, round(k * scale))

    return [
        Scenario("black hole, 3 rounds", n(100), 0.03, 0.03, 0.0, _one("{link}:blackhole")),
        Scenario("loss 0.1%, 3 s", n(5), 3, 1, 0.0, _one("{link}:loss=0.001")),
        Scenario("loss 0.01%, 30 s", n(2), 30, 1, 0.0, _one("{link}:loss=0.0001")),
        Scenario("1-10 links 0.2-2%, 10 s", n(6), 10, 1, 0.0, _multi),
        Scenario("delay 10us, 100 ms", n(10), 2.1, 0.1, 2.0,
                 _one("{link}:delay_us=10:start_s=2")),
        Scenario("delay 2us, 1 s", n(10), 4, 1, 3.0, _one("{link}:delay_us=2:start_s=3")),
        Scenario("failed spine", n(4), 3, 1, 1.0, _switch),
        Scenario("host-side only", n(9), 5, 1, 1.0, _host, sim=STEADY),
        Scenario("ECMP unknown-but-stable", n(6), 10, 1, 0.0, _multi, paths="first"),
        Scenario("ECMP never known", n(6), 10, 1, 0.0, _multi, paths="unknown"),
    ]  # fmt: skip


def run_trial(topo: Topology, sc: Scenario, faults, seed: int):
    cfg = SimConfig(
        faults=faults, paths_known=sc.paths != "unknown", window_ns=round(sc.window_s * 1e9),
        **(sc.sim or {}),
    )  # fmt: skip
    tri, pm = Triangulator(topo), PathModel(topo)
    cum = FlowStore({"sent": (np.float64, 0.0, 0), "lost": (np.float64, 0.0, 0)})
    prev: dict = {}
    per_window = []
    for w in Simulator(topo, cfg, seed=seed).stream(sc.seconds):
        t = w.windows.select(WINDOW_SCHEMA.names)
        if sc.paths == "first" and w.index > 0:
            t = t.set_column(t.schema.get_field_index("path"), "path",
                             pa.nulls(t.num_rows, t["path"].type))  # fmt: skip
        verdicts = tri(t, topo, prev)
        prev = {v.subject: v for v in verdicts}
        ours = {v.subject for v in verdicts
                if v.state == "faulty" and v.kind in ("link", "switch")}  # fmt: skip
        v007, nb = _baselines(pm, cum, pm.frame(t))
        end_s = (w.index + 1) * sc.window_s
        per_window.append((end_s, {"fleetlens": ours, "007": v007, "netbouncer": nb}))
    return per_window


def _baselines(pm: PathModel, cum: FlowStore, f) -> tuple[set[str], set[str]]:
    """007 and NetBouncer on per-flow counts summed since the start (their best setting).
    Both only ever touch lossy flows and the flows crossing links those flows cross, so only
    those rows' incidence entries are expanded (the same answer as the full incidence)."""
    at = cum.locate(f.key)
    cum.cols["sent"][at] += f.sent
    cum.cols["lost"][at] += f.lost
    inc = f.inc if cum.aligned(f.key) else pm.incidence(cum.keys)
    s, lo = cum.cols["sent"], cum.cols["lost"]
    lossy = np.flatnonzero(lo > 0)
    ids = pm.link_ids
    row, link, wt = inc.entries(lossy)
    v007 = {ids[i] for i in vote_007(row, link, wt, s[lossy], lo[lossy], pm.n_links)}
    near = inc.rows_of(np.unique(link))
    row, link, _ = inc.entries(near)
    nb = {ids[i] for i in netbouncer(row, link, s[near], lo[near], pm.n_links)}
    return v007, nb


def evaluate(topo: Topology, sc: Scenario, seed0: int) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(seed0)
    tot = {m: [0, 0, 0] for m in METHODS}
    ttl = {m: [] for m in METHODS}
    false = {m: 0 for m in METHODS}
    windows = 0
    for trial in range(sc.trials):
        faults, truth = sc.make(rng, topo)
        per_window = run_trial(topo, sc, faults, seed0 * 1000 + trial)
        windows += len(per_window)
        for m in METHODS:
            if truth is None:
                false[m] += sum(len(got[m]) for _, got in per_window)
                continue
            got = per_window[-1][1][m]
            tot[m][0] += len(got & truth)
            tot[m][1] += len(got - truth)
            tot[m][2] += len(truth - got)
            hit = [e for e, g in per_window if g[m] == truth and e > sc.start_s]
            if hit:
                ttl[m].append(hit[0] - sc.start_s)
    out = {}
    for m in METHODS:
        tp, fp, fn = tot[m]
        p = tp / (tp + fp) if tp + fp else 1.0
        r = tp / (tp + fn) if tp + fn else 1.0
        f1 = 2 * p * r / (p + r) if p + r else 0.0
        found = len(ttl[m]) / sc.trials
        med = float(np.median(ttl[m])) if ttl[m] else float("nan")
        out[m] = {"p": p, "r": r, "f1": f1, "ttl": med, "found": found,
                  "false_per_100w": 100 * false[m] / windows}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topo", default="leafspine:hosts=32,nics=2,leaves=8,spines=4")
    ap.add_argument("--trials", type=float, default=1.0, help="scale of the trial counts")
    ap.add_argument("--only", default="", help="run scenarios whose name contains this")
    args = ap.parse_args(argv)
    topo = from_spec(args.topo)
    print(f"fabric {args.topo}: {len(topo.nics)} NICs, {len(topo.links)} directed links")
    print(f"{'scenario':28s} {'method':11s} {'P':>6s} {'R':>6s} {'F1':>6s} "
          f"{'t_localize':>10s} {'found':>6s} {'false/100w':>10s}")  # fmt: skip
    for i, sc in enumerate(scenarios(args.trials)):
        if args.only and args.only not in sc.name:
            continue
        t0 = time.time()
        res = evaluate(topo, sc, 1 + i)
        for m in METHODS:
            r = res[m]
            print(f"{sc.name:28s} {m:11s} {r['p']:6.3f} {r['r']:6.3f} {r['f1']:6.3f} "
                  f"{r['ttl']:9.2f}s {r['found']:6.2f} {r['false_per_100w']:10.2f}")  # fmt: skip
        print(f"{'':28s} ({sc.trials} trials, {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
