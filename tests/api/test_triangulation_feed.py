"""Which windows the collector hands to triangulation, and when (real DuckDB file, real
Triangulator; rounds driven by hand with a chosen clock)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from fleetlens.api.config import Settings
from fleetlens.api.service import Collector

from fleetlens.batch import Batch
from fleetlens.records import WINDOW_SCHEMA
from fleetlens.topology import Topology, leaf_spine

T0 = 1_800_000_000_000_000_000
SEC = 1_000_000_000


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    topo = leaf_spine(hosts=4, nics=2, leaves=2, spines=2)
    inv = tmp_path / "fleet.json"
    topo.save(inv)
    c = Collector(Settings(db_path=tmp_path / "fl.duckdb", inventory=str(inv)))
    c.start(loops=False)
    try:
        yield c
    finally:
        c.stop()


def _send(c: Collector, topo: Topology, host: str, start: int) -> None:
    """One window of clean probes from every NIC of ``host`` to every NIC of other hosts."""
    pairs = [(s.id, d.id) for s in topo.nics_by_host[host] for d in topo.nics if d.host != host]
    n = len(pairs)
    t = pa.table(
        {
            "src_nic": [p[0] for p in pairs], "dst_nic": [p[1] for p in pairs],
            "sport": [40000] * n, "start_ns": [start] * n, "duration_ns": [SEC] * n,
            "sent": [100] * n, "received": [100] * n, "pure": [90] * n,
            "owd_min_ns": [20_000.0] * n, "owd_p50_ns": [21_000.0] * n,
            "owd_p99_ns": [25_000.0] * n, "owd_max_ns": [30_000.0] * n,
            "hull_t_ns": [[]] * n, "hull_owd_ns": [[]] * n, "ts_source": ["software"] * n,
            "path": [None] * n,
        },
        schema=WINDOW_SCHEMA,
    )  # fmt: skip
    c.writer.submit_batch(Batch(f"{host}-{start}", host, t)).result(timeout=30)


def _round(c: Collector, start: int, after_end_s: float) -> int | None:
    c.run_round(start + SEC + int(after_end_s * SEC))
    return c.state.triangulated_ns


def test_a_late_upload_is_waited_for_and_a_dead_agent_only_once(collector: Collector) -> None:
    c, topo = collector, collector.topology
    assert topo is not None
    hosts = topo.hosts
    for h in hosts:
        _send(c, topo, h, T0)
    assert _round(c, T0, 2) == T0
    # Window 1: one host's upload is late; the window waits for it.
    for h in hosts[1:]:
        _send(c, topo, h, T0 + SEC)
    assert _round(c, T0 + SEC, 2) == T0
    _send(c, topo, hosts[0], T0 + SEC)
    assert _round(c, T0 + SEC, 2) == T0 + SEC
    # Window 2: a host died. Waited for until the maximum, then judged without it ...
    for h in hosts[1:]:
        _send(c, topo, h, T0 + 2 * SEC)
    assert _round(c, T0 + 2 * SEC, 2) == T0 + SEC
    wait_s = c.settings.triangulate_max_wait_ns / SEC
    assert _round(c, T0 + 2 * SEC, wait_s + 0.1) == T0 + 2 * SEC
    # ... and the next window is not held back for it again.
    for h in hosts[1:]:
        _send(c, topo, h, T0 + 3 * SEC)
    assert _round(c, T0 + 3 * SEC, 2) == T0 + 3 * SEC
