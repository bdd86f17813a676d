"""Which windows the collector hands to triangulation, and when (real DuckDB file, real
Triangulator; rounds driven by hand with a chosen clock)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from collector_helpers import send_clean_window
from fleetlens.api.clockgate import CLOCK_ADOPTION_NS
from fleetlens.api.config import Settings
from fleetlens.api.queries import clock_out
from fleetlens.api.service import Collector, Engines

from fleetlens.records import WINDOW_SCHEMA, ClockModel, Verdict, nic_hosts
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


def _round(c: Collector, start: int, after_end_s: float) -> int | None:
    c.run_round(start + SEC + int(after_end_s * SEC))
    return c.feed.triangulated_ns


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
    assert c.feed.triangulated_ns is not None and c.feed.triangulated_ns < start
    for h in topo.hosts[1:]:
        for w in (start, start + SEC):
            send_clean_window(c, topo, h, w)
    c.run_round(now + c.settings.triangulate_settle_ns + SEC)
    assert c.feed.triangulated_ns == start + SEC


def test_what_is_judged_flows_to_live_hosts_with_delays_only_in_fleet_time(
    tmp_path: Path,
) -> None:
    """Flows towards a host whose agent was not yet running are dropped (a whole window of
    margin); one-way delays are kept only where both ends' clocks are trusted; the rest is
    handed over as stored, in WINDOW_SCHEMA with the hulls left out."""
    topo = leaf_spine(hosts=4, nics=2, leaves=2, spines=2)
    inv = tmp_path / "fleet.json"
    topo.save(inv)
    seen: list[pa.Table] = []

    def judge(windows: pa.Table, topology: Topology | None, prev: dict) -> list[Verdict]:
        seen.append(windows)
        return []

    engines = Engines(solve_clocks=lambda *_: [], triangulate=judge)
    c = Collector(Settings(db_path=tmp_path / "fl.duckdb", inventory=str(inv)), engines)
    c.start(loops=False)
    try:
        h = topo.hosts
        for host in h[:3]:  # h[3]'s agent starts a window later
            send_clean_window(c, topo, host, T0, with_hull=True)
        c.run_round(T0 + 3 * SEC)
        assert not seen  # every flow's far end started this window: nothing to judge
        c.clock_gate.trust({h[0]: T0, h[1]: T0})
        for host in h:
            send_clean_window(c, topo, host, T0 + SEC, with_hull=True)
        c.run_round(T0 + 4 * SEC)
    finally:
        c.stop()
    assert len(seen) == 1
    got = seen[0]
    assert got.schema == WINDOW_SCHEMA
    assert got["hull_t_ns"].null_count == got.num_rows  # not read for it
    src, dst = nic_hosts(got["src_nic"]).to_pylist(), nic_hosts(got["dst_nic"]).to_pylist()
    nics = len(topo.nics_by_host[h[0]])
    # every host sent to every NIC of the others; the flows towards h[3] are gone
    assert h[3] not in dst and h[3] in src
    assert got.num_rows == 4 * 3 * nics * nics - 3 * nics * nics
    owd = got["owd_min_ns"].to_pylist()
    for s_, d_, o in zip(src, dst, owd, strict=True):
        both_trusted = {s_, d_} <= {h[0], h[1]}
        assert (o == 20_000.0) if both_trusted else (o is None), (s_, d_, o)
    assert pc.all(pc.equal(got["sent"], 100)).as_py()


def test_without_an_inventory_the_placeholder_judges_the_reported_paths(tmp_path: Path) -> None:
    """No topology, no engine: the placeholder reads the paths of the newest windows (the
    clock solve's read, which leaves them out when an engine reads its own)."""
    topo = leaf_spine(hosts=4, nics=1, leaves=2, spines=2)
    c = Collector(Settings(db_path=tmp_path / "fl.duckdb"))
    c.start(loops=False)
    try:
        bad = ["leaf0->spine1"]
        for host in topo.hosts:
            send_clean_window(c, topo, host, T0, received=50, path=bad)
        c.run_round(T0 + 3 * SEC)
        got = c.served.verdicts().get(bad[0])
    finally:
        c.stop()
    assert got is not None and got.state == "faulty", got


def test_one_way_delays_count_only_from_a_tight_synced_model_and_its_adoption(
    collector: Collector,
) -> None:
    """A first solve over half the agents publishes "synced" models with a 20 us bound;
    they are not trusted. A tight model is, once agents have had time to fetch it."""
    loose = ClockModel("h00", T0, 195_596.0, 0.0, 20_598.0, True)
    tight = ClockModel("h01", T0, -531_137.0, 16_057.0, 200.0, True)
    unsynced = ClockModel("h02", T0, 0.0, 0.0, None, False)
    collector.clock_gate.note_models([loose, tight, unsynced], T0)
    assert collector.clock_gate.trusted_from_ns == {"h01": T0 + CLOCK_ADOPTION_NS}
    assert CLOCK_ADOPTION_NS >= 3 * SEC  # a control interval, a window, and slack
    served = {m.host_id: clock_out(collector, m).delay_evidence_from for m in (loose, tight)}
    assert served == {"h00": None, "h01": T0 + CLOCK_ADOPTION_NS}  # what /v1/clocks says
    later = ClockModel("h00", T0 + SEC, 204_371.0, 16_125.0, 67.0, True)
    collector.clock_gate.note_models([later], T0 + SEC)
    assert collector.clock_gate.trusted_from_ns["h00"] == T0 + SEC + CLOCK_ADOPTION_NS
    assert collector.clock_gate.trusted_from_ns["h01"] == T0 + CLOCK_ADOPTION_NS  # kept


def test_verdicts_are_published_before_the_clock_solve_and_without_it(tmp_path: Path) -> None:
    """A round stores and publishes triangulation's verdicts and decisions before it solves
    the clocks (a solve takes seconds on a big fleet); a failing solve holds nothing back."""
    topo = leaf_spine(hosts=4, nics=1, leaves=2, spines=2)
    inv = tmp_path / "fleet.json"
    topo.save(inv)
    bad = Verdict("leaf0->spine1", "link", "faulty", T0, loss_rate=0.5, confidence=1.0)
    seen_at_solve: list[dict[str, Verdict]] = []

    def solve(windows: pa.Table, topology: Topology | None, prev: dict) -> list[ClockModel]:
        seen_at_solve.append(dict(c.served.verdicts()))
        raise RuntimeError("solver failed")

    engines = Engines(solve_clocks=solve, triangulate=lambda *_: [bad])
    c = Collector(Settings(db_path=tmp_path / "fl.duckdb", inventory=str(inv)), engines)
    c.start(loops=False)
    try:
        for w in range(2):  # the first window makes the hosts live, the second is judged
            for host in topo.hosts:
                send_clean_window(c, topo, host, T0 + w * SEC)
            c.run_round(T0 + (3 + w) * SEC)
        stored = c.store.read().execute("SELECT subject, state FROM verdicts").fetchall()
        errors = c.metrics.registry.get_sample_value(
            "fleetlens_loop_errors_total", {"loop": "clocks"}
        )
    finally:
        c.stop()
    assert seen_at_solve == [{}, {bad.subject: bad}]  # published when the solve started
    assert c.served.verdicts() == {bad.subject: bad}
    assert (bad.subject, "faulty") in stored
    assert errors == 2


def test_triangulation_goes_on_while_a_clock_solve_is_stuck(tmp_path: Path) -> None:
    """The background loops: windows keep being judged and their verdicts published while a
    clock solve takes long (0.1-3.8 s of wall time a round on the busy lab; here it hangs until
    released). With one loop for both, no window after the solve began was judged."""
    topo = leaf_spine(hosts=4, nics=1, leaves=2, spines=2)
    inv = tmp_path / "fleet.json"
    topo.save(inv)
    solving, release = threading.Event(), threading.Event()
    judged: list[int] = []

    def solve(windows: pa.Table, topology: Topology | None, prev: dict) -> list[ClockModel]:
        solving.set()
        release.wait(60)
        return []

    def triangulate(windows: pa.Table, topology: Topology | None, prev: dict) -> list[Verdict]:
        judged.append(windows["start_ns"][0].as_py())
        return [Verdict("leaf0->spine1", "link", "faulty", judged[0], loss_rate=0.5)]

    settings = Settings(db_path=tmp_path / "fl.duckdb", inventory=str(inv), loop_interval_s=0.05)
    c = Collector(settings, Engines(solve_clocks=solve, triangulate=triangulate))
    c.start()
    start = (time.time_ns() // SEC - 30) * SEC  # long settled: judged as soon as all are in
    try:
        for w in range(4):
            for host in topo.hosts:
                send_clean_window(c, topo, host, start + w * SEC)
            if w == 0:  # the windows after it are all stored and judged during one solve
                _until(solving.is_set, "a clock solve started")
            _until(lambda w=w: w == 0 or start + w * SEC in judged, f"window {w} judged")
        assert not release.is_set()
        assert "leaf0->spine1" in c.served.verdicts()  # published, not held for the solve
        lag = {s.name: s.value for s in c.metrics.verdict_lag.collect()[0].samples}
        age = c.metrics.registry.get_sample_value("fleetlens_triangulated_window_age_seconds")
    finally:
        release.set()
        c.stop()
    assert judged == [start + w * SEC for w in range(1, 4)], judged  # each once, in order
    # The windows are ~26-29 s old: what the lag metrics say about them.
    assert lag["fleetlens_verdict_lag_seconds_count"] == 3
    assert 25 * 3 <= lag["fleetlens_verdict_lag_seconds_sum"] <= 3 * 40
    assert age is not None and 25 <= age <= 40


def _until(cond: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.02)
