"""The vectorized hulls and percentiles equal the reference implementations."""

from __future__ import annotations

import numpy as np
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fleetlens.hull import keep_group_hull_points, lower_hull_rows
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


def _check_group_hulls(t: np.ndarray, y: np.ndarray, mask: np.ndarray, group: np.ndarray) -> None:
    """Rows cut to their group's hull: each keeps, in order, exactly its hull points that
    are vertices of the group's lower hull, so the hull of a group's kept points is the
    group's hull."""
    size, ht, hy = lower_hull_rows(t, y, mask)
    before = [list(zip(ht[i, : size[i]].tolist(), hy[i, : size[i]].tolist(), strict=True))
              for i in range(t.shape[0])]  # fmt: skip
    keep_group_hull_points(group, size, ht, hy)
    for g in np.unique(group):
        rows = np.flatnonzero(group == g)
        pt, py = t[rows][mask[rows]], y[rows][mask[rows]]
        ref = lower_hull(pt, py)
        vertices = set(zip(pt[ref].tolist(), py[ref].tolist(), strict=True))
        kept = []
        for i in rows:
            got = list(zip(ht[i, : size[i]].tolist(), hy[i, : size[i]].tolist(), strict=True))
            assert got == [p for p in before[i] if p in vertices]
            kept += got
        assert set(kept) == vertices


@settings(max_examples=300, deadline=None)
@given(ints, ints, masks, hnp.arrays(np.int64, ROWS, elements=st.integers(0, 2)))
def test_rows_cut_to_their_group_hull_small_grid(t, y, mask, group) -> None:
    # A small grid: shared points, equal t across rows, collinear vertices, one-row groups.
    _check_group_hulls(t, y, mask, group)


def test_rows_cut_to_their_group_hull_ns_scale() -> None:
    """The agents' shape: a NIC pair's flows over a window, a few points each, ns times."""
    rng = np.random.default_rng(3)
    rows, cols = 200, 30
    t = np.sort(rng.integers(0, 10**9, (rows, cols)), axis=1) + 1_767_225_600 * 10**9
    y = rng.integers(2_000, 9_000, (rows, cols))
    _check_group_hulls(t, y, rng.random((rows, cols)) < 0.7, rng.integers(0, 25, rows))


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


def test_window_hulls_are_the_flows_points_on_their_pair_hull(small_topo) -> None:
    """End to end: each window's hull is the points of lower_hull of that flow's pure
    (tx0, rx0-tx0) points that are vertices of the lower hull of its NIC pair's pure points."""
    cfg = SimConfig(load=0.3, faults=("h03:clock_step_us=-700:start_s=0.5",))
    sim = Simulator(small_topo, cfg, seed=5)
    checked = cut = 0
    for win in sim.stream(2, samples=True):
        s = win.samples.to_pydict()
        pts: dict[tuple, list[tuple[int, int]]] = {}
        for i in range(len(s["src_nic"])):
            if s["pure"][i]:
                key = (s["src_nic"][i], s["dst_nic"][i], s["sport"][i])
                pts.setdefault(key, []).append((s["tx0_ns"][i], s["rx0_ns"][i] - s["tx0_ns"][i]))
        on_pair: dict[tuple, set[tuple[int, int]]] = {}
        for pair in {k[:2] for k in pts}:
            p = np.array([q for k, v in pts.items() if k[:2] == pair for q in v], np.int64)
            on_pair[pair] = set(map(tuple, p[lower_hull(p[:, 0], p[:, 1])].tolist()))
        for row in win.windows.to_pylist():
            p = np.array(pts.get((row["src_nic"], row["dst_nic"], row["sport"]), []), np.int64)
            assert row["pure"] == len(p)
            want = []
            if len(p):
                flow = p[lower_hull(p[:, 0], p[:, 1])].tolist()
                want = [q for q in flow if tuple(q) in on_pair[(row["src_nic"], row["dst_nic"])]]
                checked += 1
                cut += len(want) < len(flow)
            assert row["hull_t_ns"] == [q[0] for q in want]
            assert row["hull_owd_ns"] == [q[1] for q in want]
    assert checked > 500
    assert cut > 100  # flows of a pair with several paths lose points to the pair's hull
