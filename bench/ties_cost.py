"""What ambiguity groups cost, against what they sit beside (one core, CPU time).

    .venv/bin/python bench/ties_cost.py                       # reference leaf-spine
    .venv/bin/python bench/ties_cost.py --topo leafspine:hosts=64,nics=2,leaves=8,spines=4

- the engine's groups of a window's flows (``triangulate.identify.observed_groups``, run only
  when the window's layout changes: new flows or a newly learned path), paths known and never
  known, against one steady window of the whole engine on the same flows;
- the planner: the probe pairs with the tie search (``plan.peer_pairs``, cached per topology
  afterwards) against the offset pairs alone, and the plan's groups (``ties.plan_groups``,
  what ``lab status`` and the collector's start log compute).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator
from fleetlens.triangulate.engine import Triangulator
from fleetlens.triangulate.identify import observed_groups

from fleetlens import plan
from fleetlens.records import WINDOW_SCHEMA
from fleetlens.ties import plan_groups, tie_breakers
from fleetlens.topology import Topology, from_spec

REFERENCE = "leafspine:hosts=1024,nics=8,leaves=32,spines=8"


def cpu(fn: Callable[[], object], repeat: int = 3) -> float:
    """Mean CPU seconds of ``fn``."""
    t0 = time.process_time()
    for _ in range(repeat):
        fn()
    return (time.process_time() - t0) / repeat


def engine_side(topo: Topology, known: bool) -> None:
    sim = Simulator(topo, SimConfig(paths_known=known), seed=0)
    tables = [w.windows.select(WINDOW_SCHEMA.names) for w in sim.stream(3.0)]
    tri = Triangulator(topo)
    for t in tables[:-1]:  # warm: layout, per-flow state
        tri(t, topo, {})
    steady = cpu(lambda: tri(tables[-1], topo, {}), 1)
    f = tri.paths.frame(tables[-1])
    groups = cpu(lambda: observed_groups(f.inc, f.key, tri.paths.link_ids))
    amb = observed_groups(f.inc, f.key, tri.paths.link_ids)
    what = "known" if known else "never known"
    print(f"paths {what}: {f.n} rows; observed_groups {groups * 1e3:.1f} ms "
          f"({len(amb.members)} groups); one steady engine window {steady * 1e3:.1f} ms; "
          f"ratio {groups / steady:.2f}x (paid on a layout change only)")  # fmt: skip


def plan_side(topo: Topology, peers: int, seed: int) -> None:
    offsets = cpu(lambda: plan._offset_pairs(topo, peers, seed))
    src, dst = plan._offset_pairs(topo, peers, seed)
    ties = cpu(lambda: tie_breakers(topo, src, dst), 1)
    s2, d2 = tie_breakers(topo, src, dst)
    groups = cpu(lambda: plan_groups(topo, s2, d2), 1)
    print(f"plan ({peers} peers): offset pairs {offsets * 1e3:.1f} ms, with the tie search "
          f"{(offsets + ties) * 1e3:.1f} ms ({(offsets + ties) / offsets:.1f}x, once per "
          f"topology), {s2.size - src.size} pairs added; plan_groups {groups * 1e3:.1f} ms, "
          f"{len(plan_groups(topo, s2, d2) or [])} groups left")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topo", default=REFERENCE)
    ap.add_argument("--peers", type=int, default=16)
    a = ap.parse_args()
    topo = from_spec(a.topo)
    print(f"{a.topo}: {len(topo.nics)} NICs, {len(topo.links)} links")
    plan_side(topo, a.peers, 0)
    engine_side(topo, True)
    engine_side(topo, False)


if __name__ == "__main__":
    main()
