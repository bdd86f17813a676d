"""Simulated windows (fleetlens.fixtures.sim, streamed by its own client as agents would) go
through a real collector bit for bit, and a link fault injected in the simulator comes out of
the collector's loops (placeholder triangulation) as that link's verdict."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest
from collector_helpers import INGEST, READ, metric, start_server
from fleetlens.api.store import Store

from fleetlens.records import WINDOW_SCHEMA
from fleetlens.topology import leaf_spine

sim = pytest.importorskip("fleetlens.fixtures.sim")
stream = pytest.importorskip("fleetlens.fixtures.sim.stream")

FAULT = "leaf0->spine0"


def test_simulated_fleet_round_trip(tmp_path: Path) -> None:
    topo = leaf_spine(hosts=8, nics=2, leaves=2, spines=2)
    inventory = tmp_path / "topology.json"
    topo.save(inventory)
    epoch = (time.time_ns() // 10**9 - 10) * 10**9  # recent past: not "from the future"
    cfg = sim.SimConfig(paths_known=True, faults=(f"{FAULT}:loss=0.5",), epoch_ns=epoch)
    simulator = sim.Simulator(topo, cfg, seed=3)
    server = start_server(tmp_path, inventory)
    sent: list[pa.Table] = []
    try:
        cs = stream.CollectorStream(server.url, INGEST, workers=2)
        try:
            cs.register(topo, cfg.ts_source)
            for win in simulator.stream(3):
                cs.send_window(win, seed=3)
                sent.append(win.windows.select(WINDOW_SCHEMA.names))
        finally:
            cs.close()
        assert not cs.stats.rejected, cs.stats.rejected[:3]
        every = pa.concat_tables(sent)
        assert cs.stats.rows == every.num_rows > 0
        with server.client(READ) as c:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                faulty = {
                    x["link_id"] for x in c.get("/v1/links", params={"state": "faulty"}).json()
                }
                if FAULT in faulty:
                    break
                time.sleep(0.2)
            assert FAULT in faulty
            # A link that clean flows also cross is never blamed.
            assert not faulty & {"leaf0->spine1", "leaf1->spine1", "spine1->leaf0"}
            assert (
                metric(c.get("/metrics").text, "fleetlens_ingest_windows_total") == every.num_rows
            )
    finally:
        server.stop()
    store = Store(server.db)
    got = store.read_windows()
    store.close()
    order = [(k, "ascending") for k in ("src_nic", "dst_nic", "sport", "start_ns")]
    assert got.sort_by(order).equals(every.cast(WINDOW_SCHEMA).sort_by(order))
