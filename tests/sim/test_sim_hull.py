"""The vectorized hulls and percentiles equal the reference implementations."""

from __future__ import annotations

import numpy as np
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fleetlens.hull import lower_hull_rows
from fleetlens.records import lower_hull
from fleetlens.summary import nearest_rank

ROWS, COLS = 6, 12
ints = hnp.arrays(np.int64, (ROWS, COLS), elements=st.integers(-50, 50))
masks = hnp.arrays(np.bool_, (ROWS, COLS))


def _check_rows(t: np.ndarray, y: np.ndarray, mask: np.ndarray) -> None:
    size, ht, hy = lower_hull_rows(t, y, mask)
    for i in range(t.shape[0]):
        sel = np.flatnonzero(mask[i])
        ref = sel[lower_hull(t[i, sel], y[i, sel])] if sel.size else sel
        assert ht[i, : size[i]].tolist() == t[i, ref].tolist()
        assert hy[i, : size[i]].tolist() == y[i, ref].tolist()


@settings(max_examples=300, deadline=None)
@given(ints, ints, masks)
def test_hull_rows_equal_reference_small_grid(t, y, mask) -> None:
    # A small grid forces ties: equal t, collinear points, unsorted t.
    _check_rows(t, y, mask)


@settings(max_examples=100, deadline=None)
@given(
    hnp.arrays(np.int64, (ROWS, COLS), elements=st.integers(0, 10**9)),
    hnp.arrays(np.int64, (ROWS, COLS), elements=st.integers(-(10**8), 10**8)),
    masks,
)
def test_hull_rows_equal_reference_ns_scale(t, y, mask) -> None:
    _check_rows(np.sort(t, axis=1) + 1_767_225_600 * 10**9, y, mask)


def test_hull_rows_equal_reference_pooled_shape() -> None:
    """The collector's pooled clock fits: few rows of hundreds of points over 32 s, some
    rows with ties and out-of-order windows (a clock step)."""
    rng = np.random.default_rng(7)
    rows, cols = 40, 400
    t = np.sort(rng.integers(0, 32 * 10**9, (rows, cols)), axis=1) + 1_767_225_600 * 10**9
    t[::5] = rng.permutation(t[::5].ravel()).reshape(t[::5].shape)
    y = rng.integers(300, 5_000, (rows, cols))
    y[1::4] = 300 + (t[1::4] - t[1::4, :1]) // 10**9  # collinear runs
    _check_rows(t, y, rng.random((rows, cols)) < 0.8)


@settings(max_examples=200, deadline=None)
@given(
    hnp.arrays(np.float64, (ROWS, COLS), elements=st.floats(-1e6, 1e6)),
    masks,
)
def test_nearest_rank_equals_numpy(v, valid) -> None:
    lo, p50, p99, hi = nearest_rank(v, valid).T
    for i in range(ROWS):
        x = v[i, valid[i]]
        if not x.size:
            assert np.isnan([lo[i], p50[i], p99[i], hi[i]]).all()
            continue
        # nearest rank is numpy's 'inverted_cdf': every statistic is one of the samples
        ref = [x.min(), *np.percentile(x, [50, 99], method="inverted_cdf"), x.max()]
        assert [lo[i], p50[i], p99[i], hi[i]] == ref


def test_window_hulls_are_the_hulls_of_the_pure_samples(small_topo) -> None:
    """End to end: each window's hull is lower_hull of that flow's pure (tx0, rx0-tx0) points."""
    cfg = SimConfig(load=0.3, faults=("h03:clock_step_us=-700:start_s=0.5",))
    sim = Simulator(small_topo, cfg, seed=5)
    checked = 0
    for win in sim.stream(2, samples=True):
        s = win.samples.to_pydict()
        pts: dict[tuple, list[tuple[int, int]]] = {}
        for i in range(len(s["src_nic"])):
            if s["pure"][i]:
                key = (s["src_nic"][i], s["dst_nic"][i], s["sport"][i])
                pts.setdefault(key, []).append((s["tx0_ns"][i], s["rx0_ns"][i] - s["tx0_ns"][i]))
        for row in win.windows.to_pylist():
            p = np.array(pts.get((row["src_nic"], row["dst_nic"], row["sport"]), []), np.int64)
            assert row["pure"] == len(p)
            if len(p):
                idx = lower_hull(p[:, 0], p[:, 1])
                assert row["hull_t_ns"] == p[idx, 0].tolist()
                assert row["hull_owd_ns"] == p[idx, 1].tolist()
                checked += 1
            else:
                assert row["hull_t_ns"] == []
    assert checked > 500
