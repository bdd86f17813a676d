"""Triangulation cost per window on one core, with peak memory (issue 7 speed targets).

    .venv/bin/python bench/triangulate_speed.py                      # reference leaf-spine
    .venv/bin/python bench/triangulate_speed.py --topo fattree:k=32  # 8192 hosts

Simulates a few 1 s windows (paths known, one lossy fabric link), then times the engine on
each (CPU time of this process pinned to one core; the first window also builds the per-flow
state) and, on the same windows, the 007 vote as the reference baseline. Peak memory is the
tracemalloc peak during the engine call (numpy buffers included).
"""

from __future__ import annotations

import argparse
import os
import sys
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topo", default=REFERENCE)
    ap.add_argument("--windows", type=int, default=3)
    args = ap.parse_args(argv)
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    topo = from_spec(args.topo)
    link = next(lk.id for lk in topo.links if lk.tier == "fabric")
    t0 = time.time()
    sim = Simulator(topo, SimConfig(paths_known=True, faults=(f"{link}:loss=0.01",)), seed=1)
    print(f"{args.topo}: {len(topo.nics)} NICs, {len(topo.links)} links, {sim.n_flows} flows "
          f"(simulator setup {time.time() - t0:.0f} s)")  # fmt: skip
    tri, pm = Triangulator(topo), PathModel(topo)
    times, peaks, base = [], [], []
    for w in sim.stream(args.windows):
        t = w.windows.select(WINDOW_SCHEMA.names)
        tracemalloc.start()
        c = time.process_time()
        verdicts = tri(t, topo, {})
        times.append(time.process_time() - c)
        peaks.append(tracemalloc.get_traced_memory()[1] / 2**20)
        tracemalloc.stop()
        c = time.process_time()
        b = pm.batch(t)
        vote_007(b.ent_row, b.ent_link, b.ent_w, b.sent, b.lost, pm.n_links)
        base.append(time.process_time() - c)
        bad = sorted(v.subject for v in verdicts if v.state != "healthy")
        print(f"window {w.index}: {t.num_rows} rows, engine {times[-1]:.2f} s CPU, "
              f"peak {peaks[-1]:.0f} MiB; 007 (decode + vote) {base[-1]:.2f} s; "
              f"reported {bad}")  # fmt: skip
    steady = float(np.median(times[1:] or times))
    ratio = steady / float(np.median(base[1:] or base))
    print(f"engine per window (steady, one core): {steady * 1e3:.0f} ms; "
          f"peak memory {max(peaks):.0f} MiB; ratio to 007 decode+vote {ratio:.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
