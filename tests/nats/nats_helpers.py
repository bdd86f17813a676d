"""Helpers of the shard tests: hand-built batches of known content, shards as processes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
from fleetlens.fixtures.collector import CollectorProcess, start_collector

from fleetlens.batch import encode_batch
from fleetlens.records import WINDOW_SCHEMA
from fleetlens.stream import STREAM, Partitions, Publisher
from fleetlens.topology import Topology

SPEC = "leafspine:hosts=8,nics=2,leaves=4,spines=2,wiring=host"
TOPO = Topology.load(SPEC)
PARTS = Partitions(TOPO)
HOSTS = sorted(TOPO.nics_by_host)
SENT = 100
# How long a publish may go unconfirmed after a node's kill -9: a stream whose leader died
# waits out a Raft election timeout (4-9 s, randomized, in nats-server) and the meta leader's
# too if it led both; on a loaded 2-core box the 10 s once allowed was exceeded.
ELECTION_WAIT_S = 60.0
# Windows of closed minutes (exported at once), each batch its own window start.
EPOCH_NS = (time.time_ns() // 60_000_000_000 - 3) * 60_000_000_000


def windows(host: str, k: int, epoch_ns: int = EPOCH_NS) -> pa.Table:
    """Host ``host``'s k-th window after ``epoch_ns``: a flow to one NIC of every other host,
    SENT probes each."""
    src = TOPO.nics_by_host[host][0].id
    dst = [TOPO.nics_by_host[h][k % 2].id for h in HOSTS if h != host]
    n = len(dst)
    base = np.linspace(2_000, 3_000, n)
    start = epoch_ns + k * 1_000_000_000
    cols: dict[str, Any] = {
        "src_nic": [src] * n, "dst_nic": dst, "sport": np.full(n, 33000, np.int32),
        "start_ns": np.full(n, start, np.int64), "duration_ns": np.full(n, 10**9, np.int64),
        "sent": np.full(n, SENT, np.int32), "received": np.full(n, SENT, np.int32),
        "pure": np.full(n, SENT // 2, np.int32), "owd_min_ns": base, "owd_p50_ns": base,
        "owd_p99_ns": base, "owd_max_ns": base, "hull_t_ns": [[start]] * n,
        "hull_owd_ns": [[int(b)] for b in base], "ts_source": ["software"] * n,
        "path": [None] * n, "acks_lost": np.zeros(n, np.int32),
    }  # fmt: skip
    return pa.table(cols, schema=WINDOW_SCHEMA)


def publish(pub: Publisher, host: str, k: int) -> tuple[str, bool]:
    """Host's k-th batch (id ``b-HOST-K``), retried until the stream confirms it or
    :data:`ELECTION_WAIT_S` has passed."""
    bid = f"b-{host}-{k}"
    body, ctype = encode_batch(host, windows(host, k), bid)
    deadline = time.monotonic() + ELECTION_WAIT_S
    while True:
        try:
            return bid, pub.publish(PARTS.of(host), bid, body, ctype)
        except Exception as e:
            if time.monotonic() > deadline:
                raise AssertionError(f"{bid} never confirmed: {e}") from e
            time.sleep(0.1)


def metric_sum(text: str, line_start: str) -> float:
    """The sum of the exposition's samples whose line starts with ``line_start``."""
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith(line_start))  # fmt: skip


def start_shard(root: Path, url: str, index: int, shards: int, ttl_s: float = 6.0,
                port: int | None = None) -> CollectorProcess:  # fmt: skip
    d = root / f"shard{index}"
    d.mkdir(exist_ok=True)
    args = ["--nats", url, "--shard", f"{index}/{shards}", "--insecure-no-auth",
            "--parquet-dir", str(root / "parquet"), "--lease-ttl-seconds", str(ttl_s),
            "--log-level", "info"]  # fmt: skip
    return start_collector(d / "shard.duckdb", SPEC, args, port=port, log=d / "shard.log")


def stored_ids(dbs: list[Path]) -> list[str]:
    """Every batch id in the shards' files (stopped), one entry per copy."""
    out: list[str] = []
    for db in dbs:
        con = duckdb.connect(str(db), read_only=True)
        out += [r[0] for r in con.execute("SELECT batch_id FROM batches").fetchall()]
        con.close()
    return out


def pending(url: str) -> int:
    """Messages of the stream no consumer has acknowledged yet (every partition)."""

    async def go() -> int:
        import nats

        nc = await nats.connect(url.split(","))
        js = nc.jetstream()
        total = 0
        for c in await js.consumers_info(STREAM):
            total += int(c.num_pending or 0) + int(c.num_ack_pending or 0)
        await nc.close()
        return total

    try:
        return asyncio.run(go())
    except Exception:  # the cluster electing leaders (a node just killed): not known yet
        return -1
