"""``fleetlens collector`` options: built from Settings, with the flag names, units and
defaults operators' scripts rely on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fleetlens.api.cli import parser, settings_from_args
from fleetlens.api.config import DAY_NS, HOUR_NS, MINUTE_NS, Settings
from fleetlens.triangulate import TriangulateConfig

FLAGS = {
    "--db", "--listen", "--inventory", "--ingest-token-file", "--read-token-file",
    "--insecure-no-auth", "--public-metrics", "--per-nic-metrics", "--raw-retention-hours",
    "--agg-retention-days", "--batch-id-retention-minutes", "--max-future-seconds",
    "--queue-batches", "--queue-rows",
    "--loop-interval", "--background-loss", "--retention-interval", "--duckdb-threads",
    "--duckdb-memory-limit", "--log-level", "--ingest-only", "--ingest-workers",
    "--nats", "--shard", "--parquet-dir", "--stream-replicas", "--lease-ttl-seconds",
}  # fmt: skip


def test_every_flag_is_kept() -> None:
    names = set(re.findall(r"--[a-z-]+", parser().format_usage())) - {"--help"}
    assert names == FLAGS


def test_no_flags_give_the_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEETLENS_INGEST_TOKEN", raising=False)
    monkeypatch.delenv("FLEETLENS_READ_TOKEN", raising=False)
    s, a = settings_from_args(["--db", "fl.duckdb"])
    assert s == Settings(db_path=Path("fl.duckdb"))
    assert s.background_loss == TriangulateConfig.background_loss
    assert a.listen == "127.0.0.1:8470"


def test_flags_in_their_units() -> None:
    s, _ = settings_from_args([
        "--db", "fl.duckdb", "--inventory", "leafspine:hosts=8", "--insecure-no-auth",
        "--public-metrics", "--raw-retention-hours", "48", "--agg-retention-days", "7",
        "--batch-id-retention-minutes", "5", "--max-future-seconds", "2.5",
        "--queue-batches", "8", "--queue-rows", "1000", "--loop-interval", "0.2",
        "--background-loss", "1e-3", "--retention-interval", "30", "--duckdb-threads", "2",
        "--duckdb-memory-limit", "4GB", "--ingest-workers", "3",
    ])  # fmt: skip
    assert (s.inventory, s.insecure_no_auth, s.public_metrics) == ("leafspine:hosts=8", True, True)
    assert s.raw_retention_ns == 48 * HOUR_NS and s.agg_retention_ns == 7 * DAY_NS
    assert s.batch_id_retention_ns == 5 * MINUTE_NS and s.max_future_ns == 2_500_000_000
    assert (s.queue_max_batches, s.queue_max_rows, s.loop_interval_s) == (8, 1000, 0.2)
    assert (s.background_loss, s.retention_interval_s) == (1e-3, 30.0)
    assert (s.duckdb_threads, s.duckdb_memory_limit, s.ingest_workers) == (2, "4GB", 3)
    assert isinstance(s.raw_retention_ns, int) and isinstance(s.queue_max_rows, int)


def test_db_is_required() -> None:
    with pytest.raises(SystemExit):
        settings_from_args([])
