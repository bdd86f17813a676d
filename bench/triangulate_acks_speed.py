"""Cost of lost-ack evidence per window: the engine with ``ack_evidence`` on against off.

    .venv/bin/python bench/triangulate_acks_speed.py                       # reference fabric
    .venv/bin/python bench/triangulate_acks_speed.py --paths unknown --fault-windows 2
    .venv/bin/python bench/triangulate_acks_speed.py --topo leafspine:hosts=256,nics=8,leaves=32

The simulator (the sim sweep's settings: background loss ``--base-loss`` on every link, so
every window loses acks) runs ``--warm`` clean windows, then a ``--loss`` fault on the last
leaf's uplink to the last spine (the sweep's "loss 5 % up") for ``--fault-windows``. Each
window goes to an engine with ``ack_evidence`` off (the baseline), then, from a second run of
the same simulation (the same seed), to one with it on; each timed in CPU seconds of this
process pinned to one core. Per
paths mode (``unknown``: a row per source port, no path; ``known``: a row per path, path
given) it prints every window's times and findings and then the slowest fault window of each
engine and their ratio (on / off), the figure issue 28's target is stated in (acks-on within
~1.5x of acks-off, no window past a few seconds).

``--against REV`` also times ``triangulate/`` at git revision REV with ack evidence on (the
speed bench's ``old_engine``); ``--cap S`` then stops that engine's window after S CPU
seconds (an alarm: the engine before session 36 ran past 10 minutes on an unknown-path fault
window), the window counted as "> S".
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator
from fleetlens.triangulate import TriangulateConfig, Triangulator
from triangulate_speed import REFERENCE, old_engine

from fleetlens.heap import keep_freed_memory
from fleetlens.records import WINDOW_SCHEMA
from fleetlens.topology import from_spec


class _Capped(Exception):
    pass


def _alarm(signum, frame) -> None:
    raise _Capped


def timed(engine, t, topo, prev: dict, cap: float) -> tuple[list | None, float]:
    """(verdicts or None when capped, CPU seconds) of one window."""
    c = time.process_time()
    if cap > 0:
        signal.setitimer(signal.ITIMER_PROF, cap)
    try:
        out = engine(t, topo, prev)
    except _Capped:
        return None, time.process_time() - c
    finally:
        if cap > 0:
            signal.setitimer(signal.ITIMER_PROF, 0)
    return out, time.process_time() - c


def run(args, paths: str, name: str, make) -> list[float]:
    """One engine's CPU seconds per fault window, printed as it goes (a simulator of its own:
    one engine's state in memory at a time, and no engine timed on pages another touched)."""
    topo = from_spec(args.topo)
    leaves, spines = topo.params["leaves"], topo.params["spines"]
    link = f"leaf{leaves - 1}->spine{spines - 1}"  # the sim sweep's uplink
    end = args.warm + args.fault_windows
    cfg = SimConfig(
        faults=(f"{link}:loss={args.loss:g}:start_s={args.warm},end_s={end}",),
        paths_known=paths == "known", base_loss=args.base_loss,
    )  # fmt: skip
    t0 = time.time()
    sim = Simulator(topo, cfg, seed=args.seed)
    print(f"{args.topo}, paths {paths}, {name}: {len(topo.links)} links, {sim.n_flows} flows, "
          f"fault {cfg.faults[0]} (setup {time.time() - t0:.0f} s)", flush=True)  # fmt: skip
    tri = make(topo)
    prev: dict = {}
    cpu: list[float] = []
    for w in sim.stream(end):
        t = w.windows.select(WINDOW_SCHEMA.names)
        acks = int(np.asarray(t["acks_lost"].fill_null(0)).sum())
        verdicts, c = timed(tri, t, topo, prev, args.cap if "@" in name else 0.0)
        if w.index >= args.warm:
            cpu.append(c if verdicts is not None else np.inf)
        head = (f"  window {w.index} ({'fault' if w.index >= args.warm else 'clean'}): "
                f"{t.num_rows} rows, {acks} lost acks:")  # fmt: skip
        if verdicts is None:
            print(f"{head} > {c:.0f} s (stopped)", flush=True)
            return cpu + [np.inf] * (end - w.index - 1)
        prev = {v.subject: v for v in verdicts}
        bad = sorted(v.subject for v in verdicts if v.state != "healthy")
        print(f"{head} {c:.2f} s {bad}", flush=True)
    return cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topo", default=REFERENCE)
    ap.add_argument("--paths", default="unknown,known", help="unknown, known or both")
    ap.add_argument("--warm", type=int, default=2, help="clean windows before the fault")
    ap.add_argument("--fault-windows", type=int, default=1)
    ap.add_argument("--loss", type=float, default=0.05)
    ap.add_argument("--base-loss", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=28)
    ap.add_argument("--against", default="", help="git revision of an engine to time, acks on")
    ap.add_argument("--cap", type=float, default=120.0, help="CPU-s limit of --against's window")
    args = ap.parse_args(argv)
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    keep_freed_memory()  # as the collector does
    signal.signal(signal.SIGPROF, _alarm)
    with tempfile.TemporaryDirectory() as tmp:
        classes = {
            "acks off": lambda topo: Triangulator(topo, TriangulateConfig(ack_evidence=False)),
            "acks on": lambda topo: Triangulator(topo, TriangulateConfig(ack_evidence=True)),
        }
        if args.against:
            old = old_engine(args.against, tmp)
            cfg = sys.modules[old.__module__.replace("engine", "config")].TriangulateConfig
            classes[f"acks on@{args.against}"] = lambda topo: old(topo, cfg(ack_evidence=True))
        summary = []
        for paths in args.paths.split(","):
            worst = {name: max(run(args, paths, name, make)) for name, make in classes.items()}
            base = worst["acks off"]
            for name, s in worst.items():
                summary.append(f"paths {paths}: {name}: slowest fault window {s:.2f} s; "
                               f"/ acks off = {s / base:.2f}x")  # fmt: skip
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
