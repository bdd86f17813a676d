"""The sync's carried state at scale: bounded in memory over many rounds, and the pooled fits
from the per-window reduced hulls equal a re-pooling of every stored window's raw points; the
Cython re-implementations give the models of the numpy forms they replaced, and the pair
hulls read straight from the rows those of every point flattened, and rows cut to their pair's
hull those of whole flow hulls."""

from __future__ import annotations

from collections import deque

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator
from fleetlens.sync import HuygensSync, SyncConfig, network, purity, solver
from fleetlens.sync._csr import RowLists
from fleetlens.sync.pooling import HullPool, Pooled, WindowEdges
from fleetlens.sync.purity import HullPoints

from fleetlens.records import ClockModel
from fleetlens.topology import Topology, from_spec

FLEET = "leafspine:hosts=16,nics=2,leaves=4,spines=2"


class RepoolingPool(HullPool):
    """The pool as it was before the reduced hulls and their blocks: every stored window's
    raw hull points, re-pooled on every call (the reference the blocks must reproduce)."""

    def __init__(self, cfg: SyncConfig) -> None:
        super().__init__(cfg)
        self.raw: deque[tuple[int | None, HullPoints]] = deque(maxlen=max(cfg.pool_sizes) - 1)

    def remember(self, pts: HullPoints, gen: int | None) -> None:
        super().remember(pts, gen)
        self.raw.append((gen, pts))

    def pooled(self, pts: HullPoints, gen: int | None, span: int) -> Pooled:
        pos = {n: i for i, n in enumerate(pts.nics)}
        parts = [(pts.src, pts.dst, pts.t_raw, pts.owd_raw)]
        for k, (g, old) in enumerate(reversed(self.raw), start=1):
            age = gen - g if gen is not None and g is not None else k
            if not 0 < age < span:
                continue
            remap = np.array([pos.get(n, -1) for n in old.nics], np.int64)
            s, d = remap[old.src], remap[old.dst]
            keep = (s >= 0) & (d >= 0)
            parts.append((s[keep], d[keep], old.t_raw[keep], old.owd_raw[keep]))
        src, dst, t_raw, owd_raw = (np.concatenate([p[i] for p in parts]) for i in range(4))
        return Pooled(src, dst, t_raw, owd_raw)

    def pooled_edges(self, pts: HullPoints, gen: int | None, span: int, edges: WindowEdges) -> None:
        return None  # the solver maps the re-pooled points of :meth:`pooled`


def _windows(topo: Topology, seconds: int, seed: int, **cfg: object) -> list[pa.Table]:
    sim_cfg = SimConfig(clock="identity", symmetric_paths=True, paths_known=True, **cfg)
    sim = Simulator(topo, sim_cfg, seed=seed)
    return [sw.windows.drop(["window"]) for sw in sim.stream(float(seconds))]


def _drive(
    sync: HuygensSync, windows: list[pa.Table], topo: Topology
) -> tuple[list[dict[str, ClockModel]], int]:
    """One call per window with the look-back (this window and the one before), as the
    collector's clock round hands them; the models after each call, and how many edge fits
    of the run were pooled over more than one window."""
    models: dict[str, ClockModel] = {}
    out, pooled = [], 0
    for i in range(len(windows)):
        table = pa.concat_tables(windows[max(i - 1, 0) : i + 1])
        models = {m.host_id: m for m in sync(table, topo, models)}
        out.append(models)
        span = sync.report.span
        pooled += 0 if span is None else int((span > 1).sum())
    return out, pooled


def test_reduced_pool_gives_the_models_of_re_pooling_every_window() -> None:
    topo = from_spec(FLEET)
    # Straight clocks (no wander, no drift steps): the long spans are chosen.
    windows = _windows(topo, 40, seed=3, drift_walk_ppb=0.0, temp_step_rate=0.0)
    new, ref = HuygensSync(), HuygensSync()
    ref.pool = RepoolingPool(ref.cfg)
    (got, pooled), (want, _) = _drive(new, windows, topo), _drive(ref, windows, topo)
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for h, m in g.items():
            assert m.synced == w[h].synced
            assert abs(m.offset_ns - w[h].offset_ns) < 0.05
            assert abs(m.drift_ppb - w[h].drift_ppb) < 0.01
    assert pooled > 0  # the pooled spans were chosen, not only single windows


