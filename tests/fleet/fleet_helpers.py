"""Simulated windows for the fleet tier's tests: a fabric with a loss and a delay fault, its
windows split into partitions by leaf as the shards see them, and the comparisons of the
engines' outputs."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator

from fleetlens.records import WINDOW_SCHEMA, ClockModel, nic_hosts
from fleetlens.topology import Topology, from_spec

FLEET = "leafspine:hosts=256,nics=2,leaves=8,spines=4"
LOSS, DELAY = "leaf1->spine0", "spine2->leaf5"
FAULTS = (f"{LOSS}:loss=0.05:start_s=1", f"{DELAY}:delay_us=20:start_s=2")
WINDOWS = 5


@dataclass
class Run:
    topo: Topology
    windows: list[pa.Table]  # per window, WINDOW_SCHEMA rows
    faulty: set[str]  # the links the simulator made faulty


def simulate(spec: str = FLEET, seconds: int = WINDOWS, seed: int = 7) -> Run:
    topo = from_spec(spec)
    sim = Simulator(topo, SimConfig(paths_known=True, faults=FAULTS), seed=seed)
    windows, faulty = [], set()
    for w in sim.stream(seconds):
        windows.append(w.windows.select(WINDOW_SCHEMA.names))
        t = w.truth_links
        bad = t["faulty"].to_numpy(zero_copy_only=False)
        faulty |= set(np.array(t["link_id"].to_pylist())[bad])
    return Run(topo, windows, faulty)


def partition_of(topo: Topology) -> dict[str, str]:
    """Host -> its partition: the leaf of its first NIC (how agents pick their subject)."""
    return {h: nics[0].leaf for h, nics in topo.nics_by_host.items()}


def host_batches(window: pa.Table) -> Iterator[tuple[str, pa.Table]]:
    """One window's rows as the agents send them: one batch per host."""
    hosts = nic_hosts(window["src_nic"])
    for h in pc.unique(hosts).to_pylist():
        yield h, window.filter(pc.equal(hosts, h))


def same_clocks(a: list[ClockModel], b: list[ClockModel], at_ns: int, tol_ns: float) -> float:
    """The largest difference of two model sets' fleet times at ``at_ns`` (raw), asserting
    the same hosts and synced flags."""
    ma, mb = {m.host_id: m for m in a}, {m.host_id: m for m in b}
    assert ma.keys() == mb.keys()
    assert {h for h, m in ma.items() if m.synced} == {h for h, m in mb.items() if m.synced}
    worst = max(
        abs(
            ma[h].offset_ns + ma[h].drift_ppb * 1e-9 * (at_ns - ma[h].t0_ns)
            - mb[h].offset_ns - mb[h].drift_ppb * 1e-9 * (at_ns - mb[h].t0_ns)
        )
        for h in ma
    )  # fmt: skip
    assert worst <= tol_ns, worst
    return worst
