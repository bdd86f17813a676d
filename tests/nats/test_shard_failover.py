"""Shards failing: kill -9 of one of 2 shards mid-stream, restarted 10 s later (every batch id
stored exactly once across the shards' files); a shard paused 12 s, past its 6 s lease (its
backlog drains, the lag metrics show the oldest message's >= 10 s wait)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from collector_waits import until
from fleetlens.fixtures.nats import NatsCluster
from nats_helpers import HOSTS, metric_sum, pending, publish, start_shard, stored_ids

from fleetlens.stream import Publisher

pytest.importorskip("nats")

STORED = "fleetlens_shard_batches_stored"
pytestmark = pytest.mark.serial  # kills and restarts a shard against a deadline


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path_factory.mktemp("nats")) as nc:
        yield nc


class Feed:
    """Every host publishes one batch per round until stopped, like a fleet of agents."""

    def __init__(self, url: str, first: int, period_s: float = 0.25) -> None:
        self.pub = Publisher(url)
        self.ids: list[str] = []
        self.k = first
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True)
        self._thread.start()

    def _run(self, period_s: float) -> None:
        while not self._stop.is_set():
            self.ids += [publish(self.pub, h, self.k)[0] for h in HOSTS]
            self.k += 1
            self._stop.wait(period_s)

    def stop(self) -> list[str]:
        self._stop.set()
        self._thread.join(60)
        self.pub.close()
        return self.ids


def _metric(text: str, prefix: str) -> float:
    return max([float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                if ln.startswith(prefix)] or [0.0])  # fmt: skip


def test_kill9_of_a_shard_stores_every_batch_exactly_once(
    cluster: NatsCluster, tmp_path: Path
) -> None:
    shards = [start_shard(tmp_path, cluster.url, i, 2) for i in range(2)]
    feed = Feed(cluster.url, first=0)
    try:
        c1 = shards[1].client()
        until(lambda: metric_sum(c1.metrics_text(), STORED) > 0, 30, "shard 1 storing")
        time.sleep(1)
        port = int(shards[1].url.rsplit(":", 1)[1])
        shards[1].stop(signal.SIGKILL)  # mid-stream: its group in flight is never acknowledged
        time.sleep(10)
        shards[1] = start_shard(tmp_path, cluster.url, 1, 2, port=port)
        time.sleep(3)
        ids = feed.stop()
        until(lambda: pending(cluster.url) == 0, 60, "drained")
        took = _metric(shards[0].client().metrics_text(), "fleetlens_shard_takeovers_total")
        assert took >= 1  # shard 0 took shard 1's partitions over while it was down
    finally:
        feed.stop()
        for s in shards:
            s.stop()
    copies = stored_ids([s.db for s in shards])
    assert len(copies) == len(set(copies)), "a batch stored twice"
    assert sorted(copies) == sorted(ids)
    rows = duckdb.sql(f"SELECT count(*) FROM read_parquet('{tmp_path}/parquet/*/*.parquet')")
    assert rows.fetchall()[0][0] == len(ids) * (len(HOSTS) - 1)


def test_a_paused_shard_drains_its_backlog_and_shows_its_lag(
    cluster: NatsCluster, tmp_path: Path
) -> None:
    shard = start_shard(tmp_path, cluster.url, 0, 1)
    pub = Publisher(cluster.url)
    try:
        ids = [publish(pub, h, 100)[0] for h in HOSTS]
        c = shard.client()
        stored = lambda: metric_sum(c.metrics_text(), STORED)  # noqa: E731
        until(lambda: stored() == len(ids), 30, "stored")
        shard.proc.send_signal(signal.SIGSTOP)
        try:
            for k in range(101, 111):
                ids += [publish(pub, h, k)[0] for h in HOSTS]
                time.sleep(1.0)
            # The first paused batch is >= 10 s old now; 2 s more so that it is past the
            # bound when the shard measures it, not on it (20 s here was 8 s of waiting more).
            time.sleep(2)
        finally:
            shard.proc.send_signal(signal.SIGCONT)
        ages, backlog = [], []
        deadline = time.monotonic() + 30
        while metric_sum(text := c.metrics_text(), STORED) < len(ids) or not ages or max(ages) < 10:
            ages.append(_metric(text, "fleetlens_shard_partition_oldest_unacked_seconds"))
            backlog.append(_metric(text, "fleetlens_shard_partition_pending_messages"))
            assert time.monotonic() < deadline, f"not drained: {stored()} of {len(ids)}"
            time.sleep(0.2)
        assert max(ages) >= 10  # the oldest of the backlog waited through the pause
        assert max(backlog) > 0
        until(lambda: pending(cluster.url) == 0, 30, "acknowledged")
    finally:
        shard.stop()
        pub.close()
    assert sorted(stored_ids([shard.db])) == sorted(ids)
