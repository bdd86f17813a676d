"""The lab fabric carries real packets where its wiring and its routes say."""

from __future__ import annotations

from collections import Counter

from fleetlens.fixtures.lab import measure
from fleetlens.fixtures.lab.fabric import Lab
from fleetlens.fixtures.lab.paths import flow_path
from fleetlens.fixtures.lab.status import packet_counters

from fleetlens.records import Flow
from fleetlens.topology import TIER_SPINE


def _leaf_tx_deltas(lab: Lab, before: dict, leaf: str) -> dict[str, int]:
    after = packet_counters(lab, leaf)
    return {dev: after[dev][1] - before[dev][1] for dev in after}


def test_all_ordered_pairs_exchange_udp_through_their_wired_leaves(lab: Lab) -> None:
    nics = lab.topo.nics
    leaves = sorted({n.leaf for n in nics})
    for src in nics:
        before = {leaf: packet_counters(lab, leaf) for leaf in leaves}
        flows = [Flow(src.id, dst.id, 41000) for dst in nics if dst.id != src.id]
        results = measure.udp_exchange(lab, flows, count=1, linger_s=0.2)
        assert all(r.received == 1 for r in results), f"{src.id}: some peer unreachable"
        # Entered the fabric at the source's own leaf, on its own port ...
        rx_dev = lab.dev(src.leaf, src.id)
        rx_gain = packet_counters(lab, src.leaf)[rx_dev][0] - before[src.leaf][rx_dev][0]
        assert rx_gain >= len(flows)
        # ... and left it at each destination's wired leaf, on that destination's port.
        for dst in (n for n in nics if n.id != src.id):
            gain = _leaf_tx_deltas(lab, before[dst.leaf], dst.leaf)[lab.dev(dst.leaf, dst.id)]
            assert gain >= 1, f"{src.id}->{dst.id} not delivered by {dst.leaf}"


def test_source_ports_spread_over_all_spines_and_lab_path_matches_counters(lab: Lab) -> None:
    src = lab.topo.nic_by_id["h00/eth0"]
    dst = next(n for n in lab.topo.nics if n.leaf != src.leaf and n.host != src.host)
    spines = [s.id for s in lab.topo.switches_of_tier(TIER_SPINE)]
    chosen: Counter[str] = Counter()
    for sport in range(42000, 42064):
        path = flow_path(lab, src.id, dst.id, sport, measure.MEASURE_DPORT)
        spine = path[1].split("->")[1]
        before = packet_counters(lab, src.leaf)
        res = measure.udp_exchange(lab, [Flow(src.id, dst.id, sport)], count=5, linger_s=0.05)
        assert res[0].received == 5
        gains = _leaf_tx_deltas(lab, before, src.leaf)
        seen = [sp for sp in spines if gains[sp] >= 5]
        assert seen == [spine], f"sport {sport}: lab path says {spine}, counters saw {seen}"
        chosen[spine] += 1
    assert set(chosen) == set(spines)
    assert min(chosen.values()) >= 0.10 * 64, chosen
