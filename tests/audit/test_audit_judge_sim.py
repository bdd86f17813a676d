"""The audit's judgement against the simulator's ground truth (no root needed).

The simulator produces exactly the agents' window records for a bigger fabric than the lab
(16 hosts x 2 NICs, 4 leaves, 4 spines) with faults whose truth is known; the records are
aggregated exactly as the collector's stored windows are (``aggregate_windows`` runs the same
SQL as ``read_flows``) and judged.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from fleetlens.fixtures.sim import SimConfig, Simulator

from fleetlens.audit.data import aggregate_windows
from fleetlens.audit.judge import Judgement, judge
from fleetlens.audit.options import Thresholds
from fleetlens.topology import from_spec

TOPO = "leafspine:hosts=16,nics=2,leaves=4,spines=4"


def run(
    faults: tuple[str, ...], paths_known: bool = True, seconds: int = 15, seed: int = 5,
    learned_every: int = 1, learned_leaf: str | None = None,
):  # fmt: skip
    """Simulate, aggregate, judge. ``learned_every=k``: only flows whose source port is a
    multiple of k have a learned path (agents whose path discovery is starved), plus, with
    ``learned_leaf``, every flow to that leaf's NICs (a biased sample)."""
    topo = from_spec(TOPO)
    sim = Simulator(topo, SimConfig(faults=faults, paths_known=paths_known), seed=seed)
    w: pa.Table = sim.run(seconds).windows
    if learned_every > 1:
        keep = w["sport"].to_numpy() % learned_every == 0
        if learned_leaf is not None:
            on_leaf = [n.id for n in topo.nics if n.leaf == learned_leaf]
            keep |= pc.is_in(w["dst_nic"], pa.array(on_leaf)).to_numpy(zero_copy_only=False)
        keep = pa.array(keep)
        w = w.set_column(
            w.schema.get_field_index("path"), "path",
            pc.if_else(keep, w["path"], pa.nulls(w.num_rows, w.schema.field("path").type)),
        )  # fmt: skip
    start = w["start_ns"].to_numpy()
    lo, hi = int(start.min()), int((start + w["duration_ns"].to_numpy()).max())
    flows, stalls = aggregate_windows(w, lo, hi + 1)
    return judge(topo, flows, Thresholds()), stalls


def failed(j: Judgement) -> dict[str, object]:
    return {lk.link_id: lk for lk in j.links if lk.status == "failed"}


def test_clean_fabric_validates_everything() -> None:
    j, stalls = run(())
    assert not failed(j) and all(n.status == "validated" for n in j.nics)
    assert all(lk.status == "validated" for lk in j.links)
    assert stalls == [] and j.host_loss == {}
    assert j.flows_known_path == j.flows > 0
    worst = max(lk.excess_delay_ns or 0.0 for lk in j.links)
    assert worst < 0.1 * Thresholds().max_delay_ns  # queueing bursts stay far below 20 µs


def test_faults_of_every_kind_are_found_and_nothing_else() -> None:
    j, stalls = run(
        (
            "leaf1->spine2:loss=0.005",  # the 0.5 %
            "spine3->leaf0:delay_us=50",  # the issue's +50 µs
            "h05/eth1:drop=0.3",  # a bad NIC: both of its access links
            "h09:stall:start_s=4,end_s=5",  # one second of a stalled host: not the fabric
        )
    )
    bad = failed(j)
    leaf = from_spec(TOPO).nic_by_id["h05/eth1"].leaf
    nic_links = {f"h05/eth1->{leaf}", f"{leaf}->h05/eth1"}
    assert set(bad) == {"leaf1->spine2", "spine3->leaf0"} | nic_links
    assert bad["leaf1->spine2"].loss_rate == pytest.approx(0.005, rel=0.2)
    assert bad["spine3->leaf0"].excess_delay_ns == pytest.approx(50_000, rel=0.1)
    for lk in nic_links:
        assert bad[lk].loss_rate == pytest.approx(0.3, rel=0.1)
    assert [n.nic_id for n in j.nics if n.status == "failed"] == ["h05/eth1"]
    h09 = [s for s in stalls if s["host_id"] == "h09"]
    assert h09 and all(s["excluded"] and s["seconds"] <= 2 for s in h09)
    # the bad NIC's losses are every second: kept, not explained away as stalls
    assert all(not s["excluded"] for s in stalls if s["host_id"] == "h05")
    healthy = [lk.loss_rate for lk in j.links if lk.status == "validated"]
    assert max(healthy) < 0.1 * Thresholds().max_loss


def test_unknown_paths_fail_the_whole_ambiguous_group() -> None:
    """No path learned: a leaf's uplinks carry the same evidence; all are failed, and said so
    (never one picked at random)."""
    j, _ = run(("leaf2->spine1:loss=0.01",), paths_known=False)
    bad = failed(j)
    uplinks = {f"leaf2->spine{s}" for s in range(4)}
    assert set(bad) == uplinks
    assert all(lk.ambiguous_with for lk in bad.values())
    assert all(lk.known_path_share == 0.0 for lk in bad.values())
    # the fit's pick carries the whole 1 % (one of them loses it); the others are its twins
    assert max(lk.loss_rate for lk in bad.values()) == pytest.approx(0.01, rel=0.2)


@pytest.mark.parametrize("seed", [5, 6])
@pytest.mark.parametrize("biased", [False, True])
def test_delay_found_with_few_learned_paths(seed: int, biased: bool) -> None:
    """One flow in seven with a learned path (starved agents on a loaded lab), and in the
    biased case every flow *to* the slow link's leaf learned too — the sample a lab run once
    gave, where a leaf's uplink saw mostly slow flows: still only the slow link fails."""
    j, _ = run(("spine1->leaf2:delay_us=50",), seed=seed, learned_every=7,
               learned_leaf="leaf2" if biased else None)  # fmt: skip
    assert j.flows_known_path / j.flows < (0.45 if biased else 0.2)
    bad = failed(j)
    assert set(bad) == {"spine1->leaf2"}
    assert bad["spine1->leaf2"].excess_delay_ns == pytest.approx(50_000, rel=0.1)
