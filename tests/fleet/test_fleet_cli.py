"""``fleetlens fleet`` as operators run it, on a real NATS cluster: it serves the collector's
REST API and /metrics, answers ``/v1/flows`` over the shards' Parquet files exactly as a
collector storing the same windows does, and turns summaries published by a shard into
verdicts on an injected loss fault."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fleet_helpers import host_batches, partition_of
from fleetlens.api.store import Store

from fleetlens.batch import Batch
from fleetlens.records import WINDOW_SCHEMA
from fleetlens.topology import leaf_spine

fixture = pytest.importorskip("fleetlens.fixtures.nats")
fleet_mod = pytest.importorskip("fleetlens.api.fleet")
sim = pytest.importorskip("fleetlens.fixtures.sim")
procs = pytest.importorskip("fleetlens.fixtures.collector")

FAULT = "leaf0->spine0"
SEC = 10**9


def _start(tmp: Path, url: str, inventory: Path, parquet: Path) -> tuple[subprocess.Popen, str]:
    port = procs.free_port()
    log = tmp / "fleet.log"
    argv = [
        sys.executable, "-m", "fleetlens.cli", "fleet", "--nats", url, "--shards", "3",
        "--inventory", str(inventory), "--listen", f"127.0.0.1:{port}",
        "--db", str(tmp / "fleet.duckdb"), "--parquet", str(parquet), "--insecure-no-auth",
        "--loop-interval", "0.2",
    ]  # fmt: skip
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=out, start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{base}/healthz", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        procs.wait_until_up(proc, up, "fleet tier", log, 30.0)
    except BaseException:
        procs.stop_process(proc, signal.SIGKILL)
        raise
    return proc, base


def test_fleet_command_serves_history_and_verdicts(tmp_path: Path) -> None:
    topo = leaf_spine(hosts=8, nics=2, leaves=2, spines=2)
    inventory = tmp_path / "topology.json"
    topo.save(inventory)
    epoch = (time.time_ns() // SEC - 8) * SEC  # recent past: not "from the future"
    cfg = sim.SimConfig(paths_known=True, faults=(f"{FAULT}:loss=0.5",), epoch_ns=epoch)
    windows = [w.windows.select(WINDOW_SCHEMA.names) for w in sim.Simulator(topo, cfg, 3).stream(4)]
    # what a shard exported: its closed minutes as Parquet, WINDOW_SCHEMA, paths decoded
    parquet = tmp_path / "shard0"
    (parquet / "minute=x").mkdir(parents=True)
    history = pa.concat_tables(windows[:2]).cast(WINDOW_SCHEMA)
    pq.write_table(history, parquet / "minute=x" / "shard=0.parquet")
    ref = Store(tmp_path / "ref.duckdb")
    ref.insert_windows_raw(history)
    since, until = epoch, epoch + 2 * SEC
    expected = ref.flow_totals(since, until)
    expected_paths = ref.decode_paths(expected["path"]).to_pylist()
    ref.close()
    part = partition_of(topo)
    with fixture.NatsCluster(tmp_path / "nats") as nc:
        proc, base = _start(tmp_path, nc.url, inventory, parquet)
        pub = fleet_mod.SummaryPublisher(nc.url, "0/3")
        try:
            with httpx.Client(base_url=base, timeout=30.0) as c:
                got = c.get("/v1/flows", params={"since": since, "until": until, "limit": 1000})
                assert got.status_code == 200, got.text
                rows = got.json()
                assert int(got.headers["X-Total-Count"]) == expected.num_rows == len(rows)
                for r, e, p in zip(rows, expected.to_pylist(), expected_paths, strict=True):
                    key = ("src_nic", "dst_nic", "sport", "windows", "sent", "received")
                    assert [r[k] for k in key] == [e[k] for k in key]
                    assert r["path"] == p
                for w, window in enumerate(windows):
                    for h, rows_h in host_batches(window):
                        pub.committed(part[h], [Batch(f"sim-{w}-{h}", h, rows_h)])
                deadline = time.monotonic() + 30
                faulty: set[str] = set()
                while FAULT not in faulty and time.monotonic() < deadline:
                    links = c.get("/v1/links", params={"state": "faulty"}).json()
                    faulty = {x["link_id"] for x in links}
                    time.sleep(0.2)
                assert FAULT in faulty
                assert not faulty & {"leaf0->spine1", "leaf1->spine1", "spine1->leaf0"}
                metrics = c.get("/metrics").text
                assert "fleetlens_fleet_shards_expected 3.0" in metrics
                assert "fleetlens_fleet_shards_reporting 1.0" in metrics
                assert 'fleetlens_ingest_batches_total{result="stored"} 32.0' in metrics
        finally:
            pub.close()
            # uvicorn raises the signal again once it shut down: -SIGTERM, not a SIGKILL
            assert procs.stop_process(proc) == -signal.SIGTERM
