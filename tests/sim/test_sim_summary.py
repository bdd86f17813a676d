"""The simulator emits exactly what an agent emits: one summary function, equal values."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from fleetlens.fixtures.sim import engine
from fleetlens.fixtures.sim.config import CLOCK_IDENTITY, SimConfig
from fleetlens.fixtures.sim.engine import Simulator
from fleetlens.probe import windows
from fleetlens.probe.fastpath import FLAG_RX0, FLAG_RX1, FLAG_SENT0, FLAG_SENT1, FLAG_TX0, FLAG_TX1

from fleetlens import summary

KEYS = ["src_nic", "dst_nic", "sport"]
SUMMARY = ["sent", "received", "pure", *summary.OWD_COLUMNS, "hull_t_ns", "hull_owd_ns"]


def test_agent_and_simulator_summarise_with_the_same_function() -> None:
    assert windows.summarize is summary.summarize
    assert engine.summarize is summary.summarize


def _agent_summary(samples: pa.Table, purity_ns: int) -> pa.Table:
    """What the agent's window builder makes of the simulator's probe pairs (raw stamps; with
    identity clocks fleet time is raw time)."""
    c = {k: samples[k].to_numpy(zero_copy_only=False) for k in samples.column_names}
    flags = FLAG_SENT0 | FLAG_SENT1 | FLAG_TX0 | FLAG_TX1
    flags = flags | np.where(c["received0"], FLAG_RX0, 0) | np.where(c["received1"], FLAG_RX1, 0)
    stamps = {k: c[f"{k}_ns"] for k in ("tx0", "tx1", "rx0", "rx1")}
    s = {"flags": flags, **stamps, **{f"{k}_fleet": v for k, v in stamps.items()}}
    flow = np.char.add(np.char.add(c["src_nic"].astype(str), ">"), c["dst_nic"].astype(str))
    flow = np.char.add(np.char.add(flow, ">"), c["sport"].astype(str))
    names, first, g = np.unique(flow, return_index=True, return_inverse=True)
    pair = np.char.add(np.char.add(c["src_nic"].astype(str), ">"), c["dst_nic"].astype(str))
    pair = np.unique(pair[first], return_inverse=True)[1].reshape(-1)  # per flow: its pair
    cols = windows.summarize_samples(s, g.reshape(-1), names.size, purity_ns, pair).columns()
    return pa.table({k: samples[k].take(first) for k in KEYS} | cols)


def test_simulated_records_equal_the_agent_summary_of_the_same_pairs(small_topo) -> None:
    faults = ("leaf0->spine0:loss=0.3", "h01:stall:start_s=0.3,end_s=0.6")
    cfg = SimConfig(load=0.3, clock=CLOCK_IDENTITY, faults=faults)
    rows = 0
    for win in Simulator(small_topo, cfg, seed=3).stream(2, samples=True):
        by = [(k, "ascending") for k in KEYS]
        agent = _agent_summary(win.samples, cfg.threshold_ns).sort_by(by)
        sim = win.windows.sort_by(by)
        assert sim.select(KEYS).equals(agent.select(KEYS))
        for name in SUMMARY:
            assert sim[name].combine_chunks().equals(agent[name].combine_chunks()), name
        assert 0 < pa.compute.sum(sim["received"]).as_py() < pa.compute.sum(sim["sent"]).as_py()
        rows += sim.num_rows
    assert rows > 100
