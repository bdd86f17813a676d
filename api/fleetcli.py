"""``fleetlens fleet --nats URL[,URL] --shards K --inventory FILE --listen HOST:PORT --db PATH
[--parquet DIR[,DIR]]``: the fleet tier (``fleet.py``).

Every ``fleetlens collector`` option applies too (tokens, loop timing, ``--db`` for the tier's
own outputs: batch ids, registrations, clocks, verdicts, decisions, jobs).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from fleetlens.api.config import Settings


def _fleet_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fleetlens fleet", description=__doc__, add_help=False)
    p.add_argument("--nats", required=True, help="NATS URLs, comma-separated")
    p.add_argument("--shards", type=int, required=True, help="collector shards publishing (K)")
    p.add_argument("--parquet", default="", help="the shards' Parquet directories, comma-separated")
    p.add_argument(
        "--summary-replicas", type=int, default=3,
        help="replicas of FLEETLENS_SUMMARIES and FLEETLENS_REGISTRY when the tier creates them "
        "(default 3)",
    )  # fmt: skip
    return p


def _refusal(settings: Settings, host: str, port: str) -> str | None:
    """Why the tier must not start (the collector's own rules), or None."""
    if settings.auth_enabled() and not (settings.ingest_token and settings.read_token):
        return (
            "refusing to start without tokens: set FLEETLENS_INGEST_TOKEN and "
            "FLEETLENS_READ_TOKEN (or the token files), or pass --insecure-no-auth"
        )
    if settings.auth_enabled() and settings.ingest_token == settings.read_token:
        return "the ingest and read tokens must differ"
    if not host or not port.isdigit():
        return "--listen wants HOST:PORT"
    return None


def main(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        _fleet_parser().print_help()
        print("\nand every 'fleetlens collector' option (fleetlens collector --help)")
        return 0
    own, rest = _fleet_parser().parse_known_args(argv)
    if own.shards < 1:
        print("fleetlens fleet: --shards wants K >= 1", file=sys.stderr)
        return 2
    from fleetlens.api import cli

    settings, a = cli.settings_from_args(rest)
    if settings.inventory is None:
        print("fleetlens fleet: --inventory is required (triangulation needs the topology)",
              file=sys.stderr)  # fmt: skip
        return 2
    host, _, port = a.listen.rpartition(":")
    bad = _refusal(settings, host, port)
    if bad:
        print(f"fleetlens fleet: {bad}", file=sys.stderr)
        return 2
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(name)s %(message)s")

    from fleetlens.api import serving
    from fleetlens.api.app import create_app
    from fleetlens.api.fleet import FleetCollector, SummaryConsumer
    from fleetlens.api.registry import RegistryWriter

    from fleetlens.heap import keep_freed_memory

    keep_freed_memory()
    dirs = [Path(d) for d in own.parquet.split(",") if d]
    registry = RegistryWriter(own.nats, own.summary_replicas)
    fleet = FleetCollector(settings, dirs, registry=registry)
    fleet.shards_expected.set(own.shards)
    consumer = SummaryConsumer(fleet, own.nats, own.summary_replicas)
    app = create_app(fleet, attached=consumer.attached)
    serving.run(app, a.log_level, host.strip("[]"), int(port))
    return 0
