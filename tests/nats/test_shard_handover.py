"""A takeover whose new owner died between its compare-and-set of the mark and its handover
note: the mark it left still names the old owner (``from``), so the next owner writes the
note, and the old owner deletes the group it had in flight: every batch once across files.

The state such a crash leaves is written into the real KV bucket by the test (the new owner's
mark document, made by the shard's own code), since no signal lands between two KV calls."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from collector_waits import until
from fleetlens.api.shard import MARKS, _Mark
from fleetlens.fixtures.nats import NatsCluster
from nats_helpers import HOSTS, PARTS, metric_sum, pending, publish, start_shard, stored_ids

from fleetlens.stream import Publisher

pytest.importorskip("nats")


def _kv(url: str, op: str, key: str, value: bytes = b"") -> bytes | None:
    async def go() -> bytes | None:
        import nats

        nc = await nats.connect(url.split(","))
        try:
            kv = await nc.jetstream().key_value(MARKS)
            if op == "put":
                await kv.put(key, value)
                return None
            try:
                return (await kv.get(key)).value
            except Exception:  # absent or deleted
                return None
        finally:
            await nc.close()

    return asyncio.run(go())


def test_a_takeover_that_died_before_its_note_is_still_reconciled(tmp_path: Path) -> None:
    # a partition shard 1 prefers, which shard 0 holds while shard 1 has never been alive
    part = next(p for p in sorted(set(PARTS.by_host.values()))
                if PARTS.preferred_shard(p, 2) == 1)  # fmt: skip
    hosts = [h for h in HOSTS if PARTS.of(h) == part]
    with NatsCluster(tmp_path / "nats") as cluster:
        shard0 = start_shard(tmp_path, cluster.url, 0, 2)
        shard1 = None
        pub = Publisher(cluster.url)
        try:
            ids = [publish(pub, h, 0)[0] for h in HOSTS]
            stored = lambda s: metric_sum(s.client().metrics_text(),  # noqa: E731
                                          "fleetlens_shard_batches_stored")  # fmt: skip
            until(lambda: stored(shard0) == len(ids), 30, "shard 0 stored every batch")
            shard0.stop(signal.SIGKILL)
            # Shard 1 took the partition over at mark 0 (shard 0's first group in flight)
            # and died before its note: only its mark document says so.
            assert _kv(cluster.url, "get", f"handover.0.{part}") is None
            _kv(cluster.url, "put", f"mark.{part}", _Mark(0, 1, taken_from=0).doc())
            shard1 = start_shard(tmp_path, cluster.url, 1, 2)
            until(lambda: stored(shard1) >= len(hosts), 30, "shard 1 stored the partition")
            assert _kv(cluster.url, "get", f"handover.0.{part}") == b"0"  # noted for shard 0
            shard0 = start_shard(tmp_path, cluster.url, 0, 2)
            reconciled = lambda: metric_sum(shard0.client().metrics_text(),  # noqa: E731
                                            "fleetlens_shard_reconciled_batches")  # fmt: skip
            until(lambda: reconciled() == len(hosts), 30, "shard 0 reconciled its group")
            until(lambda: pending(cluster.url) == 0, 30, "acknowledged")
        finally:
            pub.close()
            for s in (shard0, shard1):
                if s is not None:
                    s.stop()
    copies = stored_ids([tmp_path / f"shard{i}" / "shard.duckdb" for i in (0, 1)])
    assert len(copies) == len(set(copies)), "a batch stored twice"
    assert sorted(copies) == sorted(ids)
