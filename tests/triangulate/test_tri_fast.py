"""The Cython fast path (``triangulate/_fast.pyx`` and its callers) against plain references.

Every kernel must compute exactly what the straightforward numpy / Python code computes:
the window decode on random tables (rows shuffled, unknown NIC ids, duplicate flows, nulls,
malformed rows, bad paths, empty windows), and the per-row kernels on random arrays.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator
from fleetlens.triangulate import _fast
from fleetlens.triangulate.delay import _reference_update_baselines
from fleetlens.triangulate.engine import Triangulator
from fleetlens.triangulate.incidence import Incidence, RouteTable, _reference_row_hash, _row_hash
from fleetlens.triangulate.paths import SPORT_SPAN, PathModel, _same_strings
from fleetlens.triangulate.quantile import (
    Groups,
    _reference_group_quantile_bins,
    bins_of,
    to_bin,
)
from fleetlens.triangulate.store import FlowStore, unique
from tri_helpers import fabric_links, small

from fleetlens.records import WINDOW_SCHEMA
from fleetlens.topology import Topology

# ---- random windows ------------------------------------------------------------------------


def _flows(topo: Topology, rng: np.random.Generator, n: int) -> list[tuple[str, str, int]]:
    nics = [x.id for x in topo.nics]
    out = set()
    while len(out) < n:
        s, d = rng.choice(len(nics), 2, replace=False)
        out.add((nics[s], nics[d], int(rng.integers(40000, 40040))))
    return sorted(out)


def _table(topo: Topology, flows, rng: np.random.Generator, junk: bool, paths: bool) -> pa.Table:
    """One window's rows for ``flows`` in a random order; with ``junk``, also unknown NICs,
    duplicate rows, nulls, malformed counts and paths naming links not in the topology."""
    rows = []
    for s, d, sp in flows:
        sent = int(rng.integers(1, 200))
        path = None
        if paths and rng.random() < 0.7:
            cands = topo.ecmp_paths(s, d)
            path = list(cands[int(rng.integers(len(cands)))])
        rows.append(
            [s, d, sp, sent, sent - int(rng.integers(0, 3)), float(rng.integers(900, 5000)), path]
        )
    if junk:
        for r in rng.choice(len(rows), size=max(1, len(rows) // 10), replace=False):
            rows.append(list(rows[r]))  # the same flow twice
            rows[-1][3] = int(rng.integers(1, 200))  # (a different count: the first row wins)
            rows[-1][4] = rows[-1][3]
        rows += [
            ["nope/eth0", flows[0][1], 40001, 5, 5, 1.0, None],  # unknown NIC
            [flows[0][0], flows[0][0], 40002, 5, 5, 1.0, None],  # src == dst
            [flows[1][0], flows[1][1], 70000, 5, 5, 1.0, None],  # port out of range
            [None, flows[1][1], 40003, 5, 5, 1.0, None],  # null NIC
            [flows[2][0], flows[2][1], None, 5, 5, 1.0, None],  # null port
        ]
        for r in rng.choice(len(flows), size=4, replace=False):  # malformed counts
            rows[r][3], rows[r][4] = [(0, 0), (4, 9), (None, 1), (3, -1)][len(rows) % 4]
        for r in rng.choice(len(flows), size=3, replace=False):  # bad reported paths
            rows[r][6] = [[], ["h00/eth0->leaf0", "bogus->x"], ["x"] * 40][r % 3]
        for r in rng.choice(len(flows), size=3, replace=False):
            rows[r][5] = None  # no OWD
    order = rng.permutation(len(rows))
    rows = [rows[i] for i in order]
    start = [int(10**9 + rng.integers(0, 1000)) for _ in rows]
    if junk:
        start[0] = None
    cols = {
        "src_nic": [r[0] for r in rows],
        "dst_nic": [r[1] for r in rows],
        "sport": [r[2] for r in rows],
        "start_ns": start,
        "duration_ns": [10**9] * len(rows),
        "sent": [r[3] for r in rows],
        "received": [r[4] for r in rows],
        "pure": [0] * len(rows),
        "owd_min_ns": [r[5] for r in rows],
        "path": [r[6] for r in rows],
    }
    for name in ("owd_p50_ns", "owd_p99_ns", "owd_max_ns"):
        cols[name] = [1.0] * len(rows)
    t = pa.table(cols, schema=pa.schema([WINDOW_SCHEMA.field(k) for k in cols]))
    batches = t.to_batches(max_chunksize=max(1, len(rows) // 3 + 1))  # several chunks
    return pa.Table.from_batches(batches, t.schema)


class RefDecoder:
    """The window decode written plainly: dict lookups per row, first row per flow, keys
    sorted; paths remembered per flow key."""

    def __init__(self, pm: PathModel) -> None:
        self.pm = pm
        self.paths: dict[int, list[int]] = {}

    def decode(self, t: pa.Table, all_paths: bool):
        pm, c = self.pm, t.to_pydict()
        first: dict[int, int] = {}
        bad_key = dup = 0
        for i in range(t.num_rows):
            s = pm.nic_index.get(c["src_nic"][i], -1) if c["src_nic"][i] is not None else -1
            d = pm.nic_index.get(c["dst_nic"][i], -1) if c["dst_nic"][i] is not None else -1
            sp = c["sport"][i]
            if s < 0 or d < 0 or s == d or sp is None or not 0 <= sp < SPORT_SPAN:
                bad_key += 1
                continue
            k = (s * pm.n_nics + d) * SPORT_SPAN + sp
            if k in first:
                dup += 1
            else:
                first[k] = i
        keys = sorted(first)
        rows = [first[k] for k in keys]
        bad_path = self._learn(c, keys, rows) if all_paths else None
        sent = np.array([c["sent"][r] or 0 for r in rows], float)
        recv = np.array([c["received"][r] or 0 for r in rows], float)
        owd = np.array([np.nan if c["owd_min_ns"][r] is None else c["owd_min_ns"][r]
                        for r in rows])  # fmt: skip
        if len(keys) == t.num_rows:
            st = [x for x in c["start_ns"] if x is not None]
            ends = [a + b for a, b in zip(c["start_ns"], c["duration_ns"], strict=True)
                    if a is not None and b is not None]  # fmt: skip
            span = (min(st, default=0), max(ends, default=0))
        else:
            st = [c["start_ns"][r] or 0 for r in rows]
            ends = [(c["start_ns"][r] or 0) + (c["duration_ns"][r] or 0) for r in rows]
            span = (min(st, default=0), max(ends, default=0))
        ok = (sent > 0) & (recv >= 0) & (recv <= sent)
        dropped = {"unknown_nic_or_bad_key": bad_key, "bad_counts": int((~ok).sum())}
        if dup:
            dropped["duplicate_flow"] = dup
        keys = np.array(keys, np.int64)
        return keys[ok], sent[ok], (sent - recv)[ok], owd[ok], span, dropped, bad_path

    def _learn(self, c, keys, rows) -> int:
        bad = 0
        for k, r in zip(keys, rows, strict=True):
            p = c["path"][r]
            if p is None:
                continue
            links = [self.pm.link_index.get(x, -1) for x in p]
            if not links or len(links) > self.pm.max_hops or min(links) < 0:
                bad += 1
            else:
                self.paths[k] = links
        return bad

    def links_of(self, key: int) -> dict[int, float]:
        """Expected incidence of one flow: its remembered path, or access links plus the
        ECMP shares of the fabric links between the two leaves."""
        if key in self.paths:
            return dict.fromkeys(self.paths[key], 1.0)
        pm = self.pm
        pair = key // SPORT_SPAN
        s, d = divmod(pair, pm.n_nics)
        out = {int(pm.nic_up[s]): 1.0, int(pm.nic_down[d]): 1.0}
        a, b = pm.topo.nics[s].leaf, pm.topo.nics[d].leaf
        for lk, w in pm.topo.link_shares(a, b).items():
            out[pm.link_index[lk]] = out.get(pm.link_index[lk], 0.0) + w
        return out


def _check(pm: PathModel, ref: RefDecoder, t: pa.Table, all_paths: bool) -> None:
    f = pm.frame(t)
    key, sent, lost, owd, span, dropped, bad_path = ref.decode(t, all_paths)
    np.testing.assert_array_equal(f.key, key)
    pair = key // SPORT_SPAN
    np.testing.assert_array_equal(f.src, pair // pm.n_nics)
    np.testing.assert_array_equal(f.dst, pair % pm.n_nics)
    np.testing.assert_array_equal(f.sport, key % SPORT_SPAN)
    np.testing.assert_array_equal(f.sent, sent)
    np.testing.assert_array_equal(f.lost, lost)
    np.testing.assert_array_equal(f.owd_min, owd)
    assert (f.start_ns, f.end_ns) == span
    got = {k: v for k, v in f.dropped.items() if k != "bad_path"}
    assert got == dropped
    if bad_path is not None:
        assert f.dropped["bad_path"] == bad_path
    np.testing.assert_array_equal(f.known, [int(k) in ref.paths for k in key])
    row, link, w = f.inc.entries()
    for i, k in enumerate(key.tolist()):
        on = row == i
        got_links: dict[int, float] = {}
        for lk, x in zip(link[on].tolist(), w[on].tolist(), strict=True):
            got_links[lk] = got_links.get(lk, 0.0) + x
        want = ref.links_of(k)
        assert got_links.keys() == want.keys(), k
        assert all(abs(got_links[x] - want[x]) < 1e-12 for x in want), k


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_window_decode_matches_reference_over_windows(seed: int) -> None:
    topo = small()
    rng = np.random.default_rng(seed)
    pm, flows = PathModel(topo), _flows(topo, rng, 300)
    ref = RefDecoder(pm)
    _check(pm, ref, _table(topo, flows, rng, junk=True, paths=True), all_paths=True)
    for _ in range(3):  # the same flows, rows in another order each window, paths null
        _check(pm, ref, _table(topo, flows, rng, junk=False, paths=False), all_paths=False)
    _check(pm, ref, _table(topo, flows, rng, junk=True, paths=False), all_paths=False)
    more = sorted(set(flows) | set(_flows(topo, rng, 40)))  # new flows: a new layout
    _check(pm, ref, _table(topo, more, rng, junk=False, paths=False), all_paths=False)
    _check(pm, ref, _table(topo, flows[:100], rng, junk=False, paths=False), all_paths=False)


def test_empty_and_all_junk_windows() -> None:
    topo = small()
    pm = PathModel(topo)
    ref = RefDecoder(pm)
    empty = pa.table({k: pa.array([], WINDOW_SCHEMA.field(k).type) for k in WINDOW_SCHEMA.names})
    f = pm.frame(empty)
    assert f.n == 0 and (f.start_ns, f.end_ns) == (0, 0)
    rng = np.random.default_rng(5)
    flows = _flows(topo, rng, 20)
    _check(pm, ref, _table(topo, flows, rng, junk=True, paths=True), all_paths=True)
    t = _table(topo, flows, rng, junk=True, paths=False)
    junk = t.filter(pa.array([s == "nope/eth0" for s in t["src_nic"].to_pylist()]))
    _check(pm, ref, junk, all_paths=False)


def test_engine_verdicts_do_not_depend_on_row_order() -> None:
    """The same simulated windows, as sent and with rows shuffled and rechunked: identical
    verdicts and drop counts (flows are decoded into key order whatever the row order)."""
    topo = small()
    bad, late = fabric_links(topo)[3], fabric_links(topo)[9]
    faults = (f"{bad}:loss=0.02", f"{late}:delay_us=20:start_s=2")
    cfg = SimConfig(paths_known=True, faults=faults)
    tables = [w.windows.select(WINDOW_SCHEMA.names) for w in Simulator(topo, cfg, 3).stream(4)]
    rng = np.random.default_rng(0)
    a, b = Triangulator(topo), Triangulator(topo)
    for t in tables:
        shuffled = t.take(pa.array(rng.permutation(t.num_rows)))
        shuffled = pa.Table.from_batches(shuffled.to_batches(max_chunksize=997), t.schema)
        va, vb = a(t, topo, {}), b(shuffled, topo, {})
        assert [(v.subject, v.state, v.loss_rate, v.excess_delay_ns) for v in va] == [
            (v.subject, v.state, v.loss_rate, v.excess_delay_ns) for v in vb
        ]
        assert a.last.dropped == b.last.dropped
    assert {bad, late} <= {v.subject for v in va if v.state == "faulty"}


# ---- kernels ------------------------------------------------------------------------------


def test_baseline_update_matches_numpy() -> None:
    """Fresh flows (t = 0, NaN base), old ones creeping, missing probes (NaN), a clock
    behind the stored time: bit-identical to the numpy definition."""
    rng = np.random.default_rng(3)
    n = 5000
    base = np.where(rng.random(n) < 0.2, np.nan, rng.normal(50_000, 5_000, n))
    t = np.where(np.isnan(base), 0, rng.integers(1, 3_000_000_000, n)).astype(np.int64)
    at = rng.permutation(n)[: n // 2].astype(np.int64)
    obs = np.where(rng.random(at.size) < 0.1, np.nan, rng.normal(50_000, 8_000, at.size))
    for end_ns in (2_000_000_000, 4_000_000_000):  # some stored times are after the first
        want_b, want_t = base.copy(), t.copy()
        _reference_update_baselines(want_b, want_t, at, obs, end_ns, 2.0)
        got_b, got_t = base.copy(), t.copy()
        _fast.baseline_update(got_b, got_t, at, obs, end_ns, 2.0)
        np.testing.assert_array_equal(got_b, want_b)
        np.testing.assert_array_equal(got_t, want_t)


def test_baseline_creeps_once_over_a_silent_gap() -> None:
    """A flow without probes for 65 windows (a black hole) keeps its baseline; when it comes
    back the baseline has crept by the slack over the whole gap once (130 ns), not once per
    silent window (4.3 us, which read as the flow being 4 us early and, through the access
    split, as delay on its sibling uplinks)."""
    base, t = np.array([1_000.0]), np.array([1_000_000_000], np.int64)
    at = np.array([0], np.int64)
    for k in range(2, 67):
        _fast.baseline_update(base, t, at, np.array([np.nan]), k * 1_000_000_000, 2.0)
        assert base[0] == 1_000.0 and t[0] == 1_000_000_000
    _fast.baseline_update(base, t, at, np.array([1_500.0]), 67 * 1_000_000_000, 2.0)
    assert base[0] == pytest.approx(1_000.0 + 2.0 * 66)
    assert t[0] == 67 * 1_000_000_000


def test_decode_batch_matches_plain_lookups() -> None:
    """Positions by the pair hash equal a binary search; first row per flow, duplicates,
    unusable and unknown keys, counts and the span as a plain loop computes them."""
    rng = np.random.default_rng(1)
    n_nics = 50
    pairs = rng.choice(n_nics * n_nics, 400, replace=False)
    pairs = pairs[pairs // n_nics != pairs % n_nics]
    ports = [rng.choice(300, rng.integers(1, 30), replace=False) for _ in pairs]
    keys = unique(np.concatenate([p * SPORT_SPAN + q for p, q in zip(pairs, ports, strict=True)]))
    raw = np.concatenate([keys, keys[:50], keys[::3] + 1])
    raw = raw[rng.permutation(raw.size)]
    pair = raw // SPORT_SPAN
    src, dst, sport = pair // n_nics, pair % n_nics, (raw % SPORT_SPAN).astype(np.int32)
    src[:3] = [-1, dst[1], 7]  # unknown NIC, src == dst, and a valid row
    sport[3] = 70000
    n = raw.size
    sent = rng.integers(-1, 9, n).astype(np.int32)
    recv = rng.integers(-1, 9, n).astype(np.int32)
    owd, start, dur = rng.random(n), rng.integers(0, 10**6, n), rng.integers(0, 10**3, n)
    start_ok = (rng.random(n) > 0.1).astype(np.uint8)
    idx = _fast.FlowIndex(keys)
    pos, seen = np.empty(n, np.int64), np.zeros((keys.size + 63) // 64, np.uint64)
    out = np.full(keys.size, -7.0), np.full(keys.size, -7.0), np.full(keys.size, -7.0)
    got = _fast.decode_batch(idx, src, dst, sport, None, sent, None, recv, None, owd, None,
                             start, start_ok, dur, None, n_nics, 0, pos, seen, *out,
                             np.empty((6, n + 1), np.int64))  # fmt: skip
    rows = _fast.first_rows(pos, keys.size)
    k = np.where((src >= 0) & (src != dst) & (sport < SPORT_SPAN),
                 (src * n_nics + dst) * SPORT_SPAN + sport, -1)  # fmt: skip
    at = np.searchsorted(keys, k)
    found = (k >= 0) & (at < keys.size) & (keys[np.minimum(at, keys.size - 1)] == k)
    np.testing.assert_array_equal(pos, np.where(found, at, -1))
    first: dict[int, int] = {}
    for i, p in enumerate(pos.tolist()):
        if p >= 0:
            first.setdefault(p, i)
    assert rows.tolist() == [first.get(p, -1) for p in range(keys.size)]
    r = np.array([first[p] for p in sorted(first)])
    p = np.array(sorted(first))
    np.testing.assert_array_equal(out[0][p], sent[r])
    np.testing.assert_array_equal(out[1][p], sent[r] - recv[r])
    np.testing.assert_array_equal(out[2][p], owd[r])
    bad = (sent[r] <= 0) | (recv[r] < 0) | (recv[r] > sent[r])
    ok = start_ok.astype(bool)
    assert got == (
        int((k < 0).sum()), int((~found & (k >= 0)).sum()), int(found.sum()) - len(first),
        len(first), int(bad.sum()), int(start[ok].min()), int((start + dur)[ok].max()), True,
        True,
    )  # fmt: skip


def test_bins_and_group_quantiles_equal_numpy() -> None:
    rng = np.random.default_rng(2)
    v = np.concatenate([rng.normal(0, 3000, 50_000), rng.exponential(1e5, 50_000),
                        -rng.exponential(1e4, 10_000), [np.nan, np.inf, -np.inf, 0.0, -0.0,
                        1e13, -1e13, 4000, -4000, 3950, 4050, 50, -50, 149.99]])  # fmt: skip
    v[::5] = np.round(v[::5])
    ref = np.full(v.shape, -1, np.int64)
    ok = np.isfinite(v)
    ref[ok] = to_bin(v[ok])
    b = bins_of(v)
    np.testing.assert_array_equal(b, ref)
    g = rng.integers(0, 50, v.size)
    g[g == 7] = 8  # an empty group
    for w in (np.ones(v.size), rng.random(v.size), np.where(g == 3, 0.0, 1.0)):
        for q in (0.5, 0.2, 0.0, 1.0):
            got = Groups(g, 52, w).quantile(b, q)
            want = _reference_group_quantile_bins(g, b, w, 52, q)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
    with pytest.raises(ValueError):
        Groups(np.array([60]), 52).quantile(np.array([3]))


def test_route_hash_and_unique_equal_numpy() -> None:
    rng = np.random.default_rng(3)
    mid = rng.integers(-1, 40, (5000, 6))
    np.testing.assert_array_equal(_row_hash(mid), _reference_row_hash(mid))
    a = rng.integers(-5, 300, 20_000)
    np.testing.assert_array_equal(unique(a), np.unique(a))
    want = np.unique(a, return_index=True, return_inverse=True)
    for got, exp in zip(unique(a, first=True, inverse=True), want, strict=True):
        np.testing.assert_array_equal(got, exp.reshape(-1))
    assert unique(np.empty(0, np.int64)).size == 0


def _incidence(rng: np.random.Generator, n: int) -> Incidence:
    n_links = 30
    routes = RouteTable(n_links)
    for r in range(12):
        links = rng.choice(n_links, 3, replace=False)
        routes.add(b"r%d" % r, links, rng.random(3))
    up = rng.integers(0, n_links + 1, n)  # n_links: no access link
    dn = rng.integers(0, n_links + 1, n)
    return Incidence(up, dn, rng.integers(0, len(routes), n), routes, n_links)


def test_link_sums_equal_bincounts() -> None:
    rng = np.random.default_rng(4)
    inc = _incidence(rng, 3000)
    inc.up.sort()  # runs of one access link, as the rows of a NIC's flows come
    n = inc.n_links

    def want(x: np.ndarray) -> np.ndarray:
        got = np.bincount(inc.up, x, n + 1)[:n] + np.bincount(inc.dn, x, n + 1)[:n]
        return got + inc.routes.link_sum(np.bincount(inc.route, x, len(inc.routes)))

    counts = rng.integers(0, 300, 3000).astype(np.float64)  # packets: exactly equal
    np.testing.assert_array_equal(inc.link_sums(counts), want(counts))
    decayed = rng.random(3000) * 100  # run sums round differently, by ulps
    np.testing.assert_allclose(inc.link_sums(decayed), want(decayed), rtol=1e-12)


def test_decay_add_equals_numpy() -> None:
    rng = np.random.default_rng(5)
    sent, lost = rng.random(1000) * 10, rng.random(1000) * 1e-2
    sent[::97] = 0.0
    f_sent, f_lost = np.where(rng.random(1000) < 0.1, 0.0, 7.0), rng.integers(0, 2, 1000) * 1.0
    want_s, want_l = sent * 0.97, lost * 0.97
    want_s += f_sent
    want_l += f_lost
    want_l[want_l < 1e-3] = 0.0
    now, every = np.full(1000, -1, np.int64), np.full(1000, -1, np.int64)
    keep, k_now, k_all = _fast.decay_add(sent, lost, f_sent, f_lost, 0.97, 1e-3, 0.05, now, every)
    np.testing.assert_array_equal(sent, want_s)
    np.testing.assert_array_equal(lost, want_l)
    assert keep == bool(np.all(want_s >= 0.05))
    np.testing.assert_array_equal(now[:k_now], np.flatnonzero(f_lost > 0))
    np.testing.assert_array_equal(every[:k_all], np.flatnonzero(want_l > 0))
    assert 0 < k_now < k_all < 1000
    with pytest.raises(ValueError):
        _fast.decay_add(sent, lost, f_sent, f_lost, 0.97, 1e-3, 0.05, now[:10], every)


def test_store_sort_keeps_values_and_aligns() -> None:
    s = FlowStore({"x": (np.float64, np.nan, 0)})
    at = s.locate(np.array([9, 2, 5]))
    s.cols["x"][at] = [90, 20, 50]
    keys = np.array([2, 5, 9])
    assert not s.aligned(keys)
    s.sort()
    assert s.aligned(keys) and s.cols["x"].tolist() == [20, 50, 90]
    assert s.find(np.array([5, 7])).tolist() == [1, -1]
    s.locate(np.array([7]))  # a new row: no longer aligned with the old keys
    assert not s.aligned(keys)


def test_group_rows_equals_stable_argsort() -> None:
    rng = np.random.default_rng(6)
    col = rng.integers(0, 40, 5000)
    order, ptr = _fast.group_rows(col, 41)
    want = np.argsort(col, kind="stable")
    np.testing.assert_array_equal(order, want)
    np.testing.assert_array_equal(ptr, np.searchsorted(col[want], np.arange(42)))
    with pytest.raises(ValueError):
        _fast.group_rows(np.array([3, 41]), 41)


def test_store_filled_in_key_order_equals_general_insert() -> None:
    keys = np.array([3, 8, 20, 21])
    a, b = FlowStore({"x": (np.int64, -1, 0)}), FlowStore({"x": (np.int64, -1, 0)})
    np.testing.assert_array_equal(a.locate(keys), np.arange(4))  # empty + increasing
    b.locate(keys[:1])
    b.locate(keys)  # the general path
    np.testing.assert_array_equal(a.keys, b.keys)
    for s in (a, b):
        np.testing.assert_array_equal(s.find(np.array([21, 3, 4])), [3, 0, -1])
        s.locate(np.array([5, 21]))
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.find(np.array([5, 20])), b.find(np.array([5, 20])))


def test_u64_map_equals_sorted_search() -> None:
    rng = np.random.default_rng(7)
    keys = np.sort(rng.integers(0, 2**63, 3000, dtype=np.uint64))
    keys[10] = keys[11]  # a repeated key: the first sorted match wins, as in searchsorted
    ids = rng.permutation(3000).astype(np.int64)
    q = np.concatenate([keys, rng.integers(0, 2**63, 500, dtype=np.uint64), [0]]).astype(np.uint64)
    at = np.searchsorted(keys, q)
    hit = (at < keys.size) & (keys[np.minimum(at, keys.size - 1)] == q)
    want = np.where(hit, ids[np.minimum(at, keys.size - 1)], -1)
    np.testing.assert_array_equal(_fast.U64Map(keys, ids).get(q), want)


def test_same_strings_equals_arrow_equals() -> None:
    """The buffer compare of NIC-id columns answers as ``ChunkedArray.equals`` whatever the
    chunking, slicing, nulls, trailing bytes or a one-byte change."""
    rng = np.random.default_rng(7)
    ids = [f"h{i:04d}/eth{i % 8}" for i in range(300)]
    vals = [ids[i] for i in rng.integers(0, 300, 5000)]
    base = pa.chunked_array([pa.array(vals[:2000]), pa.array(vals[2000:])])
    changed = list(vals)
    changed[4321] = changed[4321][:-1] + "9"
    with_null = list(vals)
    with_null[17] = None
    variants = [
        pa.chunked_array([pa.array(vals[:2000]), pa.array(vals[2000:])]),  # equal, new buffers
        pa.chunked_array([pa.array(vals)]),  # equal, chunked otherwise
        pa.chunked_array([pa.array(["x", *vals[:2000]])[1:], pa.array(vals[2000:])]),  # sliced
        pa.chunked_array([pa.array(changed[:2000]), pa.array(changed[2000:])]),
        pa.chunked_array([pa.array(with_null[:2000]), pa.array(with_null[2000:])]),
        pa.chunked_array([pa.array(vals[:2000]), pa.array(vals[2000:-1])]),  # shorter
        pa.chunked_array([pa.array(vals[:2000]), pa.array(vals[2000:])]).cast(pa.large_string()),
    ]
    # same offsets and used bytes but different bytes past the end of the data buffer
    big = pa.array([*vals[2000:], "zzzz"])
    variants.append(pa.chunked_array([pa.array(vals[:2000]), big.slice(0, len(vals) - 2000)]))
    for v in variants:
        assert _same_strings(base, v) == base.equals(v)
        assert _same_strings(v, base) == v.equals(base)
    assert _same_strings(base, variants[0])
