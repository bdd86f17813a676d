"""Collector settings: one typed record, filled by the CLI (and directly by tests/benches)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MINUTE_NS = 60_000_000_000
HOUR_NS = 3600 * 1_000_000_000
DAY_NS = 24 * HOUR_NS


@dataclass
class Settings:
    db_path: Path
    inventory: str | None = None
    ingest_token: str | None = None
    read_token: str | None = None
    insecure_no_auth: bool = False
    public_metrics: bool = False
    raw_retention_ns: int = DAY_NS
    agg_retention_ns: int = 30 * DAY_NS
    # How long a batch id is remembered: a retry within this time is stored once.
    batch_id_retention_ns: int = HOUR_NS
    # Agents send fleet time; allow this much clock skew before calling a window "from the future".
    max_future_ns: int = 5_000_000_000
    queue_max_batches: int = 256
    queue_max_rows: int = 4_000_000
    max_body_bytes: int = 64 * 1024 * 1024
    ingest_concurrency: int = 16  # bodies read/decoded at once (memory bound: 16 x 64 MiB)
    loop_interval_s: float = 1.0
    # The clock solve runs as soon as every live agent has uploaded a window generation
    # (api/arrivals.py), or this long after the window ended (a dead or late agent).
    solve_max_wait_ns: int = 1_000_000_000
    # An agent that registered counts as starting (its first window is waited for) this long.
    agent_starting_ns: int = 10_000_000_000
    retention_interval_s: float = 60.0
    # The loops look at windows that started within this span before the newest one.
    loop_lookback_ns: int = 2_000_000_000
    background_loss: float = 1e-6  # per-link loss triangulation treats as normal
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
    # Loss rate above which a flow counts as lossy for the placeholder triangulation.
    lossy_flow_threshold: float = 0.05
    duckdb_threads: int | None = None
    duckdb_memory_limit: str | None = None

    def auth_enabled(self) -> bool:
        return not self.insecure_no_auth
