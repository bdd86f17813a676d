"""Which windows the collector hands to triangulation, and when (real DuckDB file, real
Triangulator; rounds driven by hand with a chosen clock)."""

from __future__ import annotations

import time
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


def test_a_window_is_judged_in_the_round_its_last_upload_starts(collector: Collector) -> None:
    """Agents upload right after a window ends and the upload that completes a generation
    wakes the loop: the round that runs then judges that window (a fixed settle time after
    the window's end made every such round judge nothing), but not one still arriving."""
    c, topo = collector, collector.topology
    assert topo is not None
    for h in topo.hosts:
        c.arrivals.registered(h, T0 - SEC)
    # The first windows wait for the settle time (nothing judged yet says who is expected),
    # and the rounds that pass over them meanwhile must not lose them.
    for w in range(3):
        for h in topo.hosts:
            send_clean_window(c, topo, h, T0 + w * SEC)
        judged = _round(c, T0 + w * SEC, 0.1)
    assert judged == T0 + 2 * SEC
    for h in topo.hosts[1:]:
        send_clean_window(c, topo, h, T0 + 3 * SEC)
    assert _round(c, T0 + 3 * SEC, 0.1) == T0 + 2 * SEC


def test_a_replayed_batch_is_not_judged_before_the_other_hosts_rows_come(
    collector: Collector,
) -> None:
    """One host's batch holds two past windows (a spill replayed after a restart): that is
    no sign the other hosts are in, however long ago the windows ended."""
    c, topo = collector, collector.topology
    assert topo is not None
    now = time.time_ns()
    start = (now // SEC - 4) * SEC
    for w in (start, start + SEC):
        send_clean_window(c, topo, topo.hosts[0], w)
    c.run_round(time.time_ns())
    assert c.state.triangulated_ns is not None and c.state.triangulated_ns < start
    for h in topo.hosts[1:]:
        for w in (start, start + SEC):
            send_clean_window(c, topo, h, w)
    c.run_round(now + c.settings.triangulate_settle_ns + SEC)
    assert c.state.triangulated_ns == start + SEC
