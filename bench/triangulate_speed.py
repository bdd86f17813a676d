"""Triangulation cost per window on one core, with peak memory (issue 7 speed targets).

    .venv/bin/python bench/triangulate_speed.py                      # reference leaf-spine
    .venv/bin/python bench/triangulate_speed.py --topo fattree:k=32  # 8192 hosts
    .venv/bin/python bench/triangulate_speed.py --against 1dc2cf8    # also an older engine

Simulates a few 1 s windows (paths known, one lossy fabric link), then times the engine on
each (CPU time of this process pinned to one core; the first window also builds the per-flow
state) and, on the same windows, two baselines:

- 007's vote on the same decoded flows (decode + vote over the lossy flows' entries: the
  cheapest thing that localizes anything);
- with ``--against REV``: the engine as it was at git revision REV (its ``triangulate/``
  files extracted into a temporary package), so a speed-up is measured in one command.

Peak memory is the tracemalloc peak during the engine call (numpy buffers included).
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator
from fleetlens.triangulate.engine import Triangulator
from fleetlens.triangulate.paths import PathModel
from triangulate_baselines import vote_007

from fleetlens.records import WINDOW_SCHEMA
from fleetlens.topology import from_spec

REFERENCE = "leafspine:hosts=1024,nics=8,leaves=32,spines=8"
REPO = Path(__file__).resolve().parent.parent


def old_engine(rev: str, tmp: str):
    """``Triangulator`` class of ``triangulate/`` at git revision ``rev``."""
    pkg = Path(tmp) / "tri_at_rev"
    pkg.mkdir()
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:triangulate"], cwd=REPO,
                           check=True, capture_output=True, text=True).stdout.split()  # fmt: skip
    for name in (n for n in names if n.endswith(".py")):
        src = subprocess.run(["git", "show", f"{rev}:triangulate/{name}"], cwd=REPO,
                             check=True, capture_output=True, text=True).stdout  # fmt: skip
        (pkg / name).write_text(src)
    sys.path.insert(0, tmp)
    return importlib.import_module("tri_at_rev.engine").Triangulator


def timed(fn, *args) -> tuple[object, float, float]:
    """(result, CPU seconds, tracemalloc peak MiB)."""
    tracemalloc.start()
    c = time.process_time()
    out = fn(*args)
    cpu = time.process_time() - c
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return out, cpu, peak


def vote(pm: PathModel, t) -> set[int]:
    f = pm.frame(t)
    lossy = np.flatnonzero(f.lost > 0)
    row, link, w = f.inc.entries(lossy)
    return vote_007(row, link, w, f.sent[lossy], f.lost[lossy], pm.n_links)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topo", default=REFERENCE)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--against", default="", help="git revision of an engine to compare")
    args = ap.parse_args(argv)
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    topo = from_spec(args.topo)
    link = next(lk.id for lk in topo.links if lk.tier == "fabric")
    t0 = time.time()
    sim = Simulator(topo, SimConfig(paths_known=True, faults=(f"{link}:loss=0.01",)), seed=1)
    print(f"{args.topo}: {len(topo.nics)} NICs, {len(topo.links)} links, {sim.n_flows} flows "
          f"(simulator setup {time.time() - t0:.0f} s)")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        engines = {"engine": Triangulator(topo)}
        if args.against:
            engines[f"engine@{args.against}"] = old_engine(args.against, tmp)(topo)
        pm = PathModel(topo)
        cpu: dict[str, list[float]] = {name: [] for name in [*engines, "007"]}
        peak: dict[str, list[float]] = {name: [] for name in engines}
        for w in sim.stream(args.windows):
            t = w.windows.select(WINDOW_SCHEMA.names)
            line = [f"window {w.index}: {t.num_rows} rows"]
            for name, tri in engines.items():
                verdicts, c, p = timed(tri, t, topo, {})
                cpu[name].append(c)
                peak[name].append(p)
                bad = sorted(v.subject for v in verdicts if v.state != "healthy")
                line.append(f"{name} {c:.2f} s CPU, peak {p:.0f} MiB, reported {bad}")
            _, c, _ = timed(vote, pm, t)
            cpu["007"].append(c)
            line.append(f"007 (decode + vote) {c:.2f} s")
            print("; ".join(line), flush=True)
    steady = {name: float(np.median(v[1:] or v)) for name, v in cpu.items()}
    ours = steady["engine"]
    print(f"engine per window (steady, one core): {ours * 1e3:.0f} ms; first window "
          f"{cpu['engine'][0]:.2f} s; peak memory steady {max(peak['engine'][1:] or [0]):.0f} "
          f"MiB, first window {peak['engine'][0]:.0f} MiB")  # fmt: skip
    for name, s in steady.items():
        if name != "engine":
            print(f"  {name}: {s * 1e3:.0f} ms per window; engine / {name} = {ours / s:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
