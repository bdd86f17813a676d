"""One collector shard on a real 3-node JetStream cluster: publish -> stored -> /v1/flows,
Parquet minutes, a retried batch id stored once, hostile messages refused and the partition
flowing on, a nats-server killed mid-stream without loss."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from collector_waits import until
from fleetlens.fixtures.nats import NatsCluster
from nats_helpers import (
    EPOCH_NS,
    HOSTS,
    PARTS,
    SENT,
    metric_sum,
    pending,
    publish,
    start_shard,
    stored_ids,
    windows,
)

from fleetlens.batch import encode_batch
from fleetlens.stream import CONTENT_TYPE, MSG_ID, Publisher, subject

pytest.importorskip("nats")

pytestmark = pytest.mark.serial  # kills a nats-server mid-stream, waited on against a deadline


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path_factory.mktemp("nats")) as nc:
        yield nc


def _raw(url: str, subj: str, body: bytes, headers: dict[str, str]) -> None:
    async def go() -> None:
        import nats

        nc = await nats.connect(url.split(","))
        await nc.jetstream().publish(subj, body, headers=headers)
        await nc.close()

    asyncio.run(go())


def test_publish_store_flows_parquet_hostile_and_a_node_kill(
    cluster: NatsCluster, tmp_path: Path
) -> None:
    pub = Publisher(cluster.url)
    shard = start_shard(tmp_path, cluster.url, 0, 1)
    try:
        ids = [publish(pub, h, k)[0] for k in range(3) for h in HOSTS]
        assert publish(pub, HOSTS[0], 0) == ("b-h00-0", False)  # a retry: JetStream drops it
        # hostile messages on a partition's subject, then a good batch behind them
        p = PARTS.of("h02")
        _raw(cluster.url, subject(p), b"\x00garbage", {MSG_ID: "g1"})
        doc = {"batch_id": "w1", "host_id": "h02", "columns": {"src_nic": [1]}}
        _raw(cluster.url, subject(p), json.dumps(doc).encode(),
             {MSG_ID: "w1", CONTENT_TYPE: "application/json"})  # fmt: skip
        forged, ctype = encode_batch("h05", windows("h05", 9), "f1")  # h05 is not on leaf1
        _raw(cluster.url, subject(p), forged, {MSG_ID: "f1", CONTENT_TYPE: ctype})
        ids.append(publish(pub, "h02", 3)[0])
        cluster.kill(1)  # one of 3 servers: the stream (R3) and the KV buckets keep going
        ids += [publish(pub, h, 4)[0] for h in HOSTS]
        c = shard.client()
        stored = lambda: metric_sum(c.metrics_text(), "fleetlens_shard_batches_stored")  # noqa: E731
        until(lambda: stored() == len(ids), 60, "stored")
        until(lambda: pending(cluster.url) == 0, 30, "acknowledged")
        end = EPOCH_NS + 10 * 10**9
        flows = c.flows(EPOCH_NS, end)
        assert sum(f["sent"] for f in flows) == SENT * len(HOSTS[1:]) * len(ids)
        text = c.metrics_text()
        assert metric_sum(text, 'fleetlens_ingest_rejected_batches_total{reason="decode"}') == 1
        assert metric_sum(text, 'fleetlens_ingest_rejected_batches_total{reason="type"}') == 1
        assert metric_sum(text, 'fleetlens_ingest_rejected_batches_total{reason="wrong_host"}') == 1
        assert metric_sum(text, "fleetlens_shard_batches_stored") == len(ids)
        lag = lambda: metric_sum(c.metrics_text(), "fleetlens_shard_partition_pending")  # noqa: E731
        until(lambda: lag() == 0, 10, "no lag shown")
    finally:
        shard.stop()
        pub.close()
        cluster.start(1)
        cluster.wait_ready([1])
    assert sorted(stored_ids([shard.db])) == sorted(ids)
    rows = duckdb.sql(f"SELECT count(*) FROM read_parquet('{tmp_path}/parquet/*/*.parquet')")
    assert rows.fetchall()[0][0] == len(ids) * (len(HOSTS) - 1)
