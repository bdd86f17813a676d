"""The simulator and the lab agree on a small fabric: the same equal-cost path sets."""

from __future__ import annotations

from fleetlens.fixtures.lab.fabric import Lab
from fleetlens.fixtures.lab.paths import PathOracle
from fleetlens.fixtures.sim.engine import Simulator


def test_equal_cost_path_sets_match_between_lab_and_simulator(lab: Lab) -> None:
    sim = Simulator(lab.topo)
    nics = [n.id for n in lab.topo.nics]
    checked = 0
    with PathOracle(lab) as oracle:
        for src in nics:
            for dst in nics:
                sim_paths = sim.paths_between(src, dst)
                if src == dst or not sim_paths:
                    continue  # not a planned pair
                ecmp = {tuple(p) for p in lab.topo.ecmp_paths(src, dst)}
                # The kernel's answers over many source ports: every equal-cost path, no other.
                lab_set = {tuple(oracle.path(src, dst, p)) for p in range(40000, 40064)}
                sim_set = {tuple(p) for p in sim_paths.values()}
                assert lab_set == ecmp, (src, dst)
                assert sim_set == ecmp, (src, dst)  # the planned ports cover every path
                checked += 1
    assert checked >= len(nics) * 6
