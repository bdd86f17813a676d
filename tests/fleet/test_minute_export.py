"""A shard's Parquet export reaches its last export, not its last closed minute: the open
minute's new windows go out as parts, a minute's file covers the parts written before it, and
the fleet tier's history over the files equals the shard's own store at every step (each
window counted once): after parts, after the minute closes, while covered parts still lie
beside the minute file, and after a reconciliation takes batches of the open minute back."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pyarrow as pa
import pytest
from fleet_helpers import host_batches
from fleetlens.api.config import MINUTE_NS
from fleetlens.api.fleetstore import FleetStore
from fleetlens.api.shardexport import MinuteExport, minute_dir, readable
from fleetlens.api.store import Store

from fleetlens.batch import Batch
from fleetlens.records import WINDOW_SCHEMA
from fleetlens.topology import leaf_spine

sim = pytest.importorskip("fleetlens.fixtures.sim")
SEC = 10**9


def _batches(epoch_ns: int, seconds: int) -> list[list[Batch]]:
    """Per simulated second, one batch per host."""
    topo = leaf_spine(hosts=8, nics=2, leaves=2, spines=2)
    cfg = sim.SimConfig(paths_known=True, faults=("leaf0->spine0:loss=0.3",), epoch_ns=epoch_ns)
    out = []
    for k, w in enumerate(sim.Simulator(topo, cfg, 5).stream(seconds)):
        rows = w.windows.select(WINDOW_SCHEMA.names).cast(WINDOW_SCHEMA)
        out.append([Batch(f"b-{h}-{k}", h, t) for h, t in host_batches(rows)])
    return out


def _same_history(shard: Store, fleet: FleetStore, since: int, until: int) -> int:
    a, b = shard.flow_totals(since, until), fleet.flow_totals(since, until)
    assert a.drop_columns(["path"]).equals(b.drop_columns(["path"]))
    assert shard.decode_paths(a["path"]).to_pylist() == fleet.decode_paths(b["path"]).to_pylist()
    return int(pa.compute.sum(a["windows"]).as_py() or 0)


def test_open_minute_parts_count_once_through_close_and_reconciliation(tmp_path: Path) -> None:
    minute = (time.time_ns() // MINUTE_NS - 2) * MINUTE_NS  # closed by the wall clock
    seconds = _batches(minute + 20 * SEC, 6)
    root = tmp_path / "parquet"
    shard = Store(tmp_path / "shard.duckdb")
    fleet = FleetStore(tmp_path / "fleet.duckdb", [root], SEC)
    export = MinuteExport(shard, root, 0)
    d = root / minute_dir(minute)
    since, until = minute, minute + MINUTE_NS
    open_now = minute + 40 * SEC  # an export clock inside the minute: it is open
    try:
        for k, group in enumerate(seconds[:4]):
            shard.insert_batches(group, time.time_ns())
            export.committed("p", group)
            export.stored(group)
            assert export.export(open_now) == 0  # open: parts only
            assert not (d / "shard=0.parquet").exists()
            assert len(list(d.glob("shard=0.part-*.parquet"))) == k + 1
            assert _same_history(shard, fleet, since, until) > 0
        parts = sorted(d.glob("shard=0.part-*.parquet"))
        kept = tmp_path / "kept"
        kept.mkdir()
        for p in parts:
            shutil.copy(p, kept / p.name)

        # The minute closes: one file covering the parts, which are gone.
        assert export.export(minute + MINUTE_NS + 10 * SEC) == 1
        assert sorted(d.glob("*.parquet")) == [d / "shard=0.parquet"]
        n = _same_history(shard, fleet, since, until)
        # A reader that listed the parts before they were deleted: covered, not read twice.
        for p in parts:
            shutil.copy(kept / p.name, p)
        assert readable(root) == [d / "shard=0.parquet"]
        assert _same_history(shard, fleet, since, until) == n
        for p in parts:
            p.unlink()

        # A late batch and a reconciliation on a minute that is open again for the exporter:
        # the batches taken back leave the file, parts written later add to it.
        late, taken = seconds[4], seconds[5]
        for group in (late, taken):
            shard.insert_batches(group, time.time_ns())
            export.committed("p", group)
            export.stored(group)
        export.export(open_now)
        assert len(list(d.glob("shard=0.part-*.parquet"))) == 1
        assert _same_history(shard, fleet, since, until) > n
        gone = shard.forget_batches(taken)
        export.forgotten(gone)
        export.export(open_now)
        assert list(d.glob("shard=0.part-*.parquet")) == []
        assert _same_history(shard, fleet, since, until) > n
        more = [Batch(f"{b.batch_id}-again", b.host_id, b.windows) for b in taken]
        shard.insert_batches(more, time.time_ns())
        export.committed("p", more)
        export.stored(more)
        export.export(open_now)
        assert len(list(d.glob("shard=0.part-*.parquet"))) == 1
        _same_history(shard, fleet, since, until)
    finally:
        shard.close()
        fleet.close()
