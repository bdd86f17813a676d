"""FleetLens triangulation vs 007 and NetBouncer on the same simulated traces (issue 7).

    .venv/bin/python bench/triangulate_accuracy.py                        # small fabric, all
    nice -n 15 .venv/bin/python bench/triangulate_accuracy.py --topo reference \
        --scenario blackhole --trials 100                                  # one claim, at scale

``--topo reference`` is the issue's fabric (leafspine:hosts=1024,nics=8,leaves=32,spines=8,
16 peers per NIC at 10 ms). ``--scenario`` takes a comma list of scenario keys (see
``--list``); ``--trials N`` runs N trials of each (default: the scenario's own count times
``--scale``). Trials of one scenario are reproducible: trial i always draws the same fault and
simulator seed, whatever else runs in the same command.

Scoring, per scenario and method, against the simulator's injected truth:

- precision / recall / F1 summed over trials at the scenario's deadline (the last window), with
  a one-sided 95 % Clopper-Pearson lower bound on precision and recall (treating subjects as
  independent draws; with n trials and no miss the bound is 0.05^(1/n));
- ``found``: trials whose reported set equals the truth at the deadline, and the median / worst
  time to localize (first window after the fault's start whose reported set equals the truth);
- delay scenarios: FleetLens's excess-delay estimate over the injected delay (worst |err|);
  with paths never reported (``delay2-never``) the truth is the delayed link's ECMP group,
  which is all any method can name from end-to-end delays;
- host-side scenarios: false link alarms per 100 windows (links or switches not touching the
  faulty host) and the share of faults attributed to the right host / NIC.

FleetLens counts subjects (links, switches, NICs, hosts) in state ``faulty`` — in the
sub-second delay scenarios, where the deadline is the first window of the fault, any reported
subject (``suspect`` or ``faulty``: "found", the verdict needs a second window to harden).
The baselines blame links on probe counts summed since the start (their most favourable
setting); links covering ``device_fraction`` of a switch's fabric links are folded into the
switch for them too, and on host-side scenarios a blamed access link of the faulty NIC counts
as attributing it (the nearest they can say). Neither baseline sees delay.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
from scipy.stats import beta

sys.path.insert(0, str(Path(__file__).parent))
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator
from fleetlens.triangulate.config import TriangulateConfig
from fleetlens.triangulate.engine import Triangulator
from fleetlens.triangulate.paths import PathModel
from fleetlens.triangulate.store import FlowStore
from triangulate_baselines import netbouncer, vote_007

from fleetlens.ids import split_link_id
from fleetlens.records import WINDOW_SCHEMA, Verdict
from fleetlens.topology import TIER_LEAF, Topology, from_spec

METHODS = ("fleetlens", "007", "netbouncer")
REFERENCE = "leafspine:hosts=1024,nics=8,leaves=32,spines=8"
STEADY = {"clock": "identity", "max_drift_ppb": 0.0, "drift_walk_ppb": 0.0, "temp_step_rate": 0.0}


@dataclass
class Scenario:
    key: str
    name: str
    trials: int
    seconds: float
    window_s: float
    start_s: float
    make: object  # (rng, topo) -> (fault specs, truth subjects or None for host-only)
    seed: int  # scenarios with the same seed draw the same faults (paired comparisons)
    paths: str = "known"
    sim: dict = field(default_factory=dict)
    states: tuple[str, ...] = ("faulty",)  # FleetLens verdict states that count as blamed


def _fabric(topo: Topology) -> list[str]:
    return [lk.id for lk in topo.links if lk.tier == "fabric"]


def _one(spec: str):
    def make(rng, topo):
        link = str(rng.choice(_fabric(topo)))
        return (spec.format(link=link),), {link}

    return make


def _multi(rng, topo):
    k = int(rng.integers(1, 11))
    bad = [str(b) for b in rng.choice(_fabric(topo), k, replace=False)]
    return tuple(f"{b}:loss={rng.uniform(0.002, 0.02):.4f}" for b in bad), set(bad)


def _group_delay(rng, topo):
    """2 us on one leaf uplink or downlink whose paths are never reported. The identifiable
    answer is its ECMP group (the leaf's uplinks, or the downlinks into it; see
    triangulate/ecmp.py), every member at confidence 1/N: that group is the truth here."""
    link = str(rng.choice(_fabric(topo)))
    a, b = split_link_id(link)
    leaf = {s.id for s in topo.switches if s.tier == TIER_LEAF}
    if a in leaf:
        group = {lk for lk in _fabric(topo) if split_link_id(lk)[0] == a}
    else:
        group = {lk for lk in _fabric(topo) if split_link_id(lk)[1] == b}
    return (f"{link}:delay_us=2:start_s=3",), group


def _switch(rng, topo):
    sw = str(rng.choice([s.id for s in topo.switches if s.id.startswith("spine")]))
    return (f"{sw}:fail:start_s=1",), {sw}


def _host(rng, topo):
    nic = str(rng.choice([n.id for n in topo.nics]))
    host = nic.split("/")[0]
    kind = int(rng.integers(3))
    spec = [f"{nic}:drop=0.3:start_s=1", f"{host}:stall:start_s=1,end_s=2.5",
            f"{host}:clock_step_us=1000:start_s=2"][kind]  # fmt: skip
    return (spec,), None


def scenarios() -> list[Scenario]:
    reported = ("suspect", "faulty")
    return [
        Scenario("blackhole", "black hole, 3 rounds", 100, 0.03, 0.03, 0.0,
                 _one("{link}:blackhole"), 1),
        Scenario("loss0.1", "loss 0.1%, 3 s", 20, 3, 1, 0.0, _one("{link}:loss=0.001"), 2),
        Scenario("loss0.01", "loss 0.01%, 30 s", 10, 30, 1, 0.0, _one("{link}:loss=0.0001"), 3),
        Scenario("multi", "1-10 links 0.2-2%, 10 s", 20, 10, 1, 0.0, _multi, 4),
        Scenario("delay10", "delay 10us, 100 ms", 20, 2.1, 0.1, 2.0,
                 _one("{link}:delay_us=10:start_s=2"), 5, states=reported),
        Scenario("delay2", "delay 2us, 1 s", 20, 4, 1, 3.0,
                 _one("{link}:delay_us=2:start_s=3"), 6, states=reported),
        Scenario("switch", "failed spine", 10, 3, 1, 1.0, _switch, 7),
        # paths never reported: the truth is the delayed link's ECMP group (_group_delay)
        Scenario("delay2-never", "delay 2us, paths never known", 10, 5, 1, 3.0,
                 _group_delay, 9, paths="unknown", states=reported),
        Scenario("host", "host-side only", 30, 5, 1, 1.0, _host, 8, sim=STEADY),
        # same seed as 'multi': the same faults and simulator seeds, paths reported only in
        # the first window (the agent's traceroute), so the F1 difference is paired
        Scenario("ecmp", "ECMP unknown-but-stable", 20, 10, 1, 0.0, _multi, 4, paths="first"),
        Scenario("ecmp-never", "ECMP never known", 6, 10, 1, 0.0, _multi, 4, paths="unknown"),
    ]  # fmt: skip


# ---- one trial --------------------------------------------------------------------------------
@dataclass
class Window:
    end_s: float
    got: dict[str, set[str]]  # method -> blamed subjects
    ours: dict[str, Verdict]  # FleetLens non-healthy verdicts


def run_trial(topo: Topology, sc: Scenario, faults, seed: int) -> dict[str, list[Window]]:
    """Per path mode, FleetLens and the baselines window by window. The ECMP scenario runs
    its two modes (paths known; reported in the first window only) on one simulated stream —
    the same probes, so the F1 difference is the paths' alone; the baselines run on the
    first mode only (the ECMP claim is about FleetLens)."""
    cfg = SimConfig(
        faults=faults, paths_known=sc.paths != "unknown", window_ns=round(sc.window_s * 1e9),
        **sc.sim,
    )  # fmt: skip
    modes = ("known", "first") if sc.paths == "first" else (sc.paths,)
    tris = {mode: Triangulator(topo) for mode in modes}
    fold = _Folder(topo, tris[modes[0]].cfg)
    cum = FlowStore({"sent": (np.float64, 0.0, 0), "lost": (np.float64, 0.0, 0)})
    prev: dict[str, dict] = {mode: {} for mode in modes}
    out: dict[str, list[Window]] = {mode: [] for mode in modes}
    n_windows = round(sc.seconds * 1e9) // cfg.window_ns
    base: tuple[set[str], set[str]] = (set(), set())
    for w in Simulator(topo, cfg, seed=seed).stream(sc.seconds):
        table = w.windows.select(WINDOW_SCHEMA.names)
        for mode in modes:
            t = table
            if mode == "first" and w.index > 0:
                t = t.set_column(t.schema.get_field_index("path"), "path",
                                 pa.nulls(t.num_rows, t["path"].type))  # fmt: skip
            tri = tris[mode]
            verdicts = tri(t, topo, prev[mode])
            prev[mode] = {v.subject: v for v in verdicts}
            bad = {v.subject: v for v in verdicts if v.state != "healthy"}
            got = {"fleetlens": {s for s, v in bad.items() if v.state in sc.states}}
            if mode == modes[0]:  # the engine's decoded frame of this table (cached layout)
                f = tri.paths.frame(t)
                _accumulate(cum, f)
                if _judged(w.index, n_windows):
                    base = tuple(fold(x) for x in _baselines(tri.paths, cum, f))
                got |= {"007": base[0], "netbouncer": base[1]}
            out[mode].append(Window((w.index + 1) * sc.window_s, got, bad))
    return out


class _Folder:
    """The engine's device rule applied to a baseline's blamed links (generous to them)."""

    def __init__(self, topo: Topology, cfg: TriangulateConfig) -> None:
        sw = {s.id for s in topo.switches}
        self.fabric = {s: set() for s in sw}
        for lk in topo.links:
            if lk.a in sw and lk.b in sw:
                self.fabric[lk.a].add(lk.id)
                self.fabric[lk.b].add(lk.id)
        self.frac = cfg.device_fraction

    def __call__(self, links: set[str]) -> set[str]:
        out = set(links)
        for s, fab in self.fabric.items():
            if fab and len(fab & links) >= self.frac * len(fab):
                out = (out - fab) | {s}
        return out


def _accumulate(cum: FlowStore, f) -> None:
    at = cum.locate(f.key)
    cum.cols["sent"][at] += f.sent
    cum.cols["lost"][at] += f.lost


def _judged(index: int, n_windows: int) -> bool:
    """Windows the baselines are fitted on: all of short runs; on long ones the 1st, 2nd, 3rd,
    5th, 10th, 20th, 30th and the last (NetBouncer's coordinate descent is a Python loop over
    thousands of links per window at reference scale; their time to localize is then an upper
    bound at this granularity, their deadline result exact)."""
    return n_windows <= 5 or index + 1 in (1, 2, 3, 5, 10, 20, 30, n_windows)


def _baselines(pm: PathModel, cum: FlowStore, f) -> tuple[set[str], set[str]]:
    """007 and NetBouncer on per-flow counts summed since the start (their best setting).
    Both only ever touch lossy flows and the flows crossing links those flows cross, so only
    those rows' incidence entries are expanded (the same answer as the full incidence)."""
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


