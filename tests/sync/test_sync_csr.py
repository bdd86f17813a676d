"""The sync's grouped (CSR) kernels against their references: the per-group hulls equal
:func:`fleetlens.hull.lower_hull_rows` of each group, a union's hull the hull of every
part's points, the edge fits over each direction's hull the fits over all its points, the
slope walk the bisection's optimum, the network solve's refilled Laplacian scipy's summed
one and its written-out CG scipy's iterates, the one-pass flattening of a window's rows
their points row by row, the pair hulls read from the rows' buffers those of the flattened
points, the bucketed median numpy's, and the one-pass time and delay mapping of points their
numpy forms."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import scipy.sparse as sp
from fleetlens.sync._csr import (
    edge_delays,
    fleet_times,
    generation_runs,
    group_points,
    hull_groups,
    pair_hulls,
    run_gaps,
    shifted_median,
    union_edge_points,
    union_hulls,
)
from fleetlens.sync.edgefit import fit_edges
from fleetlens.sync.network import ActiveSets, _pcg
from fleetlens.sync.pooling import _pair_hulls
from fleetlens.sync.purity import KnownNics, complete_generations, hull_points
from scipy.sparse.linalg import cg

from fleetlens.hull import lower_hull_rows
from fleetlens.summary import pad_rows


def _group_offsets(group: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR of ``0 <= group < n`` by numpy: group ``g``'s points are ``order[off[g]:off[g +
    1]]`` in their original order."""
    off = np.r_[0, np.cumsum(np.bincount(group, minlength=n))].astype(np.int64)
    return off, np.argsort(group, kind="stable").astype(np.int64)