def test_carried_state_stays_bounded_over_many_rounds() -> None:
    topo = from_spec(FLEET)
    # Clocks without drift: a window replayed ``shift`` later is what that window would show.
    still = dict(max_drift_ppb=0.0, drift_walk_ppb=0.0, temp_step_rate=0.0)
    windows = _windows(topo, 8, seed=5, **still)
    sync = HuygensSync()
    sizes = []
    models: dict[str, ClockModel] = {}
    shift = 8 * int(windows[0]["duration_ns"][0].as_py())
    for r in range(80):
        w = _shifted(windows[r % 8], (r // 8) * shift)
        models = {m.host_id: m for m in sync(w, topo, models)}
        assert all(m.synced for m in models.values())
        # 32 rounds apart (a multiple of the replay's 8): the same windows in the spans, and
        # the same alignment of the blocks
        if r in (47, 79):
            sizes.append(_state_sizes(sync))
    assert sizes[0] == sizes[1]
    # the last 31 windows, and the blocks of 2-16 of them that reach into the last 31
    assert sizes[0]["windows"] == max(sync.cfg.pool_sizes) - 1
    assert sizes[0]["blocks"] <= 31 + 16 + 9 + 5 + 3


def _state_sizes(sync: HuygensSync) -> dict[str, int]:
    pool = sync.pool
    return {
        "windows": sum(h is not None and k[0] == 0 for k, h in pool.blocks.items()),
        "blocks": sum(h is not None for h in pool.blocks.values()),
        "block_points": sum(h.t_raw.size for h in pool.blocks.values() if h is not None),
        "tracks": int(pool.tracks.code.size),
        "nics": len(pool._nic_ids),
        "hosts": len(sync.tracker.states),
        "scratch": sum(a.size for bufs in sync.scratch._bufs.values() for a in bufs),
    }


def _shifted(t: pa.Table, shift: int) -> pa.Table:
    """The window ``shift`` ns later on clocks without drift."""
    for name in ("start_ns", "hull_t_ns"):
        col = t[name].combine_chunks()
        if pa.types.is_list(col.type):
            moved = pa.ListArray.from_arrays(col.offsets, pa.array(col.values.to_numpy() + shift))
        else:
            moved = pa.array(col.to_numpy() + shift)
        t = t.set_column(t.schema.get_field_index(name), name, moved)
    return t


def _flatten_by_numpy(
    keep: np.ndarray, lists: RowLists, total: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """:func:`fleetlens.sync._csr.flatten_points` by numpy gathers (as hull_points had it),
    over the columns' chunks concatenated."""
    src, dst = np.asarray(lists.src), np.asarray(lists.dst)
    rows = np.flatnonzero(keep)
    n = np.asarray(lists.t.n)[rows]
    row = np.repeat(rows, n)
    within = np.arange(total) - np.repeat(np.cumsum(n) - n, n)
    vals, good = [], np.ones(total, bool)
    for col in (lists.t, lists.y):
        chunks = [c.values for c in col.col.chunks]  # each chunk's values, as offsets index them
        base = np.cumsum([0, *(len(v) for v in chunks)])
        k = (base[np.asarray(col.ch)] + np.asarray(col.at))[row] + within
        flat = pa.concat_arrays([pa.array([], pa.int64()), *chunks])
        vals.append(pc.fill_null(flat, 0).to_numpy()[k])
        good &= flat.is_valid().to_numpy(zero_copy_only=False)[k]
    return src[row][good], dst[row][good], vals[0][good], vals[1][good], int((~good).sum())


def test_kernels_give_the_models_of_their_numpy_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-pass flattening and the bucketed median are re-implementations: the models
    are bit-identical to those of the numpy forms they replaced."""
    topo = from_spec(FLEET)
    windows = _windows(topo, 12, seed=4)
    got, _ = _drive(HuygensSync(), windows, topo)
    monkeypatch.setattr(solver, "shifted_median", lambda t, h, s: np.median(t - s[h]))
    monkeypatch.setattr(purity, "flatten_points", _flatten_by_numpy)
    want, _ = _drive(HuygensSync(), windows, topo)
    assert got == want
    assert all(m.synced for m in got[-1].values())


def _commit_order(window: pa.Table, seed: int) -> pa.Table:
    """A window as the collector's look-back holds it: one chunk per host's batch (its
    senders' rows), hosts in the order they committed (shuffled)."""
    host = [n.partition("/")[0] for n in window["src_nic"].to_pylist()]
    by = {h: np.flatnonzero(np.array(host) == h) for h in dict.fromkeys(host)}
    order = np.random.default_rng(seed).permutation(len(by))
    batches = [window.take(list(by.values())[i]).combine_chunks() for i in order]
    return pa.concat_tables(batches)


def test_rows_reduced_in_one_pass_give_the_models_of_every_point_flattened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The solve reads each directed pair's hull straight from the rows' list buffers:
    bit-identical models to every point flattened and reduced after, with the rows in commit
    order and a clock step inside a window (soft-margin fits)."""
    topo = from_spec(FLEET)
    step = ("h03:clock_step_us=1000:start_s=3.5",)
    windows = [_commit_order(w, i) for i, w in enumerate(_windows(topo, 8, seed=7, faults=step))]

    def run() -> tuple[list[dict[str, ClockModel]], int]:
        sync, models, out, soft = HuygensSync(), {}, [], 0
        for i in range(len(windows)):
            table = pa.concat_tables(windows[max(i - 1, 0) : i + 1])
            models = {m.host_id: m for m in sync(table, topo, models)}
            out.append(models)
            soft += 0 if sync.report.fits is None else int(sync.report.fits.soft.sum())
        return out, soft

    got, soft = run()
    assert soft > 0  # the step's window overlapped: soft-margin fits ran
    monkeypatch.setattr(solver, "hull_points", lambda w, **_: purity.hull_points(w))
    want, _ = run()
    assert got == want


def test_edges_and_kept_sets_carried_across_windows_give_the_models_of_fresh_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A window whose pairs run as the last one's takes its edge numbering and its network
    solves' kept sets from it: bit-identical models to both found again every window, with
    a clock step (its window's kept sets differ) and the rows in commit order."""
    topo = from_spec(FLEET)
    step = ("h05:clock_step_us=1000:start_s=4.5",)
    windows = [_commit_order(w, i) for i, w in enumerate(_windows(topo, 10, seed=9, faults=step))]
    carried = HuygensSync()
    got, _ = _drive(carried, windows, topo)
    assert carried._runs is not None and carried._sets is not None

    class Fresh(solver._EdgeGeometry):
        def __init__(self, pts: HullPoints, nic_h: np.ndarray, nums: np.ndarray, *_: object):
            super().__init__(pts, nic_h, nums)

    monkeypatch.setattr(solver, "_EdgeGeometry", Fresh)
    monkeypatch.setattr(network.ActiveSets, "of", lambda _s, *a: network.ActiveSets(*a))
    want, _ = _drive(HuygensSync(), windows, topo)
    assert got == want
    assert all(m.synced for m in got[-1].values())


@pytest.mark.parametrize(
    ("kinds", "want"),
    [
        (["hardware"] * 3, "hardware"),
        (["software"] * 3, "software"),
        (["hardware", "hardware", "software"], "software"),
        (["software", "hardware", "hardware"], "software"),
        (["hardware", None, "hardware"], "software"),
        ([], "software"),
    ],
)
def test_stamp_kind_is_hardware_only_if_every_row_is(kinds: list[str | None], want: str) -> None:
    col = pa.chunked_array([pa.array(kinds[:1], pa.string()), pa.array(kinds[1:], pa.string())])
    assert solver._ts_kind(pa.table({"ts_source": col})) == want


def test_generations_of_mixed_or_missing_lengths_by_each_rows_own() -> None:
    """Rows of two window lengths, or one without a length, are each placed by their own."""
    start = pa.array([0, 1_000, 2_000, 4_000, 5_000], pa.int64())
    for dur in ([1_000, 1_000, 1_000, 2_000, 1_000], [1_000, None, 1_000, 1_000, 1_000]):
        t = pa.table({"start_ns": start, "duration_ns": pa.array(dur, pa.int64())})
        gens = purity.complete_generations(t, after=-10, quorum=0.0)
        d = np.array([x or 0 for x in dur])
        ok = d > 0
        want = sorted(set(((np.array(start) + (d >> 1))[ok] // d[ok]).tolist()))
        assert [g for _, g in gens] == want


def test_rows_cut_to_their_pair_hull_give_the_models_of_whole_flow_hulls() -> None:
    """Agents send each flow's points on its pair's hull only; older agents' whole flow
    hulls are still read, and the same probes give bit-identical models either way (the
    solve fits each directed pair's hull of the union of its flows' points), with a clock
    step inside a window (soft-margin fits) and the rows in commit order."""
    topo = from_spec(FLEET)
    step = ("h02:clock_step_us=1000:start_s=5.5",)
    cut, whole = (
        [
            _commit_order(w, i)
            for i, w in enumerate(_windows(topo, 12, 6, faults=step, pair_hulls=p))
        ]
        for p in (True, False)
    )
    points = [pc.sum(pc.list_value_length(w["hull_t_ns"])).as_py() for w in (cut[0], whole[0])]
    assert points[0] < points[1]  # the cut dropped points
    got, _ = _drive(HuygensSync(), cut, topo)
    want, _ = _drive(HuygensSync(), whole, topo)
    assert got == want
    assert all(m.synced for m in got[-1].values())