# ---- scoring ----------------------------------------------------------------------------------
def cp_lower(k: int, n: int, alpha: float = 0.05) -> float:
    """One-sided Clopper-Pearson lower confidence bound of a binomial share k/n."""
    return float(beta.ppf(alpha, k, n - k + 1)) if 0 < k <= n else 0.0


@dataclass
class Tally:
    tp: int = 0
    fp: int = 0
    fn: int = 0
    found: int = 0
    ttl: list[float] = field(default_factory=list)
    false_alarms: int = 0  # host-side: links/switches not touching the faulty host
    attributed: int = 0  # host-side: faults named on the right host / NIC

    def row(self, trials: int, windows: int) -> dict[str, float]:
        tp, fp, fn = self.tp, self.fp, self.fn
        p = tp / (tp + fp) if tp + fp else 1.0
        r = tp / (tp + fn) if tp + fn else 1.0
        return {
            "tp": tp, "fp": fp, "fn": fn, "p": p, "r": r,
            "f1": 2 * p * r / (p + r) if p + r else 0.0,
            "p_lo95": cp_lower(tp, tp + fp) if tp + fp else 1.0,
            "r_lo95": cp_lower(tp, tp + fn) if tp + fn else 1.0,
            "found": self.found / trials,
            "ttl_med": float(np.median(self.ttl)) if self.ttl else float("nan"),
            "ttl_max": float(np.max(self.ttl)) if self.ttl else float("nan"),
            "false_per_100w": 100 * self.false_alarms / max(windows, 1),
            "attributed": self.attributed / trials,
        }  # fmt: skip


