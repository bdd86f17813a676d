"""Collector settings: one typed record, the single source of every default.

``fleetlens collector`` builds its command-line options from the fields that carry a
:class:`Flag` (``cli.py``): the flag's name, help and unit live beside the field, and a flag
given in a coarser unit (hours, seconds) is converted to the field's (ns). Tests and benches
fill the record directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetlens.triangulate.config import TriangulateConfig

MINUTE_NS = 60_000_000_000
HOUR_NS = 3600 * 1_000_000_000
DAY_NS = 24 * HOUR_NS
SECOND_NS = 1_000_000_000


@dataclass(frozen=True)
class Flag:
    """How a setting is given on the command line: ``--name VALUE`` (or a switch for a bool).
    ``per_unit``: the field's value for one unit of the flag's (e.g. HOUR_NS: the flag is in
    hours, the field in ns)."""

    name: str
    help: str = ""
    per_unit: int | None = None
    required: bool = False


def flag(default: Any, name: str, help: str = "", per_unit: int | None = None) -> Any:
    """A field with a default and a command-line flag."""
    return field(default=default, metadata={"flag": Flag(name, help, per_unit)})


@dataclass
class Settings:
    db_path: Path = field(metadata={"flag": Flag("--db", "DuckDB file (created if missing)",
                                                 required=True)})  # fmt: skip
    inventory: str | None = flag(
        None, "--inventory", "fleet inventory (YAML/JSON) or a spec like leafspine:hosts=8"
    )
    ingest_token: str | None = None  # from the environment or --ingest-token-file (cli.py)
    read_token: str | None = None
    insecure_no_auth: bool = flag(False, "--insecure-no-auth", "no tokens (local lab only)")
    public_metrics: bool = flag(False, "--public-metrics", "serve /metrics without a token")
    per_nic_metrics: bool = flag(False, "--per-nic-metrics", "also export one-way-delay "
                                 "histograms per NIC (44 series a NIC: small fleets)")  # fmt: skip
    # Benchmarks of the ingest path alone: the loops would compete for the same cores.
    ingest_only: bool = flag(
        False, "--ingest-only", "store and serve only: no clock solve, triangulation, retention"
    )
    raw_retention_ns: int = flag(DAY_NS, "--raw-retention-hours", "", HOUR_NS)
    agg_retention_ns: int = flag(30 * DAY_NS, "--agg-retention-days", "", DAY_NS)
    # How long a batch id is remembered: a retry within this time is stored once.
    batch_id_retention_ns: int = flag(
        HOUR_NS, "--batch-id-retention-minutes",
        "a retried batch within this time is stored once", MINUTE_NS,
    )  # fmt: skip
    # Agents send fleet time; allow this much clock skew before calling a window "from the future".
    max_future_ns: int = flag(5 * SECOND_NS, "--max-future-seconds", "allowed clock skew",
                              SECOND_NS)  # fmt: skip
    queue_max_batches: int = flag(256, "--queue-batches", "writer queue bound (batches)")
    queue_max_rows: int = flag(4_000_000, "--queue-rows", "writer queue bound (rows)")
    # Processes serving HTTP ingest (decode and checks) in front of this one, which keeps the
    # writer and everything else (api/ingestworker.py); 0: all in this process.
    ingest_workers: int = flag(
        0, "--ingest-workers", "processes that serve HTTP ingest and hand checked batches to "
        "this one (0: all in this process)",
    )  # fmt: skip
    max_body_bytes: int = 64 * 1024 * 1024
    ingest_concurrency: int = 16  # bodies read/decoded at once (memory bound: 16 x 64 MiB)
    loop_interval_s: float = flag(1.0, "--loop-interval", "seconds between loop rounds")
    # The clock solve runs as soon as every live agent has uploaded a window generation
    # (api/arrivals.py), or this long after the window ended (a dead or late agent).
    solve_max_wait_ns: int = 1_000_000_000
    # An agent that registered counts as starting (its first window is waited for) this long.
    agent_starting_ns: int = 10_000_000_000
    retention_interval_s: float = flag(60.0, "--retention-interval",
                                       "seconds between retention passes")  # fmt: skip
    # The loops look at windows that started within this span before the newest one.
    loop_lookback_ns: int = 2_000_000_000
    background_loss: float = flag(
        TriangulateConfig.background_loss, "--background-loss",
        "per-link loss triangulation treats as normal (raise it where the measurement "
        "itself loses that much, e.g. a loaded software-timestamping lab)",
    )  # fmt: skip
    # A window goes to triangulation (once: it is judged once) when every agent expected to
    # send it has (api/arrivals.py) and an earlier window was judged, or when both its end
    # and its first rows are this long ago ...
    triangulate_settle_ns: int = 1_500_000_000
    # ... unless a host that sent the previous window has not sent this one yet (a late
    # upload): then up to this long after the window's end.
    triangulate_max_wait_ns: int = 5_000_000_000
    top_k_links: int = 20
    max_range_ns: int = 31 * DAY_NS
    max_points: int = 10_000
    plan_peers: int = 16
    plan_seed: int = 0
    # Loss rate above which a flow counts as lossy for the fallback triangulation.
    lossy_flow_threshold: float = 0.05
    # A collector shard (api/shard.py): batches from NATS JetStream instead of HTTP ingest.
    nats: str | None = flag(None, "--nats", "NATS servers URL[,URL...]: run as a shard "
                            "consuming the partitions it owns (api/README.md, Shards)")  # fmt: skip
    shard: str | None = flag(None, "--shard", "with --nats: I/K, this shard's index of K "
                             "(default 0/1)")  # fmt: skip
    parquet_dir: str | None = flag(None, "--parquet-dir", "with --nats: write closed minutes "
                                   "as DIR/minute=<ISO>/shard=<I>.parquet")  # fmt: skip
    stream_replicas: int = flag(3, "--stream-replicas", "with --nats: replicas of the stream "
                                "and KV buckets when this shard creates them")  # fmt: skip
    lease_ttl_s: float = flag(10.0, "--lease-ttl-seconds", "with --nats: a dead shard's "
                              "partitions are taken over after this long")  # fmt: skip
    duckdb_threads: int | None = flag(
        None, "--duckdb-threads", "DuckDB worker threads (default: all cores)"
    )
    # DuckDB's buffer pool (its default: 80% of RAM) kept every block the writer wrote: at
    # 1,024 hosts the collector grew by ~70 bytes per stored row, 2.2 GiB in 3 minutes
    # (bench/realtime.py, api/memory.py). Cached blocks past the limit are evicted (a query
    # past it spills beside the file); the writer and the loops' reads fit well within it.
    duckdb_memory_limit: str | None = flag(
        "1GiB", "--duckdb-memory-limit", "DuckDB's buffer pool, e.g. 1GiB (DuckDB's syntax)"
    )

    def auth_enabled(self) -> bool:
        return not self.insecure_no_auth
