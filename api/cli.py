"""``fleetlens collector --db PATH --listen HOST:PORT [--inventory FILE]``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from fleetlens.api.config import DAY_NS, HOUR_NS, Settings


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fleetlens collector", description=__doc__)
    p.add_argument("--db", required=True, type=Path, help="DuckDB file (created if missing)")
    p.add_argument("--listen", default="127.0.0.1:8470", help="HOST:PORT (default %(default)s)")
    p.add_argument(
        "--inventory", help="fleet inventory (YAML/JSON) or a spec like leafspine:hosts=8"
    )
    p.add_argument("--ingest-token-file", type=Path, help="file holding the ingest bearer token")
    p.add_argument("--read-token-file", type=Path, help="file holding the read bearer token")
    p.add_argument("--insecure-no-auth", action="store_true", help="no tokens (local lab only)")
    p.add_argument("--public-metrics", action="store_true", help="serve /metrics without a token")
    p.add_argument("--raw-retention-hours", type=float, default=24.0)
    p.add_argument("--agg-retention-days", type=float, default=30.0)
    p.add_argument("--batch-id-retention-minutes", type=float, default=60.0,
                   help="a retried batch within this time is stored once")  # fmt: skip
    p.add_argument("--max-future-seconds", type=float, default=5.0, help="allowed clock skew")
    p.add_argument("--queue-batches", type=int, default=256, help="writer queue bound (batches)")
    p.add_argument("--queue-rows", type=int, default=4_000_000, help="writer queue bound (rows)")
    p.add_argument("--loop-interval", type=float, default=1.0, help="seconds between loop rounds")
    p.add_argument(
        "--background-loss", type=float, default=1e-6,
        help="per-link loss triangulation treats as normal (raise it where the measurement "
        "itself loses that much, e.g. a loaded software-timestamping lab)",
    )  # fmt: skip
    p.add_argument("--retention-interval", type=float, default=60.0)
    p.add_argument("--duckdb-threads", type=int, help="DuckDB worker threads (default: all cores)")
    p.add_argument("--duckdb-memory-limit", help="e.g. 4GB (default: DuckDB's 80%% of RAM)")
    p.add_argument("--log-level", default="warning")
    return p


def _token(env: str, path: Path | None) -> str | None:
    if path is not None:
        return path.read_text().strip() or None
    return os.environ.get(env) or None


def settings_from_args(argv: list[str]) -> tuple[Settings, argparse.Namespace]:
    a = _parser().parse_args(argv)
    return Settings(
        db_path=a.db,
        inventory=a.inventory,
        ingest_token=_token("FLEETLENS_INGEST_TOKEN", a.ingest_token_file),
        read_token=_token("FLEETLENS_READ_TOKEN", a.read_token_file),
        insecure_no_auth=a.insecure_no_auth,
        public_metrics=a.public_metrics,
        raw_retention_ns=int(a.raw_retention_hours * HOUR_NS),
        agg_retention_ns=int(a.agg_retention_days * DAY_NS),
        batch_id_retention_ns=int(a.batch_id_retention_minutes * 60e9),
        max_future_ns=int(a.max_future_seconds * 1e9),
        queue_max_batches=a.queue_batches,
        queue_max_rows=a.queue_rows,
        loop_interval_s=a.loop_interval,
        background_loss=a.background_loss,
        retention_interval_s=a.retention_interval,
        duckdb_threads=a.duckdb_threads,
        duckdb_memory_limit=a.duckdb_memory_limit,
    ), a


def main(argv: list[str]) -> int:
    settings, a = settings_from_args(argv)
    if settings.auth_enabled() and not (settings.ingest_token and settings.read_token):
        print(
            "fleetlens collector: refusing to start without tokens: set FLEETLENS_INGEST_TOKEN and "
            "FLEETLENS_READ_TOKEN (or --ingest-token-file/--read-token-file), or pass "
            "--insecure-no-auth for a local lab",
            file=sys.stderr,
        )
        return 2
    if settings.auth_enabled() and settings.ingest_token == settings.read_token:
        print("fleetlens collector: the ingest and read tokens must differ", file=sys.stderr)
        return 2
    host, _, port = a.listen.rpartition(":")
    if not host or not port.isdigit():
        print(f"fleetlens collector: --listen wants HOST:PORT, got {a.listen!r}", file=sys.stderr)
        return 2
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(name)s %(message)s")

    import uvicorn
    from fleetlens.api.app import create_app
    from fleetlens.api.service import Collector

    from fleetlens.heap import keep_freed_memory

    keep_freed_memory()  # per-window arrays reused, not faulted in again (fleetlens/heap.py)

    collector = Collector(settings)
    app = create_app(collector)
    uvicorn.run(app, host=host.strip("[]"), port=int(port), log_level=a.log_level, access_log=False)
    return 0