def _host_side(topo: Topology, faults, per_window: list[Window], m: str, t: Tally) -> None:
    """False link alarms (links/switches not touching the faulty host) and attribution."""
    target = faults[0].split(":")[0]
    host = target.split("/")[0]
    nics = {target} if "/" in target else {n.id for n in topo.nics_by_host[host]}
    own_links = {lk.id for lk in topo.links if lk.a in nics or lk.b in nics}
    right = {host} | nics
    named_right = False
    for w in per_window:
        if m == "fleetlens":
            links = {s for s, v in w.ours.items()
                     if v.kind in ("link", "switch") and v.state == "faulty"}  # fmt: skip
            named = {s for s, v in w.ours.items() if v.kind in ("nic", "host")} & right
        else:
            links, named = w.got[m], w.got[m] & own_links
        t.false_alarms += len(links - own_links)
        named_right |= bool(named)
    t.attributed += named_right


def evaluate(
    topo: Topology, sc: Scenario, trials: int, verbose: bool, first: int = 0
) -> dict[str, dict]:
    """Per path mode (one, or two for the ECMP scenario): per method, the scores of trials
    ``first .. first + trials - 1``."""
    tally: dict[str, dict[str, Tally]] = {}
    windows, errs = 0, []
    for trial in range(first, first + trials):
        rng = np.random.default_rng([sc.seed, trial])  # trial i: the same draw in any run
        faults, truth = sc.make(rng, topo)
        runs = run_trial(topo, sc, faults, sc.seed * 1000 + trial)
        line = []
        for mode, per_window in runs.items():
            if mode == next(iter(runs)):
                windows += len(per_window)
            for m in per_window[0].got:
                t = tally.setdefault(mode, {}).setdefault(m, Tally())
                if truth is None:
                    _host_side(topo, faults, per_window, m, t)
                    continue
                got = per_window[-1].got[m]
                t.tp, t.fp, t.fn = t.tp + len(got & truth), t.fp + len(got - truth), \
                    t.fn + len(truth - got)  # fmt: skip
                t.found += got == truth
                hit = [w.end_s for w in per_window if w.got[m] == truth and w.end_s > sc.start_s]
                if hit:
                    t.ttl.append(hit[0] - sc.start_s)
                line.append(f"{mode[0]}.{m}:+{len(got & truth)}-{len(truth - got)}"
                            f"x{len(got - truth)}")  # fmt: skip
        first = next(iter(runs.values()))
        if sc.key.startswith("delay"):
            v = first[-1].ours.get(next(iter(truth)))
            us = float(faults[0].split("delay_us=")[1].split(":")[0])
            if v is not None:
                errs.append(v.excess_delay_ns / (us * 1e3) - 1)
        if verbose:
            wrong = sorted(first[-1].got["fleetlens"] ^ truth) if truth else ""
            print(f"  trial {trial}: {' '.join(faults)[:90]} {' '.join(line)} {wrong}",
                  flush=True)  # fmt: skip
    out = {mode: {m: t.row(trials, windows) for m, t in ms.items()} for mode, ms in tally.items()}
    if errs:
        for r in out.values():
            r["fleetlens"]["delay_err_max"] = float(np.max(np.abs(errs)))
            r["fleetlens"]["delay_err_med"] = float(np.median(np.abs(errs)))
    return out


