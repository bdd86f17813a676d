"""``fleetlens collector --db PATH --listen HOST:PORT [--inventory FILE]``."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from fleetlens.api.config import Flag, Settings

from fleetlens.secrets import INGEST_TOKEN_ENV, READ_TOKEN_ENV, read_secret

# Field annotation -> argparse type for flags given in the field's own unit.
_TYPES: dict[str, type] = {"int": int, "int | None": int, "float": float, "str | None": str,
                           "Path": Path}  # fmt: skip


def _flags() -> list[tuple[str, Flag, Any]]:
    """(field name, flag, default) of every Settings field given on the command line."""
    return [
        (f.name, f.metadata["flag"], None if f.default is MISSING else f.default)
        for f in fields(Settings)
        if "flag" in f.metadata
    ]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fleetlens collector", description=__doc__)
    for name, flag, default in _flags():
        if default is False:
            p.add_argument(flag.name, dest=name, action="store_true", help=flag.help)
            continue
        kind = float if flag.per_unit else _TYPES[str(_annotation(name))]
        shown = default / flag.per_unit if flag.per_unit and default is not None else default
        helped = f"{flag.help} (default %(default)s)".lstrip() if shown is not None else flag.help
        p.add_argument(
            flag.name, dest=name, type=kind, help=helped, required=flag.required,
            default=None if flag.required else shown,
            metavar=flag.name[2:].upper().replace("-", "_"),  # as if dest were the flag's name
        )  # fmt: skip
    p.add_argument("--listen", default="127.0.0.1:8470", help="HOST:PORT (default %(default)s)")
    p.add_argument("--ingest-token-file", type=Path, help="file holding the ingest bearer token")
    p.add_argument("--read-token-file", type=Path, help="file holding the read bearer token")
    p.add_argument("--log-level", default="warning")
    return p


def _annotation(name: str) -> object:
    return next(f.type for f in fields(Settings) if f.name == name)


def settings_from_args(argv: list[str]) -> tuple[Settings, argparse.Namespace]:
    a = parser().parse_args(argv)
    given: dict[str, Any] = {}
    for name, flag, _ in _flags():
        value = getattr(a, name)
        given[name] = int(value * flag.per_unit) if flag.per_unit and value is not None else value
    settings = Settings(
        **given,
        ingest_token=read_secret(INGEST_TOKEN_ENV, a.ingest_token_file),
        read_token=read_secret(READ_TOKEN_ENV, a.read_token_file),
    )
    return settings, a


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

    from fleetlens.api import serving
    from fleetlens.api.app import create_app
    from fleetlens.api.service import Collector

    from fleetlens.heap import keep_freed_memory

    keep_freed_memory()  # per-window arrays reused, not faulted in again (fleetlens/heap.py)

    if settings.nats:
        return _shard(settings, host, int(port), a.log_level)
    collector = Collector(settings)
    if not settings.ingest_workers:
        serving.run(create_app(collector), a.log_level, host.strip("[]"), int(port))
        return 0
    from fleetlens.api.ingestworker import Workers, serve, tcp_listener

    workers = Workers(settings.ingest_workers, tcp_listener(host.strip("[]"), int(port)), argv)
    serve(create_app(collector, attached=workers.attached(collector)), workers, a.log_level)
    return 0


def _shard(settings: Settings, host: str, port: int, log_level: str) -> int:
    """A collector shard (``api/shard.py``): its batches from NATS, no loops of its own (the
    fleet tier runs clock sync and triangulation), its read API and /metrics over HTTP."""
    from dataclasses import replace

    from fleetlens.api import serving
    from fleetlens.api.app import create_app
    from fleetlens.api.fleet import SummaryPublisher
    from fleetlens.api.service import Collector
    from fleetlens.api.shard import Shard, ShardConfig
    from fleetlens.api.shardexport import MinuteExport

    from fleetlens.stream import parse_shard, server_urls

    try:
        index, shards = parse_shard(settings.shard or "0/1")
        servers = server_urls(settings.nats or "")
    except ValueError as e:
        print(f"fleetlens collector: {e}", file=sys.stderr)
        return 2
    if settings.ingest_workers:
        print("fleetlens collector: --nats takes no --ingest-workers", file=sys.stderr)
        return 2
    collector = Collector(replace(settings, ingest_only=True))
    export = None
    if settings.parquet_dir:
        export = MinuteExport(collector.store, Path(settings.parquet_dir), index)
    cfg = ShardConfig(servers, index, shards, settings.stream_replicas, settings.lease_ttl_s)
    # the fleet tier's input: each committed batch's summary (api/fleet.py)
    summaries = SummaryPublisher(",".join(servers), f"{index}/{shards}", cfg.replicas)
    shard = Shard(collector, cfg, export, [summaries])
    app = create_app(collector, attached=shard.attached())
    serving.run(app, log_level, host.strip("[]"), port)
    summaries.close()  # the summaries of the last commits published
    return 0
