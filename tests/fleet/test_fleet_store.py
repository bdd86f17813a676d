"""The fleet tier's store answers history from the shards' Parquet files as a collector's
store answers it from its own rows: flow totals, a pair's series, host stalls."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fleetlens.api.fleetstore import FleetStore
from fleetlens.api.store import StallRule, Store

from fleetlens.records import WINDOW_SCHEMA
from fleetlens.topology import leaf_spine

sim = pytest.importorskip("fleetlens.fixtures.sim")
SEC = 10**9


def test_history_over_parquet_equals_the_collectors(tmp_path: Path) -> None:
    topo = leaf_spine(hosts=8, nics=2, leaves=2, spines=2)
    epoch = (time.time_ns() // SEC - 30) * SEC
    cfg = sim.SimConfig(paths_known=True, faults=("leaf0->spine0:loss=0.5",), epoch_ns=epoch)
    rows = pa.concat_tables(
        w.windows.select(WINDOW_SCHEMA.names) for w in sim.Simulator(topo, cfg, 3).stream(4)
    ).cast(WINDOW_SCHEMA)
    for i, half in enumerate((rows.slice(0, rows.num_rows // 2), rows.slice(rows.num_rows // 2))):
        d = tmp_path / f"shard{i}" / "minute=x"
        d.mkdir(parents=True)
        pq.write_table(half, d / f"shard={i}.parquet")
    ref = Store(tmp_path / "ref.duckdb")
    ref.insert_windows_raw(rows)
    fleet = FleetStore(tmp_path / "fleet.duckdb", [tmp_path / "shard0", tmp_path / "shard1"], SEC)
    try:
        since, until = epoch, epoch + 4 * SEC
        a, b = ref.flow_totals(since, until), fleet.flow_totals(since, until)
        assert a.drop_columns(["path"]).equals(b.drop_columns(["path"]))
        assert ref.decode_paths(a["path"]).to_pylist() == fleet.decode_paths(b["path"]).to_pylist()
        src, dst = rows["src_nic"][0].as_py(), rows["dst_nic"][0].as_py()
        assert ref.pair_series(src, dst, since, until, SEC) == fleet.pair_series(
            src, dst, since, until, SEC
        )
        rule = StallRule(loss=0.01, spread=0.1)
        order = [(k, "ascending") for k in ("side", "host", "sec")]  # the SQL leaves it open
        stalls = ref.host_stalls(since, until, rule).sort_by(order)
        assert stalls.num_rows and stalls.equals(
            fleet.host_stalls(since, until, rule).sort_by(order)
        )
        # nothing exported: empty answers, not errors
        empty = FleetStore(tmp_path / "empty.duckdb", [tmp_path / "none"], SEC)
        assert empty.flow_totals(since, until).num_rows == 0
        assert empty.pair_series(src, dst, since, until, SEC) == []
        empty.close()
    finally:
        ref.close()
        fleet.close()
