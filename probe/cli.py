"""``fleetlens agent``: run the probe agent on this host (inside a lab host: ``lab exec``)."""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import signal
import socket
import sys
from pathlib import Path

from fleetlens.probe.agent import Agent, AgentConfig
from fleetlens.probe.datapath import PRIMER_MODES
from fleetlens.probe.nics import ROCE_DSCP

from fleetlens.secrets import INGEST_TOKEN_ENV, read_secret

log = logging.getLogger("fleetlens.agent")
# Lab convenience only: every agent started without a key file shares it, and says so.
_LAB_KEY_SEED = b"fleetlens-insecure-lab-key"


def read_key(path: Path | None) -> bytes:
    """16-byte fleet key: 32 hex digits, or any other secret hashed down to 16 bytes."""
    if path is None:
        log.warning("no --fleet-key-file: using the INSECURE shared lab key")
        return hashlib.blake2b(_LAB_KEY_SEED, digest_size=16).digest()
    raw = path.read_bytes().strip()
    try:
        key = bytes.fromhex(raw.decode())
        if len(key) == 16:
            return key
    except ValueError:
        pass
    if len(raw) < 16:
        raise SystemExit(f"fleetlens agent: {path} holds fewer than 16 bytes of key material")
    return hashlib.blake2b(raw, digest_size=16).digest()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fleetlens agent", description=__doc__)
    p.add_argument("--collector", required=True, help="collector URL, e.g. http://10.254.0.1:8470")
    p.add_argument("--host-id", default=os.environ.get("FLEETLENS_HOST_ID", socket.gethostname()))
    p.add_argument("--nics", default="eth*", help="interface name pattern (default %(default)s)")
    p.add_argument("--fleet-key-file", type=Path, help="key that authenticates probes and acks")
    p.add_argument("--token-file", type=Path, help="ingest token (else $FLEETLENS_INGEST_TOKEN)")
    p.add_argument(
        "--dscp", type=int, default=ROCE_DSCP, help="DSCP of probes (default %(default)s, RoCE)"
    )
    p.add_argument("--state-dir", type=Path, default=Path("/run/fleetlens/agent"))
    p.add_argument("--decision-file", type=Path, help="where to write LinkPass decisions")
    p.add_argument("--metrics", default="127.0.0.1:0", help="ADDR:PORT of /metrics (port 0: off)")
    p.add_argument(
        "--clock-offset-ns", type=float, default=0.0, help="tests: distort this host's clock"
    )
    p.add_argument(
        "--clock-drift-ppb", type=float, default=0.0, help="tests: distort this host's clock rate"
    )
    p.add_argument(
        "--clock-epoch-ns", type=int, help="tests: when the injected drift starts (default: now)"
    )
    p.add_argument("--purity-ns", type=int, default=1_000, help="pair purity threshold")
    p.add_argument(
        "--primer", choices=PRIMER_MODES, default="auto",
        help="a primer datagram before each probe pair to warm a cold send/receive path "
        "(auto: on NICs with software timestamps)",
    )  # fmt: skip
    p.add_argument("--duration", type=float, help="stop after this many seconds")
    p.add_argument(
        "--mem-batches", type=int, default=120, help="batches held in memory before spilling"
    )
    p.add_argument(
        "--path-refresh", type=float, default=30.0, help="seconds between path discoveries (0: off)"
    )
    p.add_argument(
        "--nats", help="NATS servers URL[,URL...]: publish batches to JetStream instead of "
        "POST /v1/ingest (registration, plan, clocks, decisions stay with --collector)",
    )  # fmt: skip
    p.add_argument(
        "--nats-partition", help="with --nats: this host's partition (default: from "
        "--inventory, else a hash of the host id)",
    )  # fmt: skip
    p.add_argument("--inventory", help="with --nats: the fleet inventory (file or spec)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _partition(a: argparse.Namespace) -> str:
    """The subject partition this host publishes on (fleetlens/stream.py)."""
    if not a.nats:
        return ""
    if a.nats_partition:
        return str(a.nats_partition)
    from fleetlens.stream import Partitions
    from fleetlens.topology import Topology

    return Partitions(Topology.load(a.inventory) if a.inventory else None).of(a.host_id)


def main(argv: list[str]) -> int:
    a = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if a.verbose else logging.INFO,
        format=f"%(asctime)s {a.host_id} %(name)s %(levelname)s %(message)s",
    )
    if not 0 <= a.dscp < 64:
        raise SystemExit("fleetlens agent: --dscp must be 0..63")
    token = read_secret(INGEST_TOKEN_ENV, a.token_file)
    addr, _, port = a.metrics.rpartition(":")
    cfg = AgentConfig(
        collector=a.collector, host_id=a.host_id, key=read_key(a.fleet_key_file), token=token,
        nics=a.nics, dscp=a.dscp, state_dir=a.state_dir, decision_file=a.decision_file,
        metrics_addr=addr or "127.0.0.1", metrics_port=int(port or 0),
        clock_offset_ns=a.clock_offset_ns, clock_drift_ppb=a.clock_drift_ppb,
        clock_epoch_ns=a.clock_epoch_ns,
        purity_ns=a.purity_ns, primer=a.primer, duration_s=a.duration, mem_batches=a.mem_batches,
        path_refresh_s=a.path_refresh, nats=a.nats, nats_partition=_partition(a),
    )  # fmt: skip
    agent = Agent(cfg)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop.set())
    signal.signal(signal.SIGINT, lambda *_: agent.stop.set())
    return agent.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
