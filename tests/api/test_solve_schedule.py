"""When the collector runs the clock solve: as soon as every live agent has uploaded a window
generation, never on a half-uploaded one, and a dead agent is waited for only up to the max
wait (real DuckDB file, real writer; the solve is a recorder)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.compute as pc
import pytest
from collector_helpers import send_clean_window
from fleetlens.api.arrivals import WindowArrivals
from fleetlens.api.config import Settings
from fleetlens.api.service import Collector, Engines

from fleetlens.topology import leaf_spine

T0 = 1_800_000_000_000_000_000
SEC = 1_000_000_000


class SolveLog:
    """A SolveClocks that remembers the window starts it was handed."""

    def __init__(self) -> None:
        self.calls: list[set[int]] = []
        self.called = threading.Event()

    def __call__(self, windows, topology, prev):  # type: ignore[no-untyped-def]
        self.calls.append(set(pc.unique(windows["start_ns"]).to_pylist()))
        self.called.set()
        return list(prev.values())


def _collector(tmp: Path, solve: SolveLog, loops: bool) -> Collector:
    topo = leaf_spine(hosts=3, nics=1, leaves=1, spines=1)
    inv = tmp / "fleet.json"
    topo.save(inv)
    settings = Settings(db_path=tmp / "fl.duckdb", inventory=str(inv), loop_interval_s=3600)
    c = Collector(settings, Engines(solve_clocks=solve))
    c.start(loops=loops)
    return c


@pytest.fixture
def manual(tmp_path: Path) -> Iterator[tuple[Collector, SolveLog]]:
    solve = SolveLog()
    c = _collector(tmp_path, solve, loops=False)
    try:
        yield c, solve
    finally:
        c.stop()


def _send(c: Collector, host: str, start: int) -> None:
    send_clean_window(c, c.topology, host, start, with_hull=True)  # type: ignore[arg-type]


def _woken(c: Collector) -> bool:
    """Both background loops (triangulation, clocks) are woken, or neither."""
    woken = set(c.loops.pending().values())
    assert len(woken) == 1, "one loop woken without the other"
    return woken.pop()


def _sleep(c: Collector) -> None:
    c.loops.clear()


def _starts(c: Collector, now: int) -> set[int]:
    return set(pc.unique(c.rounds.newest_windows(now)["start_ns"]).to_pylist())


def test_a_generation_is_solved_only_once_every_live_agent_sent_it(manual) -> None:  # type: ignore[no-untyped-def]
    c, _ = manual
    for h in ("h00", "h01", "h02"):
        c.arrivals.registered(h, T0 - SEC)  # agents start: each says so first
    for h in ("h00", "h01"):
        _send(c, h, T0)
        assert not _woken(c)
    assert _starts(c, T0 + SEC) == set()  # h02 registered and has not sent yet
    _send(c, "h02", T0)
    assert _woken(c)
    assert _starts(c, T0 + SEC) == {T0}
    _sleep(c)
    _send(c, "h00", T0 + SEC)
    _send(c, "h01", T0 + SEC)
    assert not _woken(c)
    assert _starts(c, T0 + 2 * SEC) == {T0}  # h02 sent the last one: wait for it
    _send(c, "h02", T0 + SEC)
    assert _woken(c)  # the loop is woken now, not at its next tick
    assert _starts(c, T0 + 2 * SEC) == {T0, T0 + SEC}


def test_with_nobody_to_expect_a_window_waits_for_the_time_out(manual) -> None:  # type: ignore[no-untyped-def]
    """A restarted collector: no registrations, no previous window. One upload says nothing
    about the others still on their way."""
    c, _ = manual
    _send(c, "h00", T0)
    assert not _woken(c)
    end = T0 + SEC
    assert _starts(c, end + c.settings.solve_max_wait_ns - 1) == set()
    assert _starts(c, end + c.settings.solve_max_wait_ns) == {T0}


def test_a_dead_agent_is_waited_for_up_to_the_max_wait_then_not_at_all(manual) -> None:  # type: ignore[no-untyped-def]
    c, _ = manual
    wait = c.settings.solve_max_wait_ns
    for h in ("h00", "h01", "h02"):
        c.arrivals.registered(h, T0 - SEC)
        _send(c, h, T0)
    for h in ("h00", "h01"):  # h02 died
        _send(c, h, T0 + SEC)
    end = T0 + 2 * SEC
    assert _starts(c, end + wait - 1) == {T0}
    assert _starts(c, end + wait) == {T0, T0 + SEC}
    _sleep(c)
    for h in ("h00", "h01"):
        _send(c, h, T0 + 2 * SEC)
    assert _woken(c)  # h02 is no longer expected
    assert T0 + 2 * SEC in _starts(c, T0 + 3 * SEC)


def test_an_agent_that_registered_is_waited_for_until_it_sends(manual) -> None:  # type: ignore[no-untyped-def]
    c, _ = manual
    c.arrivals.registered("h02", T0 - SEC)  # starting up: registered before the window began
    for h in ("h00", "h01"):
        _send(c, h, T0)
    assert not _woken(c)
    assert _starts(c, T0 + SEC) == set()
    _send(c, "h02", T0)
    assert _woken(c)
    assert _starts(c, T0 + SEC) == {T0}


def test_the_loop_solves_a_complete_generation_without_waiting_for_its_tick(
    tmp_path: Path,
) -> None:
    solve = SolveLog()
    c = _collector(tmp_path, solve, loops=True)  # the tick is an hour
    try:
        for h in ("h00", "h01", "h02"):
            c.arrivals.registered(h, time.time_ns())
        for h in ("h00", "h01", "h02"):
            _send(c, h, T0)
        assert solve.called.wait(30), "the solve did not run on the complete generation"
        assert solve.calls[0] == {T0}
    finally:
        c.stop()


def test_the_loop_solves_at_a_dead_agents_time_out_not_at_its_tick(tmp_path: Path) -> None:
    solve = SolveLog()
    c = _collector(tmp_path, solve, loops=True)  # the tick is an hour
    try:
        g0 = time.time_ns() // SEC * SEC - SEC
        for h in ("h00", "h01", "h02"):
            c.arrivals.registered(h, time.time_ns())
            _send(c, h, g0)
        assert solve.called.wait(30), "the solve did not run on the complete generation"
        # Ends within the next second (its time-out 1-2 s ahead, whatever the load: rows first
        # seen past their time-out wait for the tick); h02 died: ready 1 s after its end.
        g1 = g0 + SEC
        for h in ("h00", "h01"):
            _send(c, h, g1)
        deadline = time.monotonic() + 30
        while not any(g1 in starts for starts in solve.calls) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(g1 in starts for starts in solve.calls), "not solved at its time-out"
        assert time.time_ns() >= g1 + SEC + c.settings.solve_max_wait_ns
    finally:
        c.stop()


def _arrivals(hosts: list[str]) -> WindowArrivals:
    a = WindowArrivals(max_wait_ns=SEC, starting_ns=10 * SEC)
    for h in hosts:
        a.registered(h, T0 - SEC)
    assert a.stored([(h, [T0], SEC) for h in hosts], T0 + SEC)  # complete: reported
    return a


def test_a_generation_in_flight_at_its_time_out_is_reported_at_nine_in_ten_hosts() -> None:
    """Agents not in phase: uploads still coming in at the time-out, when the solve skipped
    the generation (under its row quorum); the loop must run again once 90 % are in."""
    hosts = [f"h{i:02d}" for i in range(10)]
    a, g = _arrivals(hosts), T0 + SEC
    timeout = g + SEC + SEC
    assert not a.stored([(h, [g], SEC) for h in hosts[:5]], timeout - 1)
    assert not a.stored([(h, [g], SEC) for h in hosts[5:8]], timeout + 1)
    assert a.stored([(hosts[8], [g], SEC)], timeout + 2)
    assert not a.stored([(hosts[9], [g], SEC)], timeout + 3)  # reported once


def test_a_generation_first_seen_past_its_time_out_waits_to_be_complete() -> None:
    """A replay of past windows (the demo): a generation's uploads come in a burst long after
    its time-out; solved at 90 % its last hosts' rows would never be folded in."""
    hosts = [f"h{i:02d}" for i in range(10)]
    a, g = _arrivals(hosts), T0 + SEC
    late = g + 60 * SEC
    assert not a.stored([(h, [g], SEC) for h in hosts[:9]], late)
    assert a.stored([(hosts[9], [g], SEC)], late + 1)
