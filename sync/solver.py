"""The solve the collector runs every window: hulls in, one ClockModel per host out.

``HuygensSync()`` instances are ``SolveClocks`` callables (``fleetlens/engines.py``) that keep
the drift tracker between windows; ``solve_clocks`` is the stateless form, seeded only from
the previous models it is handed.

Steps per window:

1. Purity/usable rows (:mod:`.purity`), hull points flattened.
2. Common time axis: a hull's ``t`` is the sender's raw clock, and two senders differ by up
   to 100 ms (±50 ms offsets). With drift differences up to 200 ppm that would move an edge's
   line by up to 20 µs, so each point's ``t`` is mapped to fleet time through the sender's
   current model. On the first window (no model) the solve is repeated with its own result
   until the offsets used for the mapping agree with the solution within ``remap_ns`` (5 µs:
   a residual ≤ 200 ppm × 5 µs = 1 ns); two or three passes.
3. Max-margin fit per NIC pair (:mod:`.edgefit`). Edges are NIC pairs, not host pairs, so a
   fault on one NIC's link shows up as disagreement between that host's NICs.
   With software stamps, each edge is also fitted over the pooled hulls of the last 8 and
   32 windows (:mod:`.pooling`) and the span that best predicted the next window across the
   fleet is used where it is allowed; its prediction score also floors the measurement noise
   the tracker is given (a pairwise-only edge has no residual to show it).
4. Hosts with most of their edges overlapping (a clock step or broken stamps inside the
   window) are left out of this window: they are reported unsynchronized, not guessed.
   Soft-margin edges otherwise count with weight ``soft_weight``.
5. Network effect (:mod:`.network`): robust weighted least squares for offsets, then drifts.
6. Drift tracking, drift-change and step detection (:mod:`.tracking`); a host with
   ``min_edges`` agreeing edges is trusted (a surprise is followed at once), others must
   repeat a surprise. Models out, ``synced`` only for hosts measured in this window.
   ``error_bound_ns`` is 3σ of the tracked offset.

Window length: the probe plan's 1 s window (100 rounds at 10 ms) gives each NIC pair ~100 pure
points per direction, enough for the minimum delays to be within tens of ns of the floor with
software stamps, while drift wander over 1 s (≈ 20–50 ppb) keeps clocks linear to a few ns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetlens.records import TS_HARDWARE, ClockModel
from fleetlens.topology import Topology

from ._csr import edge_delays, fleet_times, shifted_median
from .config import SyncConfig
from .edgefit import EdgeFits, fit_edges
from .network import ActiveSets, NetSolution, solve_network
from .pooling import HullPool, WindowEdges
from .purity import HullPoints, KnownNics, complete_generations, hull_points
from .scratch import Scratch
from .tracking import DriftTracker


@dataclass
class SolveReport:
    """Diagnostics of the last solve (for tests, benchmarks and the collector's metrics)."""

    t_ref_ns: int = 0
    hosts: list[str] = field(default_factory=list)
    edge_lo: np.ndarray | None = None  # host index per edge
    edge_hi: np.ndarray | None = None
    nic_ids: list[str] = field(default_factory=list)  # the window's NICs
    edge_nic: np.ndarray | None = None  # (edges, 2): each edge's NICs (lo, hi) in nic_ids
    pairwise: np.ndarray | None = None  # per-edge offset difference at t_ref (ns)
    fits: EdgeFits | None = None
    offsets: NetSolution | None = None
    drifts: NetSolution | None = None
    unstable: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    passes: int = 0
    edge_codes: np.ndarray | None = None  # per edge: its number, the same in every window
    span: np.ndarray | None = None  # windows pooled for each edge's fit (:mod:`.pooling`)
    edge_noise: np.ndarray | None = None  # per edge: the chosen span's offset noise (ns)
    edge_excess: np.ndarray | None = None  # per edge: margin above the pooled floor (ns)
    ts_kind: str = "software"

    @property
    def edge_nics(self) -> list[tuple[str, str]]:
        """Each edge's NIC ids (lo, hi), named when asked: ~130 k pairs at 1024 hosts."""
        return self._named(slice(None))

    @property
    def outlier_edges(self) -> list[tuple[str, str]]:
        if self.offsets is None:
            return []
        return self._named(np.flatnonzero(self.offsets.outlier))

    def _named(self, edges: slice | np.ndarray) -> list[tuple[str, str]]:
        if self.edge_nic is None:
            return []
        ids = self.nic_ids
        return [(ids[a], ids[b]) for a, b in self.edge_nic[edges].tolist()]


_READ = ("src_nic", "dst_nic", "start_ns", "duration_ns", "pure", "hull_t_ns", "hull_owd_ns",
         "ts_source")  # fmt: skip


class HuygensSync:
    """Stateful ``SolveClocks``: call once per window with the newest windows."""

    def __init__(
        self,
        config: SyncConfig | None = None,
        reference_host: str | None = None,
        nic_latency: Mapping[str, tuple[float, float]] | None = None,
    ) -> None:
        """``nic_latency``: optional calibrated fixed ``(egress_ns, ingress_ns)`` per NIC id,
        the part of each NIC's send and receive delay that differs between directions (what
        ptp4l calls egressLatency/ingressLatency). A per-host path asymmetry is invisible to
        any two-way method — it looks exactly like an offset — so it can only be calibrated
        away, never estimated; NICs not listed are taken as symmetric."""
        self.cfg = config or SyncConfig()
        self.reference_host = reference_host
        self.nic_latency = dict(nic_latency or {})
        self.generation: int | None = None
        self.models: list[ClockModel] = []
        self.idle_calls = 0
        self.tracker = DriftTracker(self.cfg)
        self.scratch = Scratch()  # the merges' buffers, kept from window to window
        self.known = KnownNics()  # NIC ids of earlier windows: only new ones hashed twice
        self.pool = HullPool(self.cfg, self.scratch)
        self.report = SolveReport()
        self._excess: np.ndarray | None = None  # the pooled fit's margin excess per edge
        self._lat: tuple[list[str], np.ndarray] | None = None  # _latency's last NICs and answer
        self._runs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # _EdgeGeometry's
        self._sets: ActiveSets | None = None  # the network solves' kept sets (_Network)

    def __call__(
        self, windows: pa.Table, topology: Topology | None, prev: dict[str, ClockModel]
    ) -> list[ClockModel]:
        for m in prev.values():
            self.tracker.seed(m)
        # the columns the solve reads: a generation's slice cuts their chunks only (the
        # look-back holds a chunk per host's batch in every column)
        windows = windows.select([c for c in _READ if c in windows.schema.names])
        todo: Sequence[tuple[pa.Table, int | None]]
        todo = complete_generations(windows, after=self.generation)
        if not todo:
            self.idle_calls += 1
            if self.models and self.idle_calls < self.cfg.stale_calls:
                return list(self.models)  # nothing new: each window is folded in once
            todo = [(windows.slice(0, 0), None)]  # no news for a while: coast, unsynced
        else:
            self.idle_calls = 0
        for rows, gen in todo[-self.cfg.max_backlog :]:
            self.generation = gen if gen is not None else self.generation
            self.models = self._one_window(rows, topology, prev, gen)
        return list(self.models)

    def _one_window(
        self,
        windows: pa.Table,
        topology: Topology | None,
        prev: dict[str, ClockModel],
        gen: int | None,
    ) -> list[ClockModel]:
        pts = hull_points(windows, reduce=True, scratch=self.scratch, known=self.known)
        hosts = _host_list(pts, topology, prev, self.tracker)
        if pts.t_raw.size == 0:
            self.report = SolveReport(hosts=hosts, dropped=pts.dropped)
            return [self._coast(h) for h in hosts]
        rep = self._solve(pts, hosts, _ts_kind(windows), gen)
        self.report = rep
        win = _Solved.of(rep)
        models = self._publish(rep, win)
        if rep.steps and rep.edge_codes is not None:  # spans through a step fit nothing:
            # those edges start over
            stepped = np.isin(np.arange(len(rep.hosts)), [rep.hosts.index(h) for h in rep.steps])
            self.pool.forget(rep.edge_codes[stepped[win.lo] | stepped[win.hi]])
        self.pool.remember(pts, gen)
        self.pool.cut(pts, {*rep.steps, *rep.unstable})
        return models

    # ---- one window ---------------------------------------------------------------------
    def _solve(self, pts: HullPoints, hosts: list[str], kind: str, gen: int | None) -> SolveReport:
        hidx = {h: i for i, h in enumerate(hosts)}
        nic_h = np.array([hidx[h] for h in pts.nic_host], np.int64)
        # The fits rest on each directed pair's hull: the window's points reduced once.
        red = self.pool.window_hulls(pts)
        theta, drift, known, t_ref = self._prior(hosts, red, nic_h[red.src])
        geo = _EdgeGeometry(red, nic_h, self.pool.nic_numbers(pts), self._runs)
        self._runs = geo.runs
        tracked = (drift.copy(), self._drift_sd.copy(), known.copy())
        net = _Network(len(hosts), geo, kind, hidx.get(self.reference_host or ""), self.cfg,
                       self._sets)  # fmt: skip
        self._sets = net.sets
        lat = self._latency(pts)
        y = _edge_owd(red.owd_raw, red.src, red.dst, lat)[1]
        npass, mapped = 0, known.copy()
        while True:
            npass += 1
            t = _fleet_t(red.t_raw, red.src, nic_h, theta, drift, t_ref)
            b_prior = (drift[geo.hi] - drift[geo.lo]) * 1e-9
            fits = fit_edges(geo.edge, geo.upper, t, y, geo.n, b_prior, cfg=self.cfg)
            # Edges to a host whose time mapping is still a guess may look overlapped only
            # because its points sit at the wrong t: take them at face value this pass.
            lenient = ~(mapped[geo.lo] & mapped[geo.hi])
            unstable, off, dft = net.solve(fits, lenient, theta, drift, known)
            # How far the times used for this pass were off: offset change plus drift change
            # over the half window.
            moved = np.abs(off.x - theta) + np.abs(np.nan_to_num(dft.x - drift)) * 0.5
            moved = moved[off.solved]
            theta = np.where(off.solved, off.x, theta)
            drift = np.where(dft.solved, dft.x, drift)
            remapped = moved.size == 0 or moved.max() <= self.cfg.remap_ns
            settled = remapped and (moved.size == 0 or mapped[off.solved].all())
            mapped |= off.solved
            if settled or npass >= self.cfg.max_passes:
                break
        pairwise = fits.a.copy()
        span = np.zeros(geo.n, np.int64)
        # Hardware stamps: a window is already at the ns level, and spans bent by temperature
        # drift steps cost more than they gave (128-host sim, steps on: p99 34 ns pooled vs
        # 16 ns single-window), so only software-stamped windows are pooled.
        pool_ok = kind != TS_HARDWARE and len(self.pool.sizes) > 1
        self._excess = None
        if pool_ok and self.pool.has_history and mapped[off.solved].all():
            tm = _TimeMap(nic_h, theta, drift, t_ref, lat)
            fits, span = self._pool_fits(pts, (red, y), geo, tm, gen, fits, tracked)
            lenient = np.zeros(geo.n, bool)
            unstable, off, dft = net.solve(fits, lenient, theta, drift, known)
        elif pool_ok:
            slope = (drift[geo.hi] - drift[geo.lo]) * 1e-9
            self.pool.choose(geo.codes, t_ref, [fits] * len(self.pool.sizes), slope)  # start
        rep = SolveReport(
            t_ref, hosts, geo.lo, geo.hi, pts.nics, geo.nic_pair, pairwise, fits, off, dft,
            [hosts[i] for i in np.flatnonzero(unstable)], [], pts.dropped, npass,
        )  # fmt: skip
        rep.edge_codes, rep.span = geo.codes, np.array(self.pool.sizes)[span]
        if pool_ok and self.pool.noise.size == geo.n:
            rep.edge_noise = self.pool.noise
        rep.edge_excess = self._excess
        rep.ts_kind = kind
        return rep

    def _pool_fits(
        self,
        pts: HullPoints,
        own: tuple[HullPoints, np.ndarray],
        geo: _EdgeGeometry,
        tm: _TimeMap,
        gen: int | None,
        fits1: EdgeFits,
        tracked: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> tuple[EdgeFits, np.ndarray]:
        """Fits over the last k windows' hulls for every span k, one chosen per edge.

        The pooled fits' slope is searched only within ``cfg.pool_bracket_k`` tracked drift
        standard errors of the tracker's drift difference (at least ``cfg.pool_bracket_ppb``):
        over 32 windows the free max-margin slope tilted by 2-20 ppb on two lab hosts on one
        clock (the line rests on 2-4 extreme points), 60-700 ns at the newest window, while
        the tracker, averaging offsets over many windows, knew the drift better. A slope at
        the bracket's edge keeps the tracked one (the fit is then the min-of-mins intercept
        at that slope). ``own``: the window's pair hulls (``geo``'s points) and their signed
        delays, the one-window span's points."""
        cfg, drift = self.cfg, tm.drift
        b_prior = (drift[geo.hi] - drift[geo.lo]) * 1e-9
        d_tr, sd_tr, k_tr = tracked
        both = k_tr[geo.lo] & k_tr[geo.hi]
        b_tr = np.where(both, (d_tr[geo.hi] - d_tr[geo.lo]) * 1e-9, b_prior)
        sd = np.hypot(sd_tr[geo.lo], sd_tr[geo.hi])
        bracket = np.where(
            both,
            np.clip(cfg.pool_bracket_k * sd, cfg.pool_bracket_ppb, cfg.slope_bracket * 1e9) * 1e-9,
            cfg.slope_bracket,
        )
        fits, now = [fits1], None
        for k in self.pool.sizes:
            if k == 1:  # the pool's own hulls of this window, in its numbering: geo's points
                red, y = own
                t = _fleet_t(red.t_raw, red.src, tm.nic_h, tm.theta, tm.drift, tm.t_ref)
                e, up, tt, yy = now = (geo.edge, geo.upper, t, y)
            else:
                e, up, tt, yy = self._pooled_points(pts, geo, tm, gen, k)
            fits.append(fit_edges(e, up, tt, yy, geo.n, b_tr, bracket, cfg))
        held = fits.pop(1)  # this window alone, its slope held near the tracked one
        chosen, span = self.pool.choose(geo.codes, tm.t_ref, fits, b_prior, now)
        self._excess = _margin_excess([*fits, held], chosen, span, held)
        return chosen, span

    def _pooled_points(
        self, pts: HullPoints, geo: _EdgeGeometry, tm: _TimeMap, gen: int | None, span: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """A span's pooled hull points of this window's edges as (edge, upper, t, y), times
        in fleet time through the current models (older points of edges missing now are
        dropped): written so by the union's merge, or mapped from :meth:`HullPool.pooled`
        where the stored hulls are not grouped by pair."""
        n_nic = len(pts.nics)
        edges = WindowEdges(geo.key_codes, n_nic, tm.nic_h, tm.theta, tm.drift, tm.t_ref, tm.lat)
        got = self.pool.pooled_edges(pts, gen, span, edges)
        if got is not None:
            return got
        pool = self.pool.pooled(pts, gen, span)
        lo_nic, hi_nic = np.minimum(pool.src, pool.dst), np.maximum(pool.src, pool.dst)
        key = lo_nic * n_nic + hi_nic
        # a pair's points are together: one edge look-up per run of equal keys
        new = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if key.size else key
        run_edge = np.minimum(np.searchsorted(geo.key_codes, key[new]), geo.n - 1)
        edge = np.repeat(run_edge, np.diff(np.r_[new, key.size]))
        known = geo.key_codes[edge] == key
        t = _fleet_t(pool.t_raw, pool.src, tm.nic_h, tm.theta, tm.drift, tm.t_ref)
        upper, y = _edge_owd(pool.owd_raw, pool.src, pool.dst, tm.lat)
        if known.all():  # the usual case: no masked copies of ~1 M points
            return edge, upper, t, y
        return edge[known], upper[known], t[known], y[known]

    def _latency(self, pts: HullPoints) -> np.ndarray:
        """Per NIC of the window, its calibrated (egress, ingress) latency in ns."""
        if self._lat is None or self._lat[0] is not pts.nics:  # the last window's NICs: kept
            lat = np.array([self.nic_latency.get(n, (0.0, 0.0)) for n in pts.nics], np.float64)
            self._lat = (pts.nics, lat.reshape(-1, 2))
        return self._lat[1]

    def _prior(
        self, hosts: list[str], pts: HullPoints, src_h: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Offsets/drifts to map times with, at a reference time near the window's middle:
        the median over ``pts``, the window's pair hulls (:func:`shifted_median`). The pair
        hulls are what a shard's summary carries (``api/summaries.py``), so a fleet tier fed
        summaries takes the reference time a collector fed the raw windows takes, and their
        models agree (the median over every flow's hull point, which summaries drop, moved
        them apart by 8 ns in 10 windows at 256 hosts)."""
        raw_mid = int(shifted_median(pts.t_raw, src_h, np.zeros(len(hosts), np.int64)))
        theta = np.zeros(len(hosts))
        drift = np.zeros(len(hosts))
        known = np.zeros(len(hosts), bool)
        sd = np.full(len(hosts), np.inf)  # tracked drift standard error (ppb)
        # First guess of the reference time in fleet time: the median sender's view.
        t_ref = raw_mid
        for _ in range(2):
            th, dr, var_th, var_dr = self.tracker.predict_many(hosts, t_ref)
            now = var_th < 1e12  # NaN (not tracked): False
            theta, drift = np.where(now, th, theta), np.where(now, dr, drift)
            sd = np.where(now, np.sqrt(np.maximum(np.nan_to_num(var_dr), 0.0)), sd)
            known |= now
            t_ref = int(shifted_median(pts.t_raw, src_h, np.rint(theta).astype(np.int64)))
        self._drift_sd = sd
        return theta, drift, known, t_ref

    def _publish(self, rep: SolveReport, win: _Solved) -> list[ClockModel]:
        cfg, off, dft = self.cfg, win.off, win.dft
        on = off.weight > 0
        deg = np.bincount(win.lo[on], minlength=len(rep.hosts))
        deg += np.bincount(win.hi[on], minlength=len(rep.hosts))
        # A host whose value is agreed on by cfg.min_edges+ edges through the (robust) network
        # solve is measured, not an outlier, even when it jumped (a temperature drift step):
        # follow it at once instead of gating it out. (First hardware stamps only; software
        # stamps too since the 1024-host simulator showed gated stepped hosts at 200-260 ns
        # for a window. Scheduler delays do not move a host's hull floors on all its edges,
        # and a pairwise-only host, as in the two-host lab, is never trusted.)
        trusted = deg >= cfg.min_edges
        # How far apart in time each host's points are (its longest used edge): a partial
        # window (agents just started) pins neither slope nor floors as well as a full one.
        span = np.zeros(len(rep.hosts))
        np.maximum.at(span, win.lo[on], win.fits.span[on] * 1e-9)
        np.maximum.at(span, win.hi[on], win.fits.span[on] * 1e-9)
        floor = _host_noise(rep, win, on)
        evidence = cfg.evidence_k * _host_excess(rep, win, on)
        # every solved host's measurement, folded into the tracker at once
        on_h = off.solved
        d_ok = dft.solved[on_h]
        # Errors shared by all edges of a leaf pair (path asymmetries) do not average out
        # over a host's edges: its offset is never known better than one edge's scatter.
        s_th = np.maximum(np.hypot(off.sigma[on_h], off.scale), floor[on_h])
        short = span[on_h] < cfg.short_span_s
        # e.g. the first, partial window: its few points sit well above the floors (lab: 2-3x
        # the stated σ)
        s_th = np.where(short | ~d_ok, s_th * cfg.short_window_k, s_th)
        # A window's slope rests on hull points about half the span apart: its error is at
        # least ~2 offset errors over that, whatever the (maybe single) edge says.
        half = span[on_h] / 2
        base = np.where(short, np.maximum(half, 0.05), np.maximum(half, cfg.slope_base_s))
        s_d = np.where(d_ok, np.maximum(dft.sigma[on_h], 2.0 * s_th / base), cfg.drift_unknown_ppb)
        d = np.where(d_ok, dft.x[on_h], np.nan)  # NaN: slope unknown this window
        names = [h for h, ok in zip(rep.hosts, on_h.tolist(), strict=True) if ok]
        stepped = self.tracker.update_many(
            names, rep.t_ref_ns, off.x[on_h], s_th, d, s_d, trusted[on_h], evidence[on_h]
        )
        rep.steps = [h for h, st in zip(names, stepped.tolist(), strict=True) if st]
        return self.tracker.models(rep.hosts, rep.t_ref_ns, off.solved)

    def _coast(self, host: str) -> ClockModel:
        st = self.tracker.states.get(host)
        return self.tracker.model(host, st.t_ns, False) if st else ClockModel.identity(host)


def solve_clocks(
    windows: pa.Table, topology: Topology | None, prev: dict[str, ClockModel]
) -> list[ClockModel]:
    """Stateless ``SolveClocks``: the tracker is rebuilt from ``prev`` on every call."""
    return HuygensSync()(windows, topology, prev)


# ---- helpers --------------------------------------------------------------------------------
class _Solved(NamedTuple):
    """The parts of a report that a solved window always has (None only for an empty one)."""

    lo: np.ndarray  # host index per edge
    hi: np.ndarray
    fits: EdgeFits
    off: NetSolution
    dft: NetSolution

    @classmethod
    def of(cls, rep: SolveReport) -> _Solved:
        lo, hi, fits, off, dft = rep.edge_lo, rep.edge_hi, rep.fits, rep.offsets, rep.drifts
        if lo is None or hi is None or fits is None or off is None or dft is None:
            raise ValueError("the report of an empty window has no solve")
        return cls(lo, hi, fits, off, dft)


@dataclass
class _Network:
    """The per-window network solves (offsets, then drifts) over one edge geometry, sharing
    its kept edge and host sets across passes (:class:`ActiveSets`)."""

    n_hosts: int
    geo: _EdgeGeometry
    kind: str
    ref: int | None
    cfg: SyncConfig
    last: ActiveSets | None = None  # the last window's: kept where its geometry is this one's
    sets: ActiveSets = field(init=False)

    def __post_init__(self) -> None:
        args = (self.n_hosts, self.geo.lo, self.geo.hi, self.cfg.min_edges)
        self.sets = ActiveSets(*args) if self.last is None else self.last.of(*args)

    def solve(
        self,
        fits: EdgeFits,
        lenient: np.ndarray,
        theta: np.ndarray,
        drift: np.ndarray,
        known: np.ndarray,
    ) -> tuple[np.ndarray, NetSolution, NetSolution]:
        geo, cfg = self.geo, self.cfg
        w0, unstable = _edge_weights(fits, geo, self.n_hosts, lenient, cfg)
        off = solve_network(
            self.n_hosts, geo.lo, geo.hi, fits.a, w0, theta, known, cfg.floor_ns(self.kind),
            self.ref, cfg=cfg, active_sets=self.sets,
        )  # fmt: skip
        w_drift = np.where(fits.slope_ok, (off.weight > 0).astype(np.float64), 0.0)
        dft = solve_network(
            self.n_hosts, geo.lo, geo.hi, fits.b * 1e9, w_drift, drift, known,
            cfg.drift_floor_ppb(self.kind), self.ref, reject=False, cfg=cfg,
            active_sets=self.sets,
        )  # fmt: skip
        return unstable, off, dft


class _EdgeGeometry:
    """NIC-pair edges: index per point, direction, and the hosts at both ends."""

    def __init__(
        self,
        pts: HullPoints,
        nic_h: np.ndarray,
        nic_numbers: np.ndarray,
        last: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """``nic_numbers``: each NIC's number stable across windows (:mod:`.pooling`).
        ``last``: the last window's :attr:`runs`: a window whose pairs run in the same keys
        (the usual case) takes their edges from it instead of sorting ~130 k keys again."""
        self.upper = pts.src < pts.dst  # lo→hi points lie above the line (ids in sorted order)
        lo_nic = np.minimum(pts.src, pts.dst)
        hi_nic = np.maximum(pts.src, pts.dst)
        key = lo_nic * len(pts.nics) + hi_nic
        # the points come a directed pair at a time: one key per run of equal ones is sorted
        new = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if key.size else key
        run_key = key[new]
        if last is not None and np.array_equal(last[0], run_key):
            keys, inv = last[1], last[2]
        else:
            keys, inv = np.unique(run_key, return_inverse=True)
        self.runs = (run_key, keys, inv)  # what the next window's ``last`` is
        self.edge = np.repeat(inv, np.diff(np.r_[new, key.size]))
        self.n = keys.size
        lo, hi = keys // len(pts.nics), keys % len(pts.nics)
        self.nic_pair = np.stack([lo, hi], axis=1)  # into pts.nics (named only when asked)
        self.lo, self.hi = nic_h[lo], nic_h[hi]
        self.key_codes = keys  # sorted lo·N + hi codes, N = NICs in this window
        self.codes = nic_numbers[lo] << 32 | nic_numbers[hi]  # the same in every window


class _TimeMap(NamedTuple):
    """A solved window's mapping of raw points: per-host offset and drift at ``t_ref``
    (over the NICs' hosts ``nic_h``) and the NICs' calibrated latencies."""

    nic_h: np.ndarray
    theta: np.ndarray
    drift: np.ndarray
    t_ref: int
    lat: np.ndarray  # per NIC: (egress, ingress) ns


def _edge_owd(
    owd_raw: np.ndarray, src: np.ndarray, dst: np.ndarray, lat: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Raw one-way delays less the NICs' calibrated latencies, signed by the edge's sense
    (lower NIC -> higher NIC positive), and that sense (``upper``), in one pass
    (:func:`edge_delays`)."""
    i64 = partial(np.ascontiguousarray, dtype=np.int64)
    return edge_delays(i64(owd_raw), i64(src), i64(dst), lat)


def _fleet_t(
    t_raw: np.ndarray,
    src: np.ndarray,
    nic_h: np.ndarray,
    theta: np.ndarray,
    drift: np.ndarray,
    t_ref: int,
) -> np.ndarray:
    """Point times in fleet time relative to ``t_ref`` (float ns), through the models of the
    senders' hosts ``nic_h[src]`` (θ at t_ref, δ): fleet = raw − θ − δ·(fleet − t_ref), solved
    for fleet, in one pass (:func:`fleet_times`)."""
    i64, f64 = (partial(np.ascontiguousarray, dtype=d) for d in (np.int64, np.float64))
    return fleet_times(i64(t_raw), i64(src), i64(nic_h), f64(theta), f64(drift), int(t_ref))


def _edge_weights(
    fits: EdgeFits, geo: _EdgeGeometry, n_hosts: int, lenient: np.ndarray, cfg: SyncConfig
) -> tuple[np.ndarray, np.ndarray]:
    w0 = np.where(fits.usable, np.where(fits.soft & ~lenient, cfg.soft_weight, 1.0), 0.0)
    use = fits.usable & ~lenient
    n_all = np.bincount(geo.lo[use], minlength=n_hosts) + np.bincount(
        geo.hi[use], minlength=n_hosts
    )
    soft = use & fits.soft
    n_soft = np.bincount(geo.lo[soft], minlength=n_hosts) + np.bincount(
        geo.hi[soft], minlength=n_hosts
    )
    unstable = (n_all > 0) & (n_soft > cfg.unstable_fraction * n_all)
    w0 = np.where((unstable[geo.lo] | unstable[geo.hi]) & ~lenient, 0.0, w0)
    return w0, unstable


def _host_noise(rep: SolveReport, win: _Solved, on: np.ndarray) -> np.ndarray:
    """Per host, the offset noise its used edges' spans showed (:func:`.pooling._noise`),
    combined as independent edges (1/σ² = Σ 1/σ_e²); 0 where unknown."""
    n = len(rep.hosts)
    if rep.edge_noise is None:
        return np.zeros(n)
    known = on & (rep.edge_noise > 0)
    inv = np.where(known, 1.0 / np.maximum(rep.edge_noise, 1e-9) ** 2, 0.0)
    tot = np.bincount(win.lo, inv, n) + np.bincount(win.hi, inv, n)
    return np.where(tot > 0, 1.0 / np.sqrt(np.maximum(tot, 1e-30)), 0.0)


def _margin_excess(
    fits: list[EdgeFits], chosen: EdgeFits, span: np.ndarray, held: EdgeFits
) -> np.ndarray:
    """Per edge, the chosen fit's offset uncertainty from its own evidence (ns, ≥ 0).

    Margin: half the sum of the two directions' lowest delays above the line. The smallest
    margin any fit found is near the true floors, so the chosen fit's excess over it is how
    far its floors sit above them, and at the same slope its offset error is at most that.
    Slope: a single window's free slope rests on its few pure points; with one or two of
    them it tilts freely and its offset at the window's middle swings by µs at an ordinary
    margin (lab under load: a window 3 µs off with a margin 180 ns above the floor). Where
    the chosen fit is a single window, its offset's distance from the same window's fit with
    the slope held near the tracked drift counts too."""
    m = np.array([np.where(f.usable & ~f.soft & (f.margin > 0), f.margin, np.inf) for f in fits])
    ref = m.min(axis=0)
    ok = chosen.usable & ~chosen.soft & np.isfinite(ref)
    excess = np.where(ok, np.maximum(chosen.margin - ref, 0.0), 0.0)
    tilt = (span == 0) & held.usable & ~held.soft
    swing = np.where(tilt, np.abs(chosen.a - held.a), 0.0)
    return np.hypot(excess, swing)


def _host_excess(rep: SolveReport, win: _Solved, on: np.ndarray) -> np.ndarray:
    """Per host, its used edges' margin excesses combined as independent edges (1/σ² =
    Σ 1/σ_e²): one well-supported edge makes the host's window good; 0 where unknown."""
    n = len(rep.hosts)
    if rep.edge_excess is None or rep.edge_excess.size != win.lo.size:
        return np.zeros(n)
    inv = np.where(on, 1.0 / np.maximum(rep.edge_excess, 1e-3) ** 2, 0.0)
    tot = np.bincount(win.lo, inv, n) + np.bincount(win.hi, inv, n)
    return np.where(tot > 0, 1.0 / np.sqrt(np.maximum(tot, 1e-30)), 0.0)


def _host_list(
    pts: HullPoints,
    topology: Topology | None,
    prev: dict[str, ClockModel],
    tracker: DriftTracker,
) -> list[str]:
    hosts = set(pts.nic_host) | set(prev)
    hosts |= set(tracker.states)
    if topology is not None:
        hosts |= set(topology.hosts)
    return sorted(hosts)


def _ts_kind(windows: pa.Table) -> str:
    """Hardware only if every row's stamps are (no null): a window whose first row is not is
    software without a pass over its ~0.9 M rows (the distinct values took ~9 ms a round)."""
    col = windows["ts_source"]
    if not windows.num_rows or col.null_count or col[0].as_py() != TS_HARDWARE:
        return "software"
    return TS_HARDWARE if pc.all(pc.equal(col, TS_HARDWARE)).as_py() else "software"
