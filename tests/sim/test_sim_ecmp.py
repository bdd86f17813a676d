"""ECMP: every flow's path is one of the topology's equal-cost paths, and the plan covers them."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator, port_counts
from fleetlens.fixtures.sim.fabric import Fabric

from fleetlens import plan
from fleetlens.topology import from_spec

SPECS = [
    "leafspine:hosts=16,nics=2,leaves=4,spines=3",
    "leafspine:hosts=8,nics=2,leaves=2,spines=4,wiring=host",
    "fattree:k=4",
    "fattree:k=6",
]


def _sim(spec: str, seed: int = 7) -> Simulator:
    return Simulator(from_spec(spec), SimConfig(), seed=seed)


@pytest.mark.parametrize("spec", SPECS)
def test_every_flow_path_is_an_ecmp_path(spec: str) -> None:
    sim = _sim(spec)
    topo, fab = sim.topo, sim.fabric
    for i in range(sim.n_flows):
        src, dst = fab.nic_ids[sim.flow_src[i]], fab.nic_ids[sim.flow_dst[i]]
        assert fab.path_ids(sim.flow_links[i]) in topo.ecmp_paths(src, dst)


@pytest.mark.parametrize("spec", SPECS)
def test_plan_covers_every_equal_cost_path(spec: str) -> None:
    sim = _sim(spec)
    topo, fab = sim.topo, sim.fabric
    seen: dict[tuple[int, int], set[tuple[str, ...]]] = defaultdict(set)
    for i in range(sim.n_flows):
        key = (int(sim.flow_src[i]), int(sim.flow_dst[i]))
        seen[key].add(tuple(fab.path_ids(sim.flow_links[i])))
    complete = 0
    for (s, d), paths in seen.items():
        want = {tuple(p) for p in topo.ecmp_paths(fab.nic_ids[s], fab.nic_ids[d])}
        assert paths <= want
        complete += paths == want
    # The planner promises each pair misses a path with probability <= 1%.
    assert complete / len(seen) >= 0.95
    # Every planned pair is simulated with exactly the planner's ports.
    src, dst = plan.peer_pairs(topo, 16, 0)
    assert len(seen) == src.size
    assert sim.n_flows == int(plan.port_counts(topo, src, dst).sum())


def test_hash_is_spread_and_seeded() -> None:
    a, b = _sim(SPECS[0], seed=1), _sim(SPECS[0], seed=2)
    assert not np.array_equal(a.flow_links, b.flow_links)  # per-switch seeds differ
    # Cross-leaf flows spread over all 3 spines roughly evenly.
    fab = a.fabric
    spine_of = {i: fab.link_ids[i].split("->")[1] for i in range(fab.n_links)}
    hops = [spine_of[int(x)] for x in a.flow_links[:, 1] if "spine" in spine_of[int(x)]]
    counts = np.unique(hops, return_counts=True)[1]
    assert counts.size == 3 and counts.min() > 0.25 * len(hops)


def test_path_of_matches_windows(small_topo) -> None:
    sim = Simulator(small_topo, SimConfig(paths_known=True), seed=3)
    w = next(sim.stream(1)).windows.slice(0, 50).to_pylist()
    for row in w:
        assert row["path"] == sim.path_of(row["src_nic"], row["dst_nic"], row["sport"])
    paths = sim.truth_paths()
    assert paths.num_rows == sim.n_flows
    # The path set of a NIC pair (what the lab comparison needs) is its sports' paths.
    row = w[0]
    by_port = sim.paths_between(row["src_nic"], row["dst_nic"])
    assert by_port[row["sport"]] == row["path"]
    want = small_topo.ecmp_paths(row["src_nic"], row["dst_nic"])
    assert all(p in want for p in by_port.values())


@pytest.mark.parametrize(
    "spec", [*SPECS, "fattree:k=8", "leafspine:hosts=64,nics=4,leaves=8,spines=5"]
)
def test_port_counts_equal_the_planner(spec: str) -> None:
    """The simulator's fast port counts are exactly fleetlens.plan.port_counts."""
    topo = from_spec(spec)
    src, dst = plan.peer_pairs(topo, 16, 0)
    fab = Fabric(topo)
    assert np.array_equal(port_counts(fab, src, dst), plan.port_counts(topo, src, dst))


@pytest.mark.parametrize("spec", SPECS)
def test_simulator_and_triangulation_number_the_topology_alike(spec: str) -> None:
    """One dense numbering (``Topology.index``), built once and shared by the simulator's
    fabric and the triangulation's path model; its arrays agree with the ids."""
    from fleetlens.triangulate.paths import PathModel

    topo = from_spec(spec)
    ix = topo.index
    assert topo.index is ix
    fab, pm = Fabric(topo), PathModel(topo)
    assert fab.nic_ids == pm.nic_ids == [n.id for n in topo.nics]
    assert fab.link_ids == pm.link_ids == [lk.id for lk in topo.links]
    assert fab.nic_up is pm.nic_up is ix.nic_up
    for i, n in enumerate(topo.nics):
        assert topo.links[ix.nic_up[i]].id == f"{n.id}->{n.leaf}"
        assert topo.links[ix.nic_down[i]].id == f"{n.leaf}->{n.id}"
        assert ix.host_ids[ix.nic_host[i]] == n.host
        assert ix.switch_ids[ix.nic_leaf[i]] == n.leaf
    for i, lk in enumerate(topo.links):
        ends = [ix.switch_ids[s] if s >= 0 else ix.nic_ids[ix.link_nic[i]] for s in
                (ix.link_tail[i], ix.link_head[i])]  # fmt: skip
        assert ends == [lk.a, lk.b] and ix.link[lk.id] == i
    with pytest.raises(ValueError):
        ix.nic_up[0] = 1  # shared: read-only
