"""Which windows the collector hands to triangulation, and when (real DuckDB file, real
Triangulator; rounds driven by hand with a chosen clock)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from collector_helpers import send_clean_window
from fleetlens.api.config import Settings
from fleetlens.api.service import Collector

from fleetlens.topology import leaf_spine

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


def _round(c: Collector, start: int, after_end_s: float) -> int | None:
    c.run_round(start + SEC + int(after_end_s * SEC))
    return c.state.triangulated_ns


def test_a_late_upload_is_waited_for_and_a_dead_agent_only_once(collector: Collector) -> None:
    c, topo = collector, collector.topology
    assert topo is not None
    hosts = topo.hosts
    for h in hosts:
        send_clean_window(c, topo, h, T0)
    assert _round(c, T0, 2) == T0
    # Window 1: one host's upload is late; the window waits for it.
    for h in hosts[1:]:
        send_clean_window(c, topo, h, T0 + SEC)
    assert _round(c, T0 + SEC, 2) == T0
    send_clean_window(c, topo, hosts[0], T0 + SEC)
    assert _round(c, T0 + SEC, 2) == T0 + SEC
    # Window 2: a host died. Waited for until the maximum, then judged without it ...
    for h in hosts[1:]:
        send_clean_window(c, topo, h, T0 + 2 * SEC)
    assert _round(c, T0 + 2 * SEC, 2) == T0 + SEC
    wait_s = c.settings.triangulate_max_wait_ns / SEC
    assert _round(c, T0 + 2 * SEC, wait_s + 0.1) == T0 + 2 * SEC
    # ... and the next window is not held back for it again.
    for h in hosts[1:]:
        send_clean_window(c, topo, h, T0 + 3 * SEC)
    assert _round(c, T0 + 3 * SEC, 2) == T0 + 3 * SEC
