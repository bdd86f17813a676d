from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetlens.records import (
    ClockModel,
    Decision,
    DrainEntry,
    Window,
    lower_hull,
    table_to_windows,
    windows_to_table,
)


def _below(t: np.ndarray, y: np.ndarray, i: int, j: int) -> bool:
    """No point lies strictly below the line through points i and j."""
    if t[i] == t[j]:
        return True
    slope = (y[j] - y[i]) / (t[j] - t[i])
    return bool(np.all(y - (y[i] + slope * (t - t[i])) >= -1e-6))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 10**9), st.integers(-(10**6), 10**6)), min_size=1, max_size=60
    )
)
def test_lower_hull_supports_every_point(points: list[tuple[int, int]]) -> None:
    t = np.array([p[0] for p in points], dtype=np.int64)
    y = np.array([p[1] for p in points], dtype=np.int64)
    h = lower_hull(t, y)
    assert np.all(np.diff(t[h]) > 0)
    for a, b in itertools.pairwise(h):
        assert _below(t, y, int(a), int(b))
    # every point lies on or above the hull's piecewise-linear lower envelope
    env = np.interp(t, t[h], y[h])
    assert np.all(y >= env - 1e-6)


def test_clock_model_maps_raw_to_fleet() -> None:
    m = ClockModel("h00", t0_ns=1_000, offset_ns=500.0, drift_ppb=1000.0)
    raw = np.array([1_000, 1_001_000], dtype=np.int64)
    assert m.to_fleet(raw).tolist() == [500, 1_001_000 - 500 - 1]  # 1 ppm over 1 ms = 1 ns
    assert ClockModel.identity("h00").to_fleet(12345) == 12345


def test_window_table_round_trip_and_decision_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    w = Window("h00/eth0", "h01/eth0", 40000, 10, 1_000, 200, 198, 97, 300.0, 320.0, 500.0, 900.0,
               [1, 2], [300, 301], path=["h00/eth0->leaf0", "leaf0->h01/eth0"])  # fmt: skip
    empty = Window("h00/eth0", "h02/eth0", 40001, 10, 1_000, 200, 0, 0)
    assert table_to_windows(windows_to_table([w, empty])) == [w, empty]
    d = Decision("h00", 5, [DrainEntry("h00/eth1", "link leaf2->spine0 faulty", 4)])
    d.write_atomic(tmp_path / "decision.json")
    assert Decision.from_json((tmp_path / "decision.json").read_text()) == d
    assert [p.name for p in tmp_path.iterdir()] == ["decision.json"]
