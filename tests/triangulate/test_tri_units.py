"""Unit checks of the pieces: quantiles, the loss fit, the path model, bad input."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
from fleetlens.triangulate.horizon import DecayedCounts, WindowSums
from fleetlens.triangulate.incidence import Incidence, RouteTable
from fleetlens.triangulate.loss import fit_incidence, fit_loss, poisson_llr
from fleetlens.triangulate.paths import PathModel
from fleetlens.triangulate.quantile import Groups, bins_of
from fleetlens.triangulate.store import FlowStore
from tri_helpers import small

from fleetlens.records import Window, windows_to_table


def test_grouped_quantile_matches_numpy_median() -> None:
    rng = np.random.default_rng(0)
    g = rng.integers(0, 5, 4000)
    v = np.concatenate([rng.normal(0, 800, 2000), rng.exponential(30_000, 2000)])
    med, tot = Groups(g, 6).quantile(bins_of(v))
    for k in range(5):
        ref = np.median(v[g == k])
        assert abs(med[k] - ref) <= max(60.0, 0.03 * abs(ref)), (k, med[k], ref)
    assert tot[5] == 0 and np.isnan(med[5])


def test_poisson_llr_zero_below_expectation() -> None:
    assert poisson_llr(np.array([1.0]), np.array([5.0]))[0] == 0
    assert poisson_llr(np.array([20.0]), np.array([0.1]))[0] > 50


def test_loss_fit_explains_away_shared_links() -> None:
    # links 0,1 bad; link 2 shared by flows through both; link 3 clean
    rng = np.random.default_rng(1)
    paths = [(0, 2), (1, 2), (3, 2), (0, 4), (1, 5), (3, 4)] * 40
    sent = np.full(len(paths), 200.0)
    rate = {0: 0.05, 1: 0.02}
    lost = np.array([rng.binomial(200, 1 - np.prod([1 - rate.get(lk, 0) for lk in p]))
                     for p in paths], float)  # fmt: skip
    row = np.repeat(np.arange(len(paths)), 2)
    link = np.array(paths).ravel()
    fit = fit_loss(row, link, np.ones(row.size), sent, lost, 6)
    assert set(fit.links.tolist()) == {0, 1}
    est = dict(zip(fit.links.tolist(), fit.rate, strict=True))
    assert est[0] == pytest.approx(0.05, rel=0.2) and est[1] == pytest.approx(0.02, rel=0.3)


def test_flow_store_grows_and_keeps_values() -> None:
    s = FlowStore({"x": (np.float64, np.nan, 0)})
    at = s.locate(np.array([5, 1, 9]))
    s.cols["x"][at] = [50, 10, 90]
    at2 = s.locate(np.array([3, 9, 1]))
    assert np.isnan(s.cols["x"][at2[0]]) and list(s.cols["x"][at2[1:]]) == [90, 10]
    miss, five = s.find(np.array([7, 5]))
    assert miss == -1 and s.keys[five] == 5 and s.cols["x"][five] == 50
    assert s.aligned(np.array([5, 1, 9, 3])) and not s.aligned(np.array([1, 5, 9, 3]))
    s.drop(s.keys != 1)
    assert list(s.cols["x"][s.find(np.array([9, 5, 1]))[:2]]) == [90, 50]
    assert s.find(np.array([1]))[0] == -1


def _w(src: str, dst: str, sport: int, sent: int, recv: int, path=None) -> Window:
    return Window(src, dst, sport, 0, 10**9, sent, recv, 0, 1000.0, 1000.0, 1000.0, 1000.0,
                  path=path)  # fmt: skip


def test_bad_rows_are_dropped_and_counted() -> None:
    topo = small()
    pm = PathModel(topo)
    good = topo.ecmp_paths("h00/eth0", "h09/eth0")[0]
    t = windows_to_table(
        [
            _w("h00/eth0", "h09/eth0", 40000, 4, 4, good),
            _w("nope/eth0", "h09/eth0", 40001, 4, 4),  # unknown NIC
            _w("h00/eth0", "h09/eth0", 40002, 4, 9),  # received > sent
            _w("h00/eth0", "h09/eth0", 40003, 4, 4, ["h00/eth0->leaf0", "bogus->x"]),
        ]
    )
    b = pm.batch(t)
    assert b.n == 2
    assert b.dropped == {"unknown_nic_or_bad_key": 1, "bad_counts": 1, "bad_path": 1}
    assert b.known.tolist() == [True, False]  # the bogus path falls back to ECMP candidates


def test_path_remembered_for_stable_flows_and_candidates_weighted() -> None:
    topo = small()
    pm = PathModel(topo)
    path = topo.ecmp_paths("h00/eth0", "h09/eth0")[2]
    pm.batch(windows_to_table([_w("h00/eth0", "h09/eth0", 40000, 4, 4, path)]))
    b = pm.batch(windows_to_table([_w("h00/eth0", "h09/eth0", 40000, 4, 4),
                                   _w("h00/eth0", "h09/eth0", 40001, 4, 4)]))  # fmt: skip
    assert b.known.tolist() == [True, False]
    ids = np.array(pm.link_ids)
    assert sorted(ids[b.ent_link[b.ent_row == 0]]) == sorted(path)
    w_unknown = b.ent_w[b.ent_row == 1]
    assert w_unknown.sum() == pytest.approx(4.0)  # 2 access + 2 hops spread over 4 spines
    assert sorted(set(w_unknown.tolist())) == [0.25, 1.0]


def test_engine_handles_empty_and_unknown_input() -> None:
    from fleetlens.triangulate.engine import Triangulator

    topo = small()
    tri = Triangulator(topo)
    empty = windows_to_table([])
    assert tri(empty, None, {}) == []
    junk = windows_to_table([_w("zz/eth0", "yy/eth0", 1, 4, 0)])
    assert tri(junk, topo, {}) == []
    assert tri.last.dropped["unknown_nic_or_bad_key"] == 1
    with pytest.raises(ValueError, match="topology"):
        Triangulator()(empty, None, {})
    assert isinstance(empty, pa.Table)


def test_window_sums_are_the_last_windows_counts() -> None:
    """The onset horizon: per flow, the sums of its last 3 windows (0 where absent), through
    flows leaving and arriving, and a healed flow's counts (packets and losses) forgotten for
    good."""
    ws = WindowSums(3, n_links=1)
    rng = np.random.default_rng(5)
    hist: list[dict[int, tuple[float, float]]] = []
    for w in range(12):
        keys = np.array(sorted(rng.choice(20, 12, replace=False)) if w % 4 == 3 else range(10))
        sent = rng.integers(1, 50, keys.size).astype(float)
        lost = rng.integers(0, 3, keys.size).astype(float)
        ws.add(SimpleNamespace(key=keys.astype(np.int64), sent=sent, lost=lost))
        hist.append({int(k): (s, x) for k, s, x in zip(keys, sent, lost, strict=True)})
        if w == 6:  # flow 2 healed: its counts so far are gone
            ws.forget(ws.acc.locate(np.array([2], np.int64)))
            hist = [{k: (0.0, 0.0) if k == 2 else c for k, c in h.items()} for h in hist]
        at = ws.acc.locate(np.arange(20, dtype=np.int64))
        for k in range(20):
            last = [h.get(k, (0.0, 0.0)) for h in hist[-3:]]
            assert ws.sent[at[k]] == sum(s for s, _ in last)
            assert ws.lost[at[k]] == sum(x for _, x in last)


def test_a_healed_flows_counts_leave_the_long_horizon_whole() -> None:
    """Forgetting a healed link's flows forgets their packets with their losses: the flows
    left hold the horizon's background, and its per-link sums are those of what is kept (a
    flow's losses forgotten but its packets kept counted clean and biased the background
    low, so clean flows beside it read as lossy)."""
    rng = np.random.default_rng(3)
    n, tau = 40, 30.0
    inc = Incidence(np.arange(n) % 4, 4 + np.arange(n) % 4, np.zeros(n, np.int64),
                    RouteTable(8), 8)  # fmt: skip
    dc = DecayedCounts(tau)
    key = np.arange(n, dtype=np.int64)
    healed = np.arange(n) < 10  # these flows crossed the faulted link
    for w in range(40):
        sent = rng.integers(900, 1100, n).astype(float)
        rate = np.where(healed & (w < 30), 0.05, 1e-3)
        lost = rng.binomial(sent.astype(np.int64), rate).astype(float)
        f = SimpleNamespace(key=key, sent=sent, lost=lost, n=n, token=1,
                            start_ns=w * 10**9, end_ns=(w + 1) * 10**9)  # fmt: skip
        gamma = dc.add(f)[0]
        sums = dc.link_sums(f, inc, True, inc.link_sums(sent), gamma)
        np.testing.assert_allclose(sums, inc.link_sums(dc.sent))  # also after the forget
        if w == 30:  # the first clean window healed it
            dc.forget(np.flatnonzero(healed))
            assert not dc.sent[healed].any() and not dc.lost[healed].any()
            assert dc.sent[~healed].all()
    assert dc.lost[healed].sum() / dc.sent[healed].sum() < 2e-3  # only the clean windows
    # the background over every flow is the clean flows' rate (was 0.75x it)
    assert dc.lost.sum() / dc.sent.sum() == pytest.approx(1e-3, rel=0.15)


def _random_incidence(rng: np.random.Generator, n_rows: int = 3000) -> Incidence:
    """Rows over 10 up and 10 down access links (or none) and 20 routes over links 20-59:
    known paths (weight 1) and ECMP spreads (1/2, 1/3)."""
    routes = RouteTable(60)
    ids = [0]
    for j in range(20):
        links = rng.choice(np.arange(20, 60), rng.integers(1, 5), replace=False)
        share = 1.0 if j % 2 else 1.0 / rng.integers(2, 4)
        ids.append(routes.add(b"r%d" % j, links, np.full(links.size, share)))
    up = np.where(rng.random(n_rows) < 0.9, rng.integers(0, 10, n_rows), 60)
    dn = np.where(rng.random(n_rows) < 0.9, rng.integers(10, 20, n_rows), 60)
    return Incidence(up, dn, np.array(ids)[rng.integers(0, len(ids), n_rows)], routes, 60)


def test_subset_sums_equal_the_expanded_entries() -> None:
    rng = np.random.default_rng(5)
    inc = _random_incidence(rng)
    rows = np.flatnonzero(rng.random(inc.n) < 0.3)
    x, per_link = rng.random(rows.size), rng.random(60)
    r, lk, w = inc.entries(rows)
    assert np.allclose(inc.link_sums_of(rows, x), np.bincount(lk, w * x[r], 60))
    assert np.allclose(inc.row_sums(rows, per_link), np.bincount(r, w * per_link[lk], rows.size))


@pytest.mark.parametrize("seed", range(6))
def test_factorized_loss_fit_is_the_fit_over_every_entry(seed: int) -> None:
    """``fit_incidence`` (lossy rows' entries and per-link sums) picks the links and rates of
    ``fit_loss`` over every row's entries: background loss on every row, so the greedy picks
    many links at a low floor, and faults up to a black hole (rows whose summed rate the fit
    caps at 1)."""
    rng = np.random.default_rng(seed)
    inc = _random_incidence(rng)
    rate = np.zeros(61)
    bad = rng.choice(60, 3, replace=False)
    rate[bad] = [0.02, 0.3, 1.0] if seed % 2 else [0.01, 0.05, 0.2]
    r, lk, w = inc.entries()
    sent = rng.integers(1, 50, inc.n).astype(float)
    p = np.minimum(np.bincount(r, w * rate[lk], inc.n), 1.0) * 0.999 + 1e-3
    lost = rng.binomial(sent.astype(int), p).astype(float)
    for p0 in (1e-6, 1e-4):
        ref = fit_loss(r, lk, w, sent, lost, 60, p0)
        got = fit_incidence(inc, sent, lost, inc.link_sums(sent), p0)
        assert got.links.tolist() == ref.links.tolist()
        assert np.allclose(got.rate, ref.rate, rtol=1e-6) and np.allclose(got.llr, ref.llr)
