"""``fleetlens sim --nats`` and the agent's uploader with ``nats``: their batches stored by a
shard, each once."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from collector_waits import until
from fleetlens.fixtures.nats import NatsCluster
from fleetlens.probe.upload import Uploader
from nats_helpers import PARTS, SPEC, metric_sum, start_shard, stored_ids, windows

pytest.importorskip("nats")


def test_sim_and_the_agents_uploader_publish_to_the_shards(tmp_path: Path) -> None:
    with NatsCluster(tmp_path / "nats") as cluster:
        _publish_and_store(cluster, tmp_path)


def _publish_and_store(cluster: NatsCluster, tmp_path: Path) -> None:
    shard = start_shard(tmp_path, cluster.url, 0, 1)
    try:
        cmd = [sys.executable, "-m", "fleetlens.cli", "sim", "--topology", SPEC, "--seconds",
               "3", "--fast", "--nats", cluster.url, "--peers", "4"]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        sent = int(re.findall(r"window \d+: (\d+) batches", out.stderr)[-1])
        up = Uploader("http://127.0.0.1:9", "h03", None, tmp_path / "spill", nats=cluster.url,
                      partition=PARTS.of("h03"))  # fmt: skip
        up.start()
        for k in range(150, 153):  # windows of closed minutes: never from the future
            up.submit(windows("h03", k))
        assert up.flush(30)
        up.close()
        assert up.stats.uploaded_batches == 3
        c = shard.client()
        stored = lambda: metric_sum(c.metrics_text(), "fleetlens_shard_batches_stored")  # noqa: E731
        until(lambda: stored() == sent + 3, 60, "stored")
    finally:
        shard.stop()
    assert len(stored_ids([shard.db])) == sent + 3
