"""Ambiguity groups on the simulator, against injected truth: links the probes cannot tell
apart are reported together (every member, the group's id and size), a link that can be
told apart is named alone, and decisions cover the group's NICs."""

from __future__ import annotations

import numpy as np
import pytest
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator
from fleetlens.triangulate import decisions
from fleetlens.triangulate.decisions import drain_worthy
from fleetlens.triangulate.engine import Triangulator
from fleetlens.triangulate.identify import observed_groups
from tri_helpers import drive

from fleetlens.records import WINDOW_SCHEMA, Verdict
from fleetlens.topology import Topology, leaf_spine

TWO_LEAVES = {
    "rail": lambda: leaf_spine(hosts=8, nics=2, leaves=2, spines=2),
    "host": lambda: leaf_spine(hosts=8, nics=2, leaves=2, spines=3, wiring="host"),
}


def _group_of(steps, link: str) -> set[str]:
    """The members of the group the faulted link is reported in (last window)."""
    v = steps[-1].bad[link]
    assert v.group_id is not None
    return {s for s, w in steps[-1].bad.items() if w.group_id == v.group_id}


@pytest.mark.parametrize("wiring", TWO_LEAVES)
@pytest.mark.parametrize(
    "fault",
    ["leaf0->spine1:loss=0.05", "spine1->leaf0:loss=0.01", "leaf1->spine0:delay_us=100"],
)
def test_two_leaves_fault_gives_a_group_containing_it(wiring: str, fault: str) -> None:
    topo = TWO_LEAVES[wiring]()
    link = fault.split(":")[0]
    steps = drive(topo, (f"{fault}:start_s=1",), seconds=6)
    group = _group_of(steps, link)
    assert link in group and len(group) == 2  # the uplink and the downlink after it
    for st in steps[3:]:  # every member faulty, with the group's id and size
        members = [st.bad[m] for m in sorted(group)]
        assert all(v.state == "faulty" for v in members)
        assert len({v.group_id for v in members}) == 1
        assert all(v.group_size == 2 and v.confidence <= 0.5 + 1e-9 for v in members)
    for st in steps:  # nothing outside the group, ever
        assert st.reported() <= group


def test_four_leaves_name_the_single_link() -> None:
    topo = leaf_spine(hosts=8, nics=2, leaves=4, spines=2)
    steps = drive(topo, ("leaf1->spine0:loss=0.05:start_s=1",), seconds=5)
    for st in steps[2:]:
        assert st.reported() == {"leaf1->spine0"}
        v = st.bad["leaf1->spine0"]
        assert v.state == "faulty" and v.group_id is None and v.group_size == 1
        assert v.confidence > 0.99


def test_two_leaves_decisions_never_drain_a_whole_host() -> None:
    """The group's uplink serves every NIC on leaf0, its downlink every NIC on leaf1: on two
    leaves that is every NIC of every host, and no host is left without a NIC."""
    topo = TWO_LEAVES["rail"]()
    steps = drive(topo, ("leaf0->spine0:loss=0.05:start_s=1",), seconds=4)
    for d in decisions(steps[-1].verdicts, topo, 0):
        assert len(d.drain) < len(topo.nics_by_host[d.host_id])


def test_unknown_paths_group_drains_every_nic_it_could_affect() -> None:
    """Paths never reported: the uplinks of leaf1 are one group; the drain names every NIC
    on leaf1 (whichever uplink it is) and nothing else."""
    topo = leaf_spine(hosts=8, nics=2, leaves=4, spines=2)
    steps = drive(topo, ("leaf1->spine0:loss=0.05:start_s=1",), seconds=4, paths="unknown")
    assert _group_of(steps, "leaf1->spine0") == {"leaf1->spine0", "leaf1->spine1"}
    drained = {e.nic_id for d in decisions(steps[-1].verdicts, topo, 0) for e in d.drain}
    assert drained == {n.id for n in topo.nics_by_leaf["leaf1"]}


def _verdict(link: str, state: str, group: str | None, size: int = 1) -> Verdict:
    return Verdict(link, "link", state, 1, loss_rate=0.05, group_id=group, group_size=size)


def test_decisions_cover_every_member_of_a_group_with_a_faulty_member() -> None:
    topo = leaf_spine(hosts=8, nics=2, leaves=4, spines=2)  # rail: eth0 on leaf0/1
    pair = [_verdict("leaf0->spine0", "faulty", "gx", 2),
            _verdict("spine0->leaf1", "suspect", "gx", 2)]  # fmt: skip
    eth0 = {n.id for lf in ("leaf0", "leaf1") for n in topo.nics_by_leaf[lf]}
    drained = {e.nic_id for d in decisions(pair, topo, 0) for e in d.drain}
    assert drained == eth0
    reasons = [e.reason for d in decisions(pair, topo, 0) for e in d.drain]
    assert all("group gx" in r for r in reasons)
    alone = [pair[0], _verdict("spine0->leaf1", "suspect", None)]  # no group: suspect waits
    drained = {e.nic_id for d in decisions(alone, topo, 0) for e in d.drain}
    assert drained == {n.id for n in topo.nics_by_leaf["leaf0"]}
    healthy = [pair[0], _verdict("spine0->leaf1", "healthy", "gx", 2)]
    assert [v.subject for v in drain_worthy(healthy)] == ["leaf0->spine0"]


def _brute(f, n_links: int) -> set[frozenset[int]]:
    rows, links, _ = f.inc.entries()
    crossing: dict[int, set[int]] = {}
    for r, lk in zip(rows.tolist(), links.tolist(), strict=True):
        crossing.setdefault(lk, set()).add(r)
    by: dict[frozenset, set[int]] = {}
    for lk, rs in crossing.items():
        by.setdefault(frozenset(rs), set()).add(lk)
    return {frozenset(g) for g in by.values() if len(g) >= 2}


@pytest.mark.parametrize("paths_known", [True, False])
@pytest.mark.parametrize("topo", [TWO_LEAVES["rail"](), leaf_spine(8, 2, 4, 2)], ids=["2", "4"])
def test_observed_groups_match_brute_force(topo: Topology, paths_known: bool) -> None:
    sim = Simulator(topo, SimConfig(paths_known=paths_known), seed=0)
    w = next(iter(sim.stream(1.0)))
    tri = Triangulator(topo)
    f = tri.paths.frame(w.windows.select(WINDOW_SCHEMA.names))
    amb = observed_groups(f.inc, f.key, tri.paths.link_ids)
    assert {frozenset(g.tolist()) for g in amb.members} == _brute(f, len(tri.paths.link_ids))
    assert (len(amb.members) > 0) == (topo.params["leaves"] == 2 or not paths_known)
    for i, g in enumerate(amb.members):
        assert np.all(amb.group_of[g] == i)


def test_a_window_without_rows_keeps_the_groups() -> None:
    topo = TWO_LEAVES["rail"]()
    cfg = SimConfig(faults=("leaf0->spine0:loss=0.05:start_s=0",), paths_known=True)
    tri = Triangulator(topo)
    prev: dict[str, Verdict] = {}
    for w in Simulator(topo, cfg, seed=0).stream(3.0):
        out = tri(w.windows.select(WINDOW_SCHEMA.names), topo, prev)
        prev = {v.subject: v for v in out}
    empty = tri(WINDOW_SCHEMA.empty_table(), topo, prev)
    assert {v.subject: v.group_size for v in empty} == {"leaf0->spine0": 2, "spine0->leaf1": 2}
    assert len({v.group_id for v in empty}) == 1
