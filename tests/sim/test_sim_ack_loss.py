"""Reverse-path loss in the simulator (issue 28): a lossy link drops the acks of the flows
whose ack path crosses it; they are counted as ``acks_lost`` and never as forward loss."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator

from fleetlens.topology import Topology

LINK, LEAF, LOSS = "spine1->leaf2", "leaf2", 0.3


def _leaf_of(topo: Topology) -> dict[str, str]:
    return {n.id: n.leaf for n in topo.nics}


def _run(topo: Topology, faults: tuple[str, ...]) -> pa.Table:
    return Simulator(topo, SimConfig(faults=faults, paths_known=True), seed=28).run(2).windows


def test_acks_lost_on_a_spine_to_leaf_link_are_not_forward_loss(small_topo: Topology) -> None:
    topo = small_topo
    t = _run(topo, (f"{LINK}:loss={LOSS}",))
    leaf = _leaf_of(topo)
    crosses = np.array([LINK in p for p in t["path"].to_pylist()])
    sent, received, acks_lost = (t[c].to_numpy() for c in ("sent", "received", "acks_lost"))
    # forward paths that avoid the link read no loss at all, those through it read LOSS
    assert np.array_equal(received[~crosses], sent[~crosses])
    assert abs(1 - received[crosses].sum() / sent[crosses].sum() - LOSS) < 0.05
    # an ack crosses spine->leaf2 only on its way to a sender on leaf2 from another leaf
    src_leaf = np.array([leaf[s] for s in t["src_nic"].to_pylist()])
    dst_leaf = np.array([leaf[d] for d in t["dst_nic"].to_pylist()])
    can = (src_leaf == LEAF) & (dst_leaf != LEAF)
    assert acks_lost[~can].sum() == 0
    # ... through one of the spines (ECMP-spread): LOSS / spines of those pairs' acks
    spines = sum(lk.id.startswith("spine") and lk.id.endswith(f"->{LEAF}") for lk in topo.links)
    share = acks_lost[can].sum() / (sent[can].sum() / 2)  # forward loss 0: every pair heard
    assert abs(share - LOSS / spines) < 0.03, (share, spines)
    assert np.all(acks_lost <= received)


def test_a_lossless_fabric_loses_no_acks(small_topo: Topology) -> None:
    t = _run(small_topo, ("leaf1->spine0:delay_us=20",))
    assert t["acks_lost"].null_count == 0 and t["acks_lost"].to_numpy().sum() == 0