def _print(name: str, trials: int, res: dict, cpu: float, host: bool) -> None:
    for m, r in res.items():
        extra = ""
        if host:
            extra = f" false/100w {r['false_per_100w']:.2f} attributed {r['attributed']:.2f}"
        elif "delay_err_max" in r:
            extra = f" |delay err| med {r['delay_err_med']:.3f} max {r['delay_err_max']:.3f}"
        cnt = f"{r['tp']}/{r['fp']}/{r['fn']}"
        print(f"{name:30s} {m:10s} {r['p']:6.3f} {r['r']:6.3f} {r['f1']:6.3f} "
              f"{r['p_lo95']:6.3f} {r['r_lo95']:6.3f} {cnt:>14s}"
              f"{r['found']:6.2f} {r['ttl_med']:7.2f}s {r['ttl_max']:7.2f}s{extra}")  # fmt: skip
    if cpu >= 0:
        print(f"{'':30s} ({trials} trials, {cpu:.0f} s CPU)", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topo", default="leafspine:hosts=32,nics=2,leaves=8,spines=4",
                    help="topology spec, or 'reference' for the issue's fabric")  # fmt: skip
    ap.add_argument("--scenario", default="", help="comma list of scenario keys (default all)")
    ap.add_argument("--trials", type=int, default=0, help="trials per scenario (overrides)")
    ap.add_argument("--from-trial", type=int, default=0, help="first trial number (extends "
                    "an earlier run with new trials)")  # fmt: skip
    ap.add_argument("--scale", type=float, default=1.0, help="scale of the default counts")
    ap.add_argument("--json", default="", help="append one JSON line per scenario here")
    ap.add_argument("--verbose", action="store_true", help="one line per trial")
    ap.add_argument("--list", action="store_true", help="list the scenario keys and exit")
    args = ap.parse_args(argv)
    all_sc = scenarios()
    if args.list:
        for sc in all_sc:
            print(f"{sc.key:11s} {sc.name} ({sc.trials} trials by default)")
        return 0
    keys = [k for k in args.scenario.split(",") if k]
    unknown = set(keys) - {sc.key for sc in all_sc}
    if unknown:
        ap.error(f"unknown scenario(s) {sorted(unknown)}; see --list")
    spec = REFERENCE if args.topo == "reference" else args.topo
    topo = from_spec(spec)
    print(f"fabric {spec}: {len(topo.nics)} NICs, {len(topo.links)} directed links")
    cols = ("P", "R", "F1", "P_lo95", "R_lo95")
    print(f"{'scenario':30s} {'method':10s} " + " ".join(f"{c:>6s}" for c in cols)
          + f" {'tp/fp/fn':>14s} {'found':>5s} {'ttl_med':>8s} {'ttl_max':>8s}")  # fmt: skip
    for sc in all_sc:
        if keys and sc.key not in keys:
            continue
        trials = args.trials or max(1, round(sc.trials * args.scale))
        t0 = time.process_time()
        res = evaluate(topo, sc, trials, args.verbose, args.from_trial)
        cpu = time.process_time() - t0
        for i, (mode, r) in enumerate(res.items()):
            name = sc.name if mode == sc.paths else f"  same trials, paths {mode}"
            _print(name, trials, r, cpu if i == len(res) - 1 else -1, sc.make is _host)
        if len(res) == 2:
            f1 = {mode: r["fleetlens"]["f1"] for mode, r in res.items()}
            print(f"{'':30s} FleetLens F1 drop from unknown-but-stable paths: "
                  f"{f1['known'] - f1['first']:.3f}")  # fmt: skip
        if args.json:
            with open(args.json, "a") as fh:
                rec = {"topo": spec, "scenario": sc.key, "trials": trials, "cpu_s": cpu,
                       "from_trial": args.from_trial}  # fmt: skip
                fh.write(json.dumps(rec | {"results": res}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
