"""Helpers for the collector tests: a real `fleetlens collector` subprocess on 127.0.0.1 with a
real DuckDB file, and a small vectorized window generator with known contents."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import uvicorn
from fleetlens.api.app import create_app
from fleetlens.api.config import Settings
from fleetlens.api.service import Collector
from fleetlens.fixtures.collector import CollectorProcess, free_port, start_collector
from prometheus_client.parser import text_string_to_metric_families

from fleetlens.batch import Batch
from fleetlens.records import WINDOW_SCHEMA
from fleetlens.topology import Topology

INGEST, READ = "ingest-secret-1", "read-secret-2"
FLEETLENS = str(Path(sys.executable).with_name("fleetlens"))
WINDOW_NS = 1_000_000_000


@dataclass
class Server:
    """A collector process and its inventory; ``client`` is a raw HTTP client, for tests of
    what the API answers (status codes, headers, bodies) rather than what a caller gets."""

    process: CollectorProcess
    inventory: Path

    @property
    def url(self) -> str:
        return self.process.url

    @property
    def db(self) -> Path:
        return self.process.db

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.process.proc

    @property
    def log(self) -> Path:
        return self.process.log

    def client(self, token: str | None = READ) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.process.stop(sig)


def start_server(
    tmp: Path, inventory: Path, *extra: str, db: Path | None = None, env_tokens: bool = True
) -> Server:
    """A collector on a free port with round loops every 0.2 s; ``env_tokens``: the test's
    INGEST and READ tokens in its environment (else the caller passes token options)."""
    port = free_port()
    proc = start_collector(
        db or tmp / "fleet.duckdb", inventory, ["--loop-interval", "0.2", *extra],
        tokens=(INGEST, READ) if env_tokens else None, port=port,
        log=tmp / f"collector-{port}.log",
    )  # fmt: skip
    return Server(proc, inventory)


def make_windows(
    topo: Topology,
    host: str,
    start_ns: int,
    n_windows: int = 1,
    sports: int = 2,
    lossy_links: frozenset[str] = frozenset(),
    loss: float = 0.3,
    seed: int = 0,
) -> pa.Table:
    """Windows of every flow from ``host``'s NICs to every NIC of other hosts, ``sports`` source
    ports each, for ``n_windows`` consecutive 1 s windows. Each flow's path is its ECMP path
    ``sport % len(paths)``; flows whose path crosses one of ``lossy_links`` lose ``loss`` of
    their probes, the others none. OWD values are deterministic from ``seed``."""
    pairs = [
        (s.id, d.id, p, path)
        for s in topo.nics_by_host[host]
        for d in topo.nics if d.host != host
        for p in range(33000, 33000 + sports)
        for path in [topo.ecmp_paths(s.id, d.id)[p % len(topo.ecmp_paths(s.id, d.id))]]
    ]  # fmt: skip
    n = len(pairs) * n_windows
    rng = np.random.default_rng(seed)
    lossy = np.array([bool(lossy_links & set(pt)) for *_, pt in pairs] * n_windows)
    sent = np.full(n, 200, np.int32)
    received = np.where(lossy, np.int32(200 * (1 - loss)), sent).astype(np.int32)
    base = rng.uniform(2_000, 4_000, n)
    starts = start_ns + np.repeat(np.arange(n_windows, dtype=np.int64) * WINDOW_NS, len(pairs))
    hull_t = [[int(s), int(s) + 500_000_000] for s in starts]
    cols = {
        "src_nic": [p[0] for p in pairs] * n_windows,
        "dst_nic": [p[1] for p in pairs] * n_windows,
        "sport": np.array([p[2] for p in pairs] * n_windows, np.int32),
        "start_ns": starts,
        "duration_ns": np.full(n, WINDOW_NS, np.int64),
        "sent": sent,
        "received": received,
        "pure": (received // 2).astype(np.int32),
        "owd_min_ns": base,
        "owd_p50_ns": base * 1.5,
        "owd_p99_ns": base * 3,
        "owd_max_ns": base * 4,
        "hull_t_ns": hull_t,
        "hull_owd_ns": [[int(b), int(b) + 10] for b in base],
        "ts_source": ["software"] * n,
        "path": [list(p[3]) for p in pairs] * n_windows,
        "acks_lost": np.zeros(n, np.int32),
    }
    return pa.table(cols, schema=WINDOW_SCHEMA)


def metric(text: str, name: str, **labels: str) -> float:
    """One sample of a Prometheus text exposition; KeyError if absent (absent is not zero)."""
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise KeyError(f"{name}{labels}")


class InProcessServer:
    """uvicorn in a thread around a Collector object the test can reach into (e.g. to hold the
    writer busy); still real HTTP on 127.0.0.1 and a real DuckDB file."""

    def __init__(self, settings: Settings) -> None:
        self.collector = Collector(settings)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(create_app(self.collector), host="127.0.0.1", port=self.port,
                                log_level="warning", lifespan="on")  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn-test", daemon=True)

    def __enter__(self) -> InProcessServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("in-process collector did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    def client(self, token: str | None = READ) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


def send_clean_window(c: Collector, topo: Topology, host: str, start: int, **options: Any) -> None:
    """One window of clean probes from every NIC of ``host`` to every NIC of other hosts
    (:func:`clean_window`, with its ``options``), written through the collector's writer as
    an agent's upload would be."""
    t = clean_window(topo, host, start, **options)
    c.submit(Batch(f"{host}-{start}", host, t)).result(timeout=30)


def clean_window(
    topo: Topology,
    host: str,
    start: int,
    with_hull: bool = False,
    received: int = 100,
    path: list[str] | None = None,
) -> pa.Table:
    """One window of clean probes from every NIC of ``host`` to every NIC of other hosts.
    ``with_hull`` adds a one-point hull per row so the clock solve has something to fit;
    ``received`` (of 100) and ``path`` are every row's."""
    pairs = [(s.id, d.id) for s in topo.nics_by_host[host] for d in topo.nics if d.host != host]
    n = len(pairs)
    hull_t, hull_owd = ([5], [20_000]) if with_hull else ([], [])
    t = pa.table(
        {
            "src_nic": [p[0] for p in pairs], "dst_nic": [p[1] for p in pairs],
            "sport": [40000] * n, "start_ns": [start] * n, "duration_ns": [WINDOW_NS] * n,
            "sent": [100] * n, "received": [received] * n, "pure": [90] * n,
            "owd_min_ns": [20_000.0] * n, "owd_p50_ns": [21_000.0] * n,
            "owd_p99_ns": [25_000.0] * n, "owd_max_ns": [30_000.0] * n,
            "hull_t_ns": [hull_t] * n, "hull_owd_ns": [hull_owd] * n,
            "ts_source": ["software"] * n, "path": [path] * n, "acks_lost": [0] * n,
        },
        schema=WINDOW_SCHEMA,
    )  # fmt: skip
    return t