def _reference(group: np.ndarray, n: int, t: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    """Each group's lower hull as (size, 2) points, by the padded row form."""
    mask, (tm, ym) = pad_rows(group, n, t, y)
    size, ht, hy = lower_hull_rows(tm, ym, mask)
    return [np.c_[ht[i, : size[i]], hy[i, : size[i]]] for i in range(n)]


def _points(rng: np.random.Generator, m: int, ties: bool) -> tuple[np.ndarray, np.ndarray]:
    t = rng.integers(0, 10**9, m)
    y = rng.integers(1_000, 3_000, m)
    if ties:  # equal times and collinear points: the tie rules matter
        t, y = (t // 10**8) * 10**8, (y // 500) * 500
    return t.astype(np.int64), y.astype(np.int64)


@pytest.mark.parametrize("ties", [False, True])
def test_group_hulls_equal_the_padded_rows(ties: bool) -> None:
    rng = np.random.default_rng(1)
    for _ in range(40):
        n, m = int(rng.integers(1, 30)), int(rng.integers(0, 800))
        group = rng.integers(0, n, m).astype(np.int64)
        t, y = _points(rng, m, ties)
        size, ht, hy = hull_groups(*_group_offsets(group, n), t, y)
        want = _reference(group, n, t, y)
        assert size.tolist() == [len(w) for w in want]
        assert np.array_equal(np.c_[ht, hy], np.concatenate([np.zeros((0, 2)), *want]))
        # grouped by pair in ascending order: the one-pass form gives the same hulls
        order = np.argsort(group, kind="stable")
        src, dst = group[order] // 4, group[order] % 4
        got = pair_hulls(src, dst, t[order], y[order], 4)
        assert got is not None
        assert np.array_equal(np.c_[got[2], got[3]], np.c_[ht, hy])
        assert np.array_equal(got[0] * 4 + got[1], np.repeat(np.arange(n), size))
        if m > 1 and group.min() != group.max():  # not grouped: told, not miscomputed
            assert pair_hulls(src[::-1].copy(), dst[::-1].copy(), t, y, 4) is None


@pytest.mark.parametrize("ties", [False, True])
def test_a_pairs_path_runs_hulled_as_all_its_points(ties: bool) -> None:
    """A pair's points as sorted runs (its paths' hulls, or any sorted runs), each later run
    inserted point by point into the hull of those before it: the padded reference's hull
    of all of them, with equal times, collinear points and runs past either end."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        runs = []
        for _ in range(int(rng.integers(1, 12))):
            t, y = _points(rng, int(rng.integers(1, 12)), ties)
            if rng.random() < 0.3:  # a run reaching past the others' times
                t = t + int(rng.integers(-(10**9), 10**9))
            order = np.lexsort((y, t))
            runs.append((t[order], y[order]))
        t, y = (np.concatenate([r[i] for r in runs]) for i in (0, 1))
        zero = np.zeros(t.size, np.int64)
        got = pair_hulls(zero, zero, t, y, 1)
        assert got is not None
        want = _reference(zero, 1, t, y)[0]
        assert np.array_equal(np.c_[got[2], got[3]], want)


def test_union_of_hulls_is_the_hull_of_every_point() -> None:
    rng = np.random.default_rng(2)
    for _ in range(30):
        n_pairs, parts, every = int(rng.integers(1, 20)), [], []
        for _ in range(int(rng.integers(1, 6))):
            m = int(rng.integers(0, 300))
            pair = np.sort(rng.integers(0, n_pairs, m)).astype(np.int64)
            t, y = _points(rng, m, ties=bool(rng.integers(0, 2)))
            size, ht, hy = hull_groups(*_group_offsets(pair, n_pairs), t, y)
            hp = np.repeat(np.arange(n_pairs), size)
            parts.append((hp >> 1, hp & 1, ht, hy))  # pair p = (src p >> 1, dst p & 1)
            every.append((pair, t, y))
        pair, t, y = (np.concatenate([e[i] for e in every]) for i in range(3))
        want = _reference(pair, n_pairs, t, y)
        cur = np.arange(n_pairs)  # every NIC kept
        got = union_hulls(parts, cur)
        assert got is not None
        got_pair = got[0] * 2 + got[1]
        for p in range(n_pairs):
            assert np.array_equal(np.c_[got[2], got[3]][got_pair == p], want[p])
        gone = union_hulls(parts, np.where(cur == 0, -1, cur))  # NIC 0 left the window
        assert gone is not None and not (gone[0] == 0).any() and not (gone[1] == 0).any()


def test_union_written_as_edge_points_is_the_union_mapped() -> None:
    """The union's merge writing each hull point's edge, sense, fleet time and signed delay
    gives what mapping :func:`union_hulls`' points does (bit for bit, same order), pairs of
    no edge of the window and NICs not in it left out."""
    rng = np.random.default_rng(12)
    for _ in range(30):
        n_stable, parts = int(rng.integers(2, 12)), []
        for _ in range(int(rng.integers(1, 6))):
            m = int(rng.integers(0, 300))
            pair = np.sort(rng.integers(0, n_stable * n_stable, m)).astype(np.int64)
            t, y = _points(rng, m, ties=bool(rng.integers(0, 2)))
            size, ht, hy = hull_groups(*_group_offsets(pair, n_stable * n_stable), t, y)
            hp = np.repeat(np.arange(n_stable * n_stable), size)
            parts.append((hp // n_stable, hp % n_stable, ht, hy))
        cur = rng.permutation(n_stable).astype(np.int64)  # stable number -> this window's
        cur[rng.random(n_stable) < 0.2] = -1  # NICs gone from the window
        n_nic, hosts = n_stable, 4
        every = np.unique(np.minimum.outer(np.arange(n_nic), np.arange(n_nic)) * n_nic
                          + np.maximum.outer(np.arange(n_nic), np.arange(n_nic)))  # fmt: skip
        key_codes = np.sort(rng.choice(every, int(rng.integers(0, every.size + 1)), False))
        nic_h = rng.integers(0, hosts, n_nic).astype(np.int64)
        theta, drift = rng.normal(0, 5e7, hosts), rng.normal(0, 2e4, hosts)
        lat = np.ascontiguousarray(rng.normal(0, 300, (n_nic, 2)))
        t_ref = int(rng.integers(0, 10**9))
        got = union_edge_points(parts, cur, key_codes.astype(np.int64), n_nic, nic_h, theta,
                                drift, t_ref, lat)  # fmt: skip
        src, dst, ht, hy = union_hulls(parts, cur)  # type: ignore[misc]
        key = np.minimum(src, dst) * n_nic + np.maximum(src, dst)
        edge = np.searchsorted(key_codes, key)
        known = edge < key_codes.size
        known[known] = key_codes[edge[known]] == key[known]
        src, dst, ht, hy, edge = src[known], dst[known], ht[known], hy[known], edge[known]
        up, y = edge_delays(hy, src, dst, lat)
        want = (edge, up, fleet_times(ht, src, nic_h, theta, drift, t_ref), y)
        assert got is not None
        for g, w in zip(got, want, strict=True):
            assert np.array_equal(g, w)
    # a part not grouped in ascending pairs: told, not miscomputed
    desc = [(np.array([1, 0], np.int64), np.zeros(2, np.int64), np.arange(2), np.arange(2))]
    two = np.zeros(2)
    assert union_edge_points(desc, np.arange(2), np.array([1]), 2, np.arange(2), two, two, 0,
                             np.zeros((2, 2))) is None  # fmt: skip


def test_grouped_points_and_gaps_equal_their_numpy_forms() -> None:
    """The fits' rows grouped and gathered in one pass equal a stable sort and two gathers;
    the spans' per-edge gaps to their lines equal the per-point residuals' minima (bit for
    bit)."""
    rng = np.random.default_rng(13)
    for _ in range(30):
        n, m, spans = int(rng.integers(1, 50)), int(rng.integers(0, 2000)), 3
        edge = rng.integers(0, n, m).astype(np.int64)
        upper = rng.random(m) < 0.5
        t, y = rng.normal(0, 5e8, m), rng.normal(0, 1e4, m)
        off, tc, yc = group_points(edge, upper.view(np.uint8), t, y, n)
        want_off, order = _group_offsets(edge * 2 + ~upper, 2 * n)
        assert np.array_equal(off, want_off)
        assert np.array_equal(tc, t[order]) and np.array_equal(yc, y[order])
        line0, carry = rng.normal(0, 1e4, (spans, n)), rng.normal(0, 1e-4, n)
        lo, hi = np.full((spans, n), np.inf), np.full((spans, n), np.inf)
        run_gaps(edge, upper.view(np.uint8), t, y, line0, carry, lo, hi)
        for k in range(spans):
            r = y - (line0[k, edge] + carry[edge] * t)
            want_lo, want_hi = np.full(n, np.inf), np.full(n, np.inf)
            np.minimum.at(want_lo, edge[upper], r[upper])
            np.minimum.at(want_hi, edge[~upper], -r[~upper])
            assert np.array_equal(lo[k], want_lo) and np.array_equal(hi[k], want_hi)


def test_fits_over_each_directions_hull_equal_the_fits_over_every_point() -> None:
    rng = np.random.default_rng(3)
    n, m = 40, 6000
    edge = rng.integers(0, n, m).astype(np.int64)
    upper = rng.random(m) < 0.5
    t = rng.integers(-500_000_000, 500_000_000, m).astype(np.float64)
    a, b = rng.normal(0, 1e4, n), rng.normal(0, 5e-5, n)
    delay = np.rint(1500 + rng.exponential(300, m))
    y = np.rint(a[edge] + b[edge] * t) + np.where(upper, delay, -delay)
    b_prior = b + rng.normal(0, 1e-7, n)
    full = fit_edges(edge, upper, t, y, n, b_prior)
    # each direction reduced to its hull (the lower set's upper hull: the lower hull of −y)
    row = edge * 2 + ~upper
    size, ht, hy = hull_groups(
        *_group_offsets(row, 2 * n), t.astype(np.int64), np.where(upper, y, -y).astype(np.int64)
    )
    r = np.repeat(np.arange(2 * n), size)
    up = r % 2 == 0
    hull = fit_edges(r // 2, up, ht.astype(float), np.where(up, hy, -hy).astype(float), n, b_prior)
    assert (full.usable == hull.usable).all() and (full.slope_ok == hull.slope_ok).all()
    assert np.allclose(hull.a, full.a, rtol=0, atol=1e-6)
    assert np.allclose(hull.b, full.b, rtol=0, atol=1e-15)
    assert np.allclose(hull.margin, full.margin, rtol=0, atol=1e-6)
    assert np.array_equal(hull.span, full.span)
    assert (hull.n_up <= full.n_up).all() and (hull.n_up < full.n_up).any()


def _bisected_slope(t: np.ndarray, y: np.ndarray, upper: np.ndarray, lo: float, hi: float) -> float:
    """The max-margin slope by bisection on the margin's supergradient (the walk's
    predecessor): 64 halvings of the bracket."""
    for _ in range(64):
        b = 0.5 * (lo + hi)
        v = y - b * t
        t_up = t[upper][np.argmin(v[upper])]
        t_low = t[~upper][np.argmax(v[~upper])]
        lo, hi = (b, hi) if t_low > t_up else (lo, b)
    return 0.5 * (lo + hi)


@pytest.mark.parametrize("ties", [False, True])
def test_slope_walk_finds_the_bisections_optimum(ties: bool) -> None:
    rng = np.random.default_rng(4)
    n, m = 60, 8000
    edge = rng.integers(0, n, m).astype(np.int64)
    upper = rng.random(m) < 0.5
    t = rng.integers(-500_000_000, 500_000_000, m).astype(np.float64)
    if ties:  # equal times and collinear points
        t = np.floor(t / 1e8) * 1e8
    a, b = rng.normal(0, 1e4, n), rng.normal(0, 5e-5, n)
    delay = np.rint(1500 + rng.exponential(300, m))
    y = np.rint(a[edge] + b[edge] * t) + np.where(upper, delay, -delay)
    # some edges' optimum outside a narrow bracket: clamped there, the prior kept
    b_prior = b + rng.normal(0, 1e-7, n) * np.where(np.arange(n) % 5 == 0, 100.0, 1.0)
    bracket = np.full(n, 2e-6)
    fits = fit_edges(edge, upper, t, y, n, b_prior, bracket)
    for e in range(n):
        on = edge == e
        want = _bisected_slope(t[on], y[on], upper[on], b_prior[e] - 2e-6, b_prior[e] + 2e-6)
        if abs(want - b_prior[e]) > 0.999 * 2e-6:  # at the bracket's edge: prior kept (or
            # the soft fit's where the line at the prior overlaps the points)
            assert not fits.slope_ok[e] and (fits.soft[e] or fits.b[e] == b_prior[e])
            continue
        assert fits.slope_ok[e]
        assert abs(fits.b[e] - want) <= 1e-16
        v = y[on] - fits.b[e] * t[on]
        margin = 0.5 * (v[upper[on]].min() - v[~upper[on]].max())
        assert fits.margin[e] == margin
    assert (~fits.slope_ok).sum() >= n // 10


def test_laplacian_pattern_refilled_equals_the_summed_coo() -> None:
    rng = np.random.default_rng(5)
    n, e = 50, 900  # several NIC-pair edges per host pair: duplicate entries to sum
    lo = rng.integers(0, n - 1, e)
    hi = np.minimum(lo + rng.integers(1, 6, e), n - 1)
    sets = ActiveSets(n, lo, hi, min_edges=3)
    for _ in range(3):
        w = np.where(rng.random(e) < 0.2, 0.0, rng.random(e))
        active, solved = sets(w)
        pat = sets.pattern(w)
        idx = np.cumsum(solved) - 1
        i, j, wz = idx[lo[active]], idx[hi[active]], w[active]
        m = int(solved.sum())
        want = sp.coo_matrix(
            (np.r_[wz, wz, -wz, -wz], (np.r_[i, j, i, j], np.r_[i, j, j, i])), (m, m)
        ).toarray()
        assert np.allclose(pat.matrix(w).toarray(), want, rtol=1e-15, atol=0)
        assert sets.pattern(w) is pat  # built once per set of weighted edges
        assert pat.matrix(w * 2).toarray() == pytest.approx(2 * want, rel=1e-15, abs=0)


def test_written_out_cg_takes_scipys_iterates() -> None:
    """``network._pcg`` is scipy's Jacobi-preconditioned ``cg`` step for step: the same
    solution to the last bit, whichever of the two tolerances stops it."""
    rng = np.random.default_rng(9)
    n, e = 60, 700
    lo = rng.integers(0, n - 1, e)
    hi = np.minimum(lo + rng.integers(1, 8, e), n - 1)
    w = rng.random(e) + 0.05
    pat = ActiveSets(n, lo, hi, min_edges=1).pattern(w)
    lap = pat.matrix(w)
    inv = 1.0 / lap.diagonal()
    for rtol, atol in ((1e-10, 0.0), (1e-10, 1e-4), (1e-3, 0.0)):
        b = rng.normal(0, 1, pat.m)
        b -= b.mean()
        want, _ = cg(lap, b, rtol=rtol, atol=atol, maxiter=1000, M=sp.diags(inv))
        assert np.array_equal(_pcg(lap, b, inv, rtol, atol, 1000), want)


def _rows_table(rng: np.random.Generator, n: int) -> pa.Table:
    """Window rows of every kind hull_points drops, with null points and lists."""
    nics = [f"h{h}/eth{i}" for h in range(6) for i in range(2)] + ["bogus", None]
    cols: dict[str, list] = {k: [] for k in ("src_nic", "dst_nic", "pure", "hull_t_ns",
                                             "hull_owd_ns")}  # fmt: skip
    for _ in range(n):
        m = int(rng.integers(0, 5))
        t = [int(v) if rng.random() > 0.05 else None for v in rng.integers(0, 10**9, m)]
        y = [int(v) if rng.random() > 0.05 else None for v in rng.integers(1000, 9000, m)]
        if rng.random() < 0.1:  # a length mismatch
            y = [*y, 7]
        cols["src_nic"].append(nics[int(rng.integers(0, len(nics)))])
        cols["dst_nic"].append(nics[int(rng.integers(0, len(nics) - 2))])
        cols["pure"].append(int(rng.integers(0, 4)) if rng.random() > 0.05 else None)
        cols["hull_t_ns"].append(t if rng.random() > 0.05 else None)
        cols["hull_owd_ns"].append(y if rng.random() > 0.05 else None)
    return pa.table({k: pa.array(v, pa.list_(pa.int64()) if k.startswith("hull") else None)
                     for k, v in cols.items()})  # fmt: skip


def _flattened_by_rows(table: pa.Table) -> tuple[list[tuple], int]:
    """The kept rows' points as (src, dst, t, y) and the null points, row by row."""
    out, nulls = [], 0
    for r in table.to_pylist():
        t, y, s, d = r["hull_t_ns"], r["hull_owd_ns"], r["src_nic"], r["dst_nic"]
        if not r["pure"] or t is None or y is None or len(t) != len(y) or not t:
            continue
        if s in (None, "bogus") or d in (None, "bogus") or s.split("/")[0] == d.split("/")[0]:
            continue
        for a, b in zip(t, y, strict=True):
            if a is None or b is None:
                nulls += 1
            else:
                out.append((s, d, a, b))
    return out, nulls


def test_one_pass_flattening_equals_the_rows_points() -> None:
    rng = np.random.default_rng(6)
    for _ in range(10):
        table = _chunked(rng, _rows_table(rng, int(rng.integers(1, 300))))
        pts = hull_points(table)
        want, nulls = _flattened_by_rows(table)
        cols = zip(pts.src, pts.dst, pts.t_raw, pts.owd_raw, strict=True)
        got = [(pts.nics[s], pts.nics[d], int(t), int(y)) for s, d, t, y in cols]
        assert got == want
        assert pts.dropped.get("null_hull_point", 0) == nulls


def _chunked(rng: np.random.Generator, table: pa.Table) -> pa.Table:
    """``table`` in chunks, the hull columns chunked apart from the others, then a slice."""
    cut = [0, *sorted(int(c) for c in rng.integers(0, table.num_rows, 3)), table.num_rows]
    table = pa.concat_tables([table.slice(a, b - a) for a, b in itertools.pairwise(cut)])
    t_col = pa.chunked_array([table["hull_t_ns"].combine_chunks()])
    table = table.set_column(table.schema.get_field_index("hull_t_ns"), "hull_t_ns", t_col)
    start = int(rng.integers(0, table.num_rows))
    return table.slice(start, table.num_rows - start)


def _t_ordered(table: pa.Table) -> pa.Table:
    """Each row's points (those without nulls) in t order."""
    rows = table.to_pylist()
    for r in rows:
        t, y = r["hull_t_ns"], r["hull_owd_ns"]
        if t and y and None not in t + y:
            order = np.argsort(t, kind="stable")
            r["hull_t_ns"] = [t[i] for i in order]
            r["hull_owd_ns"] = [y[i] for i in order] + y[len(t) :]
    return pa.Table.from_pylist(rows, table.schema)


def test_pair_hulls_from_the_rows_equal_those_of_the_flattened_points() -> None:
    """``hull_points(reduce=True)`` reads each directed pair's hull from the list buffers in
    one pass, rows in any order (the collector's look-back holds batches in commit order);
    the same hulls, drops and null counts as every point flattened, then reduced. Rows of a
    pair repeat (paths) and a row's points are in t order as agents send them, or not."""
    rng = np.random.default_rng(12)
    for trial in range(30):
        table = _rows_table(rng, int(rng.integers(1, 400)))
        if trial % 2:  # each row's points in t order, as a hull is sent
            table = _t_ordered(table)
        table = _chunked(rng, table)
        red, every = hull_points(table, reduce=True), hull_points(table)
        want = _pair_hulls(every)
        assert red.reduced and not every.reduced
        assert red.nics == every.nics and red.nic_host == every.nic_host
        assert red.dropped == every.dropped
        assert np.array_equal(np.c_[red.src, red.dst, red.t_raw, red.owd_raw],
                              np.c_[want.src, want.dst, want.t_raw, want.owd_raw])  # fmt: skip


def test_shifted_median_is_numpys() -> None:
    rng = np.random.default_rng(7)
    for trial in range(300):
        n, hosts = int(rng.integers(1, 2000)), int(rng.integers(1, 20))
        base = int(rng.choice([0, 1_700_000_000_000_000_000, -5]))
        if trial % 3 == 0:  # a window's raw times
            t = base + rng.integers(0, 10**9, n)
        elif trial % 3 == 1:  # few distinct values: ties across the middle
            t = base + rng.integers(0, 5, n)
        else:  # half the values far out: the median outside a sample's range
            far = rng.integers(0, 2**60, n)
            t = base + np.where(rng.random(n) < 0.5, rng.integers(0, 10, n), far)
        host = rng.integers(0, hosts, n).astype(np.int64)
        shift = rng.integers(-(10**8), 10**8, hosts).astype(np.int64)
        t = t.astype(np.int64)
        assert shifted_median(t, host, shift) == np.median(t - shift[host])


def test_point_mapping_kernels_are_bit_identical_to_numpy() -> None:
    rng = np.random.default_rng(11)
    for _ in range(50):
        n, nics, hosts = int(rng.integers(0, 3000)), int(rng.integers(2, 40)), 8
        t_ref = int(rng.integers(0, 2**61))
        t_raw = (t_ref + rng.integers(-(10**9), 10**9, n)).astype(np.int64)
        owd = rng.integers(-(10**8), 10**8, n).astype(np.int64)
        src, dst = (rng.integers(0, nics, n).astype(np.int64) for _ in range(2))
        nic_h = rng.integers(0, hosts, nics).astype(np.int64)
        theta = rng.normal(0, 5e7, hosts)  # ±50 ms first offsets, sub-ns fractions
        drift = rng.normal(0, 2e4, hosts)  # ppb
        lat = rng.normal(0, 300, (nics, 2)) * (rng.random() < 0.7)  # mostly calibrated
        h = nic_h[src]
        want_t = ((t_raw - t_ref).astype(np.float64) - theta[h]) / (1.0 + drift[h] * 1e-9)
        assert np.array_equal(fleet_times(t_raw, src, nic_h, theta, drift, t_ref), want_t)
        upper = src < dst
        owd_l = owd - lat[src, 0] - lat[dst, 1]
        got_up, got_y = edge_delays(owd, src, dst, np.ascontiguousarray(lat))
        assert np.array_equal(got_up, upper)
        assert np.array_equal(got_y, np.where(upper, owd_l, -owd_l))


def test_generation_runs_count_and_locate_numpys_generations() -> None:
    """Each generation's rows counted and their first and last row found in two passes:
    numpy's floor division, negative starts included; a look-back in generation order is
    handed on as zero-copy slices of the same rows; wild starts are told (None)."""
    rng = np.random.default_rng(11)
    one = 10**9
    for trial in range(60):
        n = int(rng.integers(1, 500))
        gen = rng.integers(-3, 4, n)
        if trial % 2:  # in generation order, each host's batch sharing its start
            gen = np.sort(gen)
        start = (gen * one + rng.choice(rng.integers(-(one // 2), one // 2, 8), n)).astype(np.int64)
        got = generation_runs(start, one)
        assert got is not None
        g = np.floor_divide(start + one // 2, one)
        ids, counts = np.unique(g, return_counts=True)
        assert np.array_equal(got[0], ids) and np.array_equal(got[1], counts)
        assert [np.flatnonzero(g == i)[[0, -1]].tolist() for i in ids] == np.c_[
            got[2], got[3]
        ].tolist()
        table = pa.table({"start_ns": start, "duration_ns": np.full(n, one)})
        for rows, i in complete_generations(table, after=-10, quorum=0.0):
            assert rows["start_ns"].to_pylist() == start[g == i].tolist()
    assert generation_runs(np.array([0, 10**18], np.int64), one) is None


def test_nic_ids_carried_across_windows_read_as_each_window_alone() -> None:
    """A solver's :class:`KnownNics` keeps the ids of earlier windows and looks each window's
    up in them: NICs coming and going (and bad ids) give the same NIC lists, drops and pair
    hulls as each window read alone."""
    rng = np.random.default_rng(21)
    known, seen = KnownNics(), []
    for _ in range(20):
        table = _rows_table(rng, int(rng.integers(1, 300)))
        gone = [f"h{h}/" for h in range(6) if rng.random() < 0.4]
        for col in ("src_nic", "dst_nic"):  # those hosts' NICs are not in this window
            host = pc.utf8_slice_codeunits(pc.fill_null(table[col], ""), 0, 3)
            table = table.filter(pc.invert(pc.is_in(host, pa.array(gone, pa.string()))))
        seen.append(len(known.ids))
        table = _chunked(rng, table) if table.num_rows else table
        alone, carried = hull_points(table, reduce=True), hull_points(table, True, known=known)
        assert (carried.nics, carried.nic_host, carried.dropped) == (
            alone.nics, alone.nic_host, alone.dropped)  # fmt: skip
        assert np.array_equal(np.c_[carried.src, carried.dst, carried.t_raw, carried.owd_raw],
                              np.c_[alone.src, alone.dst, alone.t_raw, alone.owd_raw])  # fmt: skip
    assert "bogus" not in known.ids and len(known.ids) == 12
    assert 0 < seen[1] < 12  # NICs came in later windows


def test_a_window_naming_the_last_ones_nics_shares_their_lists() -> None:
    """:meth:`KnownNics.named` hands back the last window's lists (what the solver derives
    per NIC is kept for them) only where the same NICs are named, else new ones."""
    known = KnownNics()
    src = pa.chunked_array([pa.array(["a/0", "a/1", "b/0"])])
    assert known.index(src, src)[0] == ["a/0", "a/1", "b/0"]
    first = known.named(np.array([True, True, True]))
    again = known.named(np.array([True, True, True]))
    assert all(a is b for a, b in zip(first, again, strict=True))
    fewer = known.named(np.array([True, False, True]))
    assert fewer[0] == ["a/0", "b/0"] and fewer[0] is not first[0]
    assert fewer[2].tolist() == [0, 1, -1] and fewer[3].tolist() == [0, -1, 1, -1]
    known.index(pa.chunked_array([pa.array(["c/0"])]), src)  # a new NIC: the ids renumbered
    assert known.named(np.array([True, True, True, False]))[0] is not first[0]
