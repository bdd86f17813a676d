"""Longer effective windows: max-margin fits over the hulls of several windows, where the
clocks allow it.

Why: one 1 s window gives each direction of an edge ~100 pure probes, and the lowest of them
sits above that direction's true floor by a random amount. Half the difference of the two
directions' excesses is the edge's offset error, independent from window to window. A
max-margin line through the pooled hulls of the last ``k`` windows rests on the lowest points
of ``k`` windows in each direction, and its slope on points up to ``k`` s apart instead of
half a second.

When: pooling assumes the clock difference is a straight line over ``k`` windows. Real
oscillators wander (temperature, ageing) and a stepped clock breaks the line, so each
candidate span (``SyncConfig.pool_sizes``) keeps, per edge, its last line, and every new
window tests it: how far the window's points reach into the band between the two directions'
floors that the line kept clear (``_intrusion``). A straight clock leaves the band clear (a
point never sits below its direction's floor); a bent one shows as an intrusion. Queueing only
lifts points, so one-way load cannot fake a bend. A running mean of the squared intrusions
(weight ``score_weight``) ranks the spans, the longer first among equals: scores within
``bend_z`` standard errors of the lowest count as equal, the error shrinking with the number
of edges scored (``bend_scatter``/√n). Ties lean long, and a long span can be blind too: a
line resting on one window's unusually low points, carried by a slope a few ppb off, is
never crossed by new points. So among tied pooled spans one that predicts the next window
``score_veto`` times worse (rms) gives way to the shorter.

The span is chosen for the whole fleet, by the median over the edges, and used on every edge
where it is allowed (``_pick``): per-edge scores are too noisy to choose by, while the
clocks' wander that decides the best span is a property of the oscillators, alike across the
fleet. A pooled fit whose points overlap (a step inside the span) is never used.

Each span is also scored by how well it predicted the next single window (carried by one
common slope, the longest usable span's; each contribution capped at ``score_cap_ns``²).
That score qualifies a span (``min_scored`` predictions since its last run of surprises) and
gives the tracker each edge's noise, but does not rank the spans: under one-way load the
loaded direction's floor sits higher in every window alike, so each single window is off by
half the difference and predicts its successor, off the same way, better than a pooled span
that is right.

Only the max-margin geometry changes: each pooled direction is reduced to its hull first, so
the fit's cost grows with the hull size, not with ``k``.

Cost: the collector keeps the last ``max(pool_sizes) − 1`` windows' hulls per directed NIC
pair (a few points each, 24 B per point) and the hulls of their aligned blocks of 2-16
windows (``HullPool``); a span's pooled points are at most ``2·log2 k`` block hulls per pair,
so a round costs the same once the spans are full (``bench/sync_scale.py``). The runs behind
these choices: ``docs/notes/sync.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import NamedTuple

import numpy as np

from ._csr import hull_groups, pair_hulls, run_gaps, union_edge_points, union_hulls
from .config import SyncConfig
from .edgefit import EdgeFits, Points
from .purity import HullPoints
from .scratch import Scratch


@dataclass
class _Tracks:
    """Per tracked edge (rows sorted by ``code``, a stable number of the NIC pair), each
    span's last line and running scores; (edges, spans) arrays."""

    code: np.ndarray  # (E,) int64
    t_ref: np.ndarray  # (E,) fleet time the lines' intercepts are at
    a: np.ndarray  # intercept (ns)
    b: np.ndarray  # slope
    ok: np.ndarray  # the line was usable
    margin: np.ndarray  # the line's margin (ns)
    score: np.ndarray  # running mean squared prediction error
    scored: np.ndarray  # predictions scored so far
    bend: np.ndarray  # running mean squared intrusion (``_intrusion``)

    @classmethod
    def empty(cls, n_spans: int) -> _Tracks:
        f, i = np.zeros((0, n_spans)), np.zeros((0, n_spans), np.int64)
        z = np.zeros(0, np.int64)
        return cls(z, z.copy(), f, f.copy(), f.astype(bool), f.copy(), f.copy(), i, f.copy())

    def find(self, code: np.ndarray) -> tuple[_Tracks, np.ndarray]:
        """The track of each code (any where not tracked), and whether it is tracked."""
        if np.array_equal(self.code, code):  # the same edges as last window: the usual case
            return self, np.ones(code.size, bool)
        if not self.code.size:
            n, s = code.size, self.a.shape[1]
            blank = [np.zeros((n, s), getattr(self, f.name).dtype) for f in fields(self)[2:]]
            return _Tracks(code, np.zeros(n, np.int64), *blank), np.zeros(n, bool)
        row = np.minimum(np.searchsorted(self.code, code), self.code.size - 1)
        return self.take(row), self.code[row] == code

    def take(self, keep: np.ndarray) -> _Tracks:
        return _Tracks(*(getattr(self, f.name)[keep] for f in fields(self)))


@dataclass
class _Hulls:
    """Points reduced to each directed NIC pair's lower hull of (raw time, raw one-way
    delay), NICs by the pool's stable numbers."""

    src: np.ndarray
    dst: np.ndarray
    t_raw: np.ndarray
    owd_raw: np.ndarray

    @classmethod
    def of(cls, src: np.ndarray, dst: np.ndarray, t: np.ndarray, y: np.ndarray) -> _Hulls:
        """The hulls of the points, per directed pair, given points grouped by pair (any
        order of the groups and within them)."""
        code = src << 32 | dst
        new = np.flatnonzero(np.r_[True, code[1:] != code[:-1]]) if code.size else code
        off = np.r_[new, code.size].astype(np.int64)
        size, ht, hy = hull_groups(off, np.arange(code.size), t, y)
        pair = np.repeat(code[new], size)
        return cls(pair >> 32, pair & 0xFFFFFFFF, ht, hy)

    @classmethod
    def union(cls, parts: list[_Hulls], scratch: Scratch | None = None) -> _Hulls:
        """The hull of the parts' union per pair, pairs in ascending ``src << 32 | dst``.
        Parts so grouped (every block and window hull the pool keeps) are merged pair by
        pair in one pass (through ``scratch``'s buffers where given); others are sorted
        first."""
        n = 1 + max(max(int(h.src.max(initial=-1)), int(h.dst.max(initial=-1))) for h in parts)
        cols = [(h.src, h.dst, h.t_raw, h.owd_raw) for h in parts]
        out = scratch.of("block", (np.int64,) * 4) if scratch is not None else None
        got = union_hulls(cols, np.arange(n), out)
        if got is not None:  # the parts grouped in ascending pairs: one k-way merge
            return cls(*got)
        cat = [np.concatenate([getattr(h, f.name) for h in parts]) for f in fields(cls)]
        order = np.argsort(cat[0] << 32 | cat[1], kind="stable")
        return cls.of(*(c[order] for c in cat))


@dataclass
class Pooled:
    """The current window's points plus older windows' points (or only their hull per
    directed pair), in the current numbering."""

    src: np.ndarray  # NIC number of the sender (current window's NIC list)
    dst: np.ndarray
    t_raw: np.ndarray
    owd_raw: np.ndarray


_EDGE_POINT_TYPES = (np.int64, np.bool_, np.float64, np.float64)  # (edge, upper, t, y)


class WindowEdges(NamedTuple):
    """How a span's pooled points are written for the fits (:meth:`HullPool.pooled_edges`):
    the window's edges (sorted ``lo·n_nic + hi`` over its NICs) and each point's time map,
    per NIC its host (``nic_h``), per host its offset θ at ``t_ref`` and drift, per NIC its
    calibrated (egress, ingress) latency."""

    key_codes: np.ndarray
    n_nic: int
    nic_h: np.ndarray
    theta: np.ndarray
    drift: np.ndarray
    t_ref: int
    lat: np.ndarray


class HullPool:
    """The last windows' hulls and, per edge, each span's last line and score.

    Older windows are kept as the hulls of aligned blocks of 1, 2, 4, 8, 16 window
    generations (block ``(L, j)``: generations ``j·2^L`` to ``(j+1)·2^L − 1``), each built
    once from its two halves when first needed. The last ``k − 1`` generations then take at
    most ``2·log2 k`` blocks, so a span's pooled points per pair are a few hulls, not ``k``
    windows' points, and the cost of a round stops growing with the span once the spans
    are full. The hull of a union is the hull of the parts' hulls: the fits see the same
    hulls as from every window's raw points."""

    def __init__(self, cfg: SyncConfig, scratch: Scratch | None = None) -> None:
        self.cfg = cfg
        self.scratch = scratch or Scratch()
        self.sizes = sizes = cfg.pool_sizes
        self.blocks: dict[tuple[int, int], _Hulls | None] = {}  # (level, index) -> hulls
        self.newest: int | None = None  # generation of the newest remembered window
        self._nic_ids: dict[str, int] = {}  # NIC id -> number, stable across windows
        self._memo: tuple[HullPoints, HullPoints, _Hulls] | None = None
        self._ids: tuple[list[str], np.ndarray] | None = None  # nic_numbers' last
        self.tracks = _Tracks.empty(len(sizes))
        self.noise = np.zeros(0)  # per edge of the last choice: the chosen span's noise, ns
        self.best = 0  # the fleet's best-ranked span at the last choice (index)

    @property
    def has_history(self) -> bool:
        """Whether older windows are stored."""
        return self.newest is not None

    def pooled(self, pts: HullPoints, gen: int | None, span: int) -> Pooled:
        """The lower hull per directed pair of the current window's points and those of the
        stored windows of the last ``span`` generations (a missed window still counts),
        restricted to the current window's NICs. It is taken in raw coordinates: the fits
        map a pair's points by one affine map with positive scale, which keeps the hull."""
        parts, cur = self._span(pts, gen, span)
        if len(parts) > 1:
            # the merge maps the pairs to this window's NICs and leaves the others out as it
            # writes them: no mapped copies of ~1 M points (fresh memory, faulted in)
            got = union_hulls([(p.src, p.dst, p.t_raw, p.owd_raw) for p in parts], cur)
            if got is not None:
                return Pooled(*got)
        h = _Hulls.union(parts) if len(parts) > 1 else parts[0]
        src, dst = cur[h.src], cur[h.dst]
        keep = (src >= 0) & (dst >= 0)
        return Pooled(src[keep], dst[keep], h.t_raw[keep], h.owd_raw[keep])

    def pooled_edges(
        self, pts: HullPoints, gen: int | None, span: int, edges: WindowEdges
    ) -> Points | None:
        """:meth:`pooled` written straight as the fits read it, ``(edge, upper, t, y)``
        (:func:`union_edge_points`: pairs of no edge of ``edges`` left out, times in fleet
        time, delays signed by the edge's sense), in the merge's one pass without the GIL;
        None where the stored hulls are not grouped by pair (the caller maps
        :meth:`pooled`)."""
        parts, cur = self._span(pts, gen, span)
        cols = [(p.src, p.dst, p.t_raw, p.owd_raw) for p in parts]
        # a buffer per span: its points are read by its fit, before any other union runs
        return union_edge_points(cols, cur, *edges, self.scratch.of(span, _EDGE_POINT_TYPES))

    def _span(self, pts: HullPoints, gen: int | None, span: int) -> tuple[list[_Hulls], np.ndarray]:
        """A span's parts (the stored blocks' hulls, then this window's) and each stable NIC
        number's number in this window (-1: not in it)."""
        ids = self.nic_numbers(pts)
        parts = []
        if gen is not None and span > 1:
            parts = [h for h in self._range(gen - span + 1, gen - 1) if h is not None]
        parts.append(self._reduced(pts))
        cur = np.full(len(self._nic_ids), -1, np.int64)  # stable number -> current NIC number
        cur[ids] = np.arange(ids.size)
        return parts, cur

    def remember(self, pts: HullPoints, gen: int | None) -> None:
        if len(self.sizes) < 2 or gen is None:
            return
        self.blocks[(0, gen)] = self._reduced(pts)
        self.newest = gen
        oldest = gen - max(self.sizes) + 2  # the oldest generation a later span can reach
        for key in [k for k in self.blocks if (k[1] + 1 << k[0]) <= oldest]:
            del self.blocks[key]  # wholly older than any span

    def cut(self, pts: HullPoints, hosts: set[str]) -> None:
        """Hosts whose clock stepped, or most of whose edges overlapped, in this window: the
        stored points of their NICs' pairs (this window's included, once remembered) are
        dropped, so their spans start after it. Points from before a step lie on another
        line, so every span reaching back across it overlaps on those edges; left in, such a
        host took soft-margin pooled fits (``_pick``: no hard pooled fit) for as long as the
        fleet pooled and stayed unstable, unsolved, for windows while its own windows were
        clean (64 hosts, a 1 ms step: 3 windows at best; the fleet's span choice, moved by
        any change in its scores, decided when it came back)."""
        ids = self.nic_numbers(pts)
        gone = ids[[i for i, h in enumerate(pts.nic_host) if h in hosts]]
        if not gone.size:
            return
        for key, h in self.blocks.items():
            if h is not None:
                keep = ~(np.isin(h.src, gone) | np.isin(h.dst, gone))
                self.blocks[key] = _Hulls(h.src[keep], h.dst[keep], h.t_raw[keep], h.owd_raw[keep])

    def _range(self, lo: int, hi: int) -> list[_Hulls | None]:
        """Hulls covering the generations lo..hi: the largest aligned blocks inside."""
        out = []
        while lo <= hi:
            level = 0
            while lo % (2 << level) == 0 and lo + (2 << level) - 1 <= hi:
                level += 1
            out.append(self._block(level, lo >> level))
            lo += 1 << level
        return out

    def _block(self, level: int, j: int) -> _Hulls | None:
        key = (level, j)
        if key not in self.blocks:  # a missed window: None; a block: its halves' union
            halves = [] if level == 0 else [self._block(level - 1, 2 * j + i) for i in (0, 1)]
            parts = [h for h in halves if h is not None]
            self.blocks[key] = _Hulls.union(parts, self.scratch) if parts else None
        return self.blocks[key]

    def window_hulls(self, pts: HullPoints) -> HullPoints:
        """``pts`` reduced to each directed NIC pair's lower hull, computed once per window
        (the window's NIC numbering). The fits map a sender's raw times to fleet time by an
        affine map with positive scale, the same for all points of a pair, and subtract a
        constant NIC latency from its delays: neither changes which points are on the hull,
        so the fits see the same hulls from a few points per pair and window instead of
        every path's hull points (~7 rows per pair at 16 peers)."""
        return self._hulls(pts)[0]

    def _reduced(self, pts: HullPoints) -> _Hulls:
        """:meth:`window_hulls` with the pool's stable NIC numbers."""
        return self._hulls(pts)[1]

    def _hulls(self, pts: HullPoints) -> tuple[HullPoints, _Hulls]:
        if self._memo is None or self._memo[0] is not pts:
            if pts.reduced:  # read as each pair's hull already (``hull_points(reduce=True)``)
                h, red = _Hulls(pts.src, pts.dst, pts.t_raw, pts.owd_raw), pts
            else:
                h = _pair_hulls(pts)
                red = replace(pts, src=h.src, dst=h.dst, t_raw=h.t_raw, owd_raw=h.owd_raw)
            ids = self.nic_numbers(pts)
            stable = _Hulls(ids[h.src], ids[h.dst], h.t_raw, h.owd_raw)
            code = stable.src << 32 | stable.dst
            if (code[1:] < code[:-1]).any():  # NICs came or went: stable numbers out of order
                order = np.argsort(code, kind="stable")
                stable = _Hulls(*(getattr(stable, f.name)[order] for f in fields(_Hulls)))
            self._memo = (pts, red, stable)
        return self._memo[1], self._memo[2]

    def choose(
        self,
        codes: np.ndarray,
        t_ref: int,
        fits: list[EdgeFits],
        slope: np.ndarray,
        now: tuple[np.ndarray, ...] | None = None,
    ) -> tuple[EdgeFits, np.ndarray]:
        """Score every span on this window, then pick one fit per edge; returns the chosen
        fits and the span index per edge. ``codes``: each edge's stable number
        (:meth:`edge_codes`). ``fits[0]`` is the single-window fit; ``slope`` (per edge,
        ns/ns; the current network drift difference) carries the spans' last intercepts to
        this window where no span longer than one window is usable now."""
        cfg, one = self.cfg, fits[0]
        ok = np.array([f.usable & ~f.soft for f in fits])  # (spans, edges)
        a = np.array([f.a for f in fits])
        b = np.array([f.b for f in fits])
        margin = np.array([f.margin for f in fits])
        # The carrying slope: the longest usable span's (a single window's slope is off by
        # ~100 ppb with software stamps, 100 ns over the 1 s carried: that noise, common to
        # all spans, would drown the differences between them).
        longest = ok.shape[0] - 1 - np.argmax(ok[::-1], axis=0)
        carry = np.where(ok.any(axis=0), b[longest, np.arange(codes.size)], slope)
        old, have = self.tracks.find(codes)
        have &= t_ref - old.t_ref <= cfg.pool_stale_ns  # gone too long: start over
        score = np.where(have, old.score.T, 0.0)
        scored = np.where(have, old.scored.T, 0)
        bend = np.where(have, old.bend.T, np.nan)
        _score(score, scored, old, have & ok[0], one.a, t_ref, carry, cfg)
        if now is not None:
            _bend(bend, _intrusion(have, old, now, t_ref, carry), cfg.score_weight)
        usable = np.array([f.usable for f in fits])
        choice, self.best = _pick(have, score, scored, bend, ok, usable, self.best, cfg)
        self.noise = _noise(have, score, scored, choice, cfg.min_scored)
        self._follow(codes, t_ref, (a, b, ok, margin, score, scored, bend))
        return _select(fits, choice), choice

    def _follow(self, codes: np.ndarray, t_ref: int, state: tuple[np.ndarray, ...]) -> None:
        """This window's lines and scores replace the edges' tracks; tracks of edges not in
        this window are kept until they are stale (they would start over anyway)."""
        tr = self.tracks
        n = codes.size
        new = _Tracks(codes, np.full(n, t_ref, np.int64), *(x.T.copy() for x in state))
        if np.array_equal(tr.code, codes):  # the same edges (sorted): each track replaced
            self.tracks = new
            return
        keep = ~np.isin(tr.code, codes) & (t_ref - tr.t_ref <= self.cfg.pool_stale_ns)
        both = [tr.take(keep), new]
        merged = _Tracks(*(np.concatenate([getattr(t, f.name) for t in both])
                           for f in fields(_Tracks)))  # fmt: skip
        self.tracks = merged.take(np.argsort(merged.code, kind="stable"))

    def forget(self, codes: np.ndarray) -> None:
        """Edges of a host whose clock stepped: their spans start over."""
        self.tracks = self.tracks.take(~np.isin(self.tracks.code, codes))

    def nic_numbers(self, pts: HullPoints) -> np.ndarray:
        """Stable numbers of the window's NICs: the same NIC has the same number in every
        window (edge numbers across windows are built from them). Kept for the last id list
        asked: a window naming the NICs the last one named has the same list
        (:meth:`.purity.KnownNics.named`)."""
        if self._ids is not None and self._ids[0] is pts.nics:
            return self._ids[1]
        reg = self._nic_ids
        ids = np.array([reg.setdefault(n, len(reg)) for n in pts.nics], np.int64)
        self._ids = (pts.nics, ids)
        return ids


def _pair_hulls(pts: HullPoints) -> _Hulls:
    """Each directed pair's lower hull of the window's points, in one pass where the points
    come grouped by pair (agents and the simulator send a pair's rows together), else after
    a stable sort by pair."""
    n_nic = max(len(pts.nics), 1)
    got = pair_hulls(pts.src, pts.dst, pts.t_raw, pts.owd_raw, n_nic)
    if got is not None:
        return _Hulls(*got)
    order = np.argsort(pts.src * n_nic + pts.dst, kind="stable")
    return _Hulls.of(*(a[order] for a in (pts.src, pts.dst, pts.t_raw, pts.owd_raw)))


def _score(
    score: np.ndarray,
    scored: np.ndarray,
    old: _Tracks,
    upd_edge: np.ndarray,
    measured: np.ndarray,
    t_ref: int,
    slope: np.ndarray,
    cfg: SyncConfig,
) -> None:
    """Fold this window's single fit (``measured``) into the (spans, edges) prediction scores
    of the edges in ``upd_edge``, in place."""
    # Every span's intercept is carried by the same slope: what is scored is how good each
    # span's value at the end of its span was, the quantity the solve uses. (Each span's own
    # slope would charge a single window for its slope noise, ~100 ppb = 100 ns over 1 s,
    # which its in-window value does not have: long spans then won where they bend.)
    pred = old.a.T + slope * (t_ref - old.t_ref).astype(np.float64)
    err2 = np.minimum((measured - pred) ** 2, cfg.score_cap_ns**2)
    upd = old.ok.T & upd_edge
    # A surprise (an error beyond cfg.surprise_k of the span's rms) from every span, the
    # previous single window included: this window's single fit is the wild one, not the
    # spans (a bend leaves the previous window's line close and the long spans off; two-host
    # lab under load: windows 6-8 µs off, in bursts). Nothing is scored or counted.
    eligible = upd & (scored >= cfg.min_scored)
    surprise = eligible & (err2 > cfg.surprise_k**2 * score)
    wild = (eligible.sum(axis=0) >= 2) & (surprise == eligible).all(axis=0)
    upd &= ~wild
    w = cfg.score_weight
    score[...] = np.where(upd, np.where(scored == 0, err2, (1 - w) * score + w * err2), score)
    scored += upd


def _intrusion(
    have: np.ndarray,
    old: _Tracks,
    now: tuple[np.ndarray, ...],
    t_ref: int,
    carry: np.ndarray,
) -> np.ndarray:
    """Per span and edge, how far this window's points reach into the band the span's last
    line kept clear (ns, ≥ 0; NaN where not measurable). A straight clock leaves the band
    clear: a new point sits above its direction's floor, never below it. A bend of Δ shows as
    Δ minus that window's excess on the side it bends towards. Unlike a prediction of the next
    single window, this is not biased by the single window's own error: when the two
    directions' floors sit unequally high in a window (one direction loaded), its fit is off
    by half the difference, every window alike, and a span scored against it looks worse the
    better it is (lab, flood one way: single windows −200 ns, 32-window spans −20 ns)."""
    edge, upper, t, y = now
    n_spans, n_e = old.a.shape[1], have.size
    out = np.full((n_spans, n_e), np.nan)
    if not have.any() or edge.size == 0:
        return out
    good = (old.ok & (old.margin > 0)).T & have
    some = good.any(axis=0)
    # one band for all spans: the narrowest any span found, near the true floors (a span's
    # own margin would charge a single window for its floors sitting high)
    m0 = np.where(some, np.where(good, old.margin.T, np.inf).min(axis=0), 0.0)
    a0 = np.where(some, old.a.T, 0.0)
    dt = np.where(some, (t_ref - old.t_ref).astype(np.float64), 0.0)
    line0 = a0 + carry * dt  # each span's line at t = 0 of this window
    # Edges not tracked are computed too (their line is 0) and left out below (not ``good``).
    lo_gap = np.full((n_spans, n_e), np.inf)  # upper points: distance above the line
    hi_gap = np.full((n_spans, n_e), np.inf)  # lower points: distance below it
    run_gaps(
        np.ascontiguousarray(edge, np.int64), np.ascontiguousarray(upper, bool).view(np.uint8),
        np.ascontiguousarray(t, np.float64), np.ascontiguousarray(y, np.float64),
        np.ascontiguousarray(line0), np.ascontiguousarray(carry, np.float64), lo_gap, hi_gap,
    )  # fmt: skip
    worst = np.maximum(m0 - lo_gap, m0 - hi_gap)  # -inf where a side is empty
    seen = np.isfinite(lo_gap) | np.isfinite(hi_gap)
    return np.where(good & seen, np.maximum(worst, 0.0), np.nan)


def _bend(bend: np.ndarray, intrusion: np.ndarray, w: float) -> None:
    """Running mean square of each span's intrusions (weight ``w``), in place."""
    x2 = intrusion**2
    fresh = np.isfinite(x2) & ~np.isfinite(bend)
    upd = np.isfinite(x2) & np.isfinite(bend)
    bend[...] = np.where(fresh, x2, np.where(upd, (1 - w) * bend + w * x2, bend))


def _pick(
    have: np.ndarray,
    score_: np.ndarray,
    scored_: np.ndarray,
    bend: np.ndarray,
    ok: np.ndarray,
    usable: np.ndarray,
    prev_best: int,
    cfg: SyncConfig,
) -> tuple[np.ndarray, int]:
    """Spans ranked for the whole fleet by their median score over the edges; each edge
    uses the best-ranked span allowed there (scored ``cfg.min_scored`` times since its last
    surprise, its fit usable now), the single window if none is. Per-edge scores are too
    noisy to choose by (an EWMA of ~9 squared errors scatters by about half its value, more
    than what separates the spans), while the clocks' wander that decides the best span is a
    property of the oscillators, alike across the fleet; a bent edge (a drift step) is caught
    per edge by its surprise reset."""
    n_sp = ok.shape[0]
    score = np.where(have, score_, np.inf)
    scored = np.where(have, scored_, 0)
    allowed = ok & (scored >= cfg.min_scored)
    allowed[0] = True
    med = np.array([np.median(score[k, allowed[k]]) if allowed[k].any() else np.inf
                    for k in range(n_sp)])  # fmt: skip
    med = _rank_by_bend(bend, allowed, med, cfg)
    # Per edge, the allowed span with the best fleet-wide median (the fleet's best span where
    # it is allowed, else the next best, e.g. a shorter span while a long one re-qualifies).
    rank = np.where(allowed & ok, med[:, None], np.inf)
    fallback = np.where(ok[0], 0, np.argmax(ok, axis=0))  # no single-window fit: any usable
    choice = np.where(np.isfinite(rank).any(axis=0), np.argmin(rank, axis=0), fallback)
    # Where the fleet pools, an edge whose pooled spans are all re-qualifying still pools (its
    # shortest usable span) rather than fall back to one window: single windows under load
    # were off by 6-36 µs (two lab hosts, one or two pure pairs), a pooled hull ignores them.
    # With no hard pooled fit (one point below a floor makes 32 windows' hulls overlap), the
    # longest soft-margin pooled fit (ν-SVM, a fifth of the points may violate) still beats
    # one window there.
    # The fleet's preference; while every pooled span is re-qualifying (no median), the last
    # one holds (a burst of wild windows takes all spans out at once on a two-host lab).
    best = int(np.argmin(med)) if np.isfinite(med[1:]).any() else prev_best
    if best > 0 and n_sp > 1:
        pooled_ok = ok[1:].any(axis=0)
        shortest = 1 + np.argmax(ok[1:], axis=0)
        choice = np.where((choice == 0) & pooled_ok, shortest, choice)
        soft = usable[1:].any(axis=0) & ~pooled_ok
        longest = n_sp - 1 - np.argmax(usable[::-1][:-1], axis=0)
        choice = np.where((choice == 0) & soft, longest, choice)
    return choice, best


def _rank_by_bend(
    bend: np.ndarray, allowed: np.ndarray, med: np.ndarray, cfg: SyncConfig
) -> np.ndarray:
    """Fleet-wide rank value per span from the median intrusion score over the edges where
    it is allowed (see ``_intrusion``; inf for a span scored nowhere), a longer span ranking
    first among equals; ``med`` (prediction scores) until single windows have one."""
    n_sp = allowed.shape[0]
    use = allowed & np.isfinite(bend)
    if not use[0].any():
        return med
    mb = np.array([np.median(bend[k, use[k]]) if use[k].any() else np.inf
                   for k in range(n_sp)])  # fmt: skip
    # A difference the scores' own scatter explains is no difference: of the spans within
    # cfg.bend_z standard errors of the straightest, the longest ranks first.
    se = cfg.bend_scatter * mb / np.sqrt(np.maximum(use.sum(axis=1), 1))
    best = int(np.argmin(mb))
    near = mb - mb[best] <= cfg.bend_z * np.hypot(se, se[best])
    tied = np.flatnonzero(np.isfinite(mb) & near)
    rank = mb - 1e-9 * np.arange(n_sp)
    # Between tied pooled spans the prediction scores are a fair judge (both are scored
    # against the same single windows, whose one-way-load bias they share): a longer span
    # that predicts clearly worse rests on old extreme points carried by a slope a few ppb
    # off, which no new point can cross.
    pooled = tied[tied > 0]
    if pooled.size > 1:
        pooled = pooled[med[pooled] <= cfg.score_veto**2 * med[pooled].min()]
    rank[pooled[-1] if pooled.size else tied[-1]] = -1.0
    return rank


def _noise(
    have: np.ndarray, score: np.ndarray, scored: np.ndarray, choice: np.ndarray, min_scored: int
) -> np.ndarray:
    """Each edge's offset noise with the chosen span, from its prediction score: the score
    is the mean square of (span's carried value − next single window), about σ_span² + σ_1²,
    so √(score/2) is σ_1 for the single window and an upper bound for longer spans (0 where
    not yet scored). The network solve cannot see it on a pairwise-only edge (no residual):
    the tracker needs it, or a switch from a smooth 32-window span to a single window (σ 150
    ns in the lab under load) reads as a clock change against a noise estimate learnt on the
    smooth span."""
    e = np.arange(choice.size)
    known = have & (scored[choice, e] >= min_scored)
    return np.where(known, np.sqrt(score[choice, e] / 2.0), 0.0)


def _select(fits: list[EdgeFits], choice: np.ndarray) -> EdgeFits:
    cols = {}
    for name in ("a", "b", "margin", "n_up", "n_low", "slope_ok", "soft", "usable", "span"):
        stack = np.array([getattr(f, name) for f in fits])
        cols[name] = stack[choice, np.arange(choice.size)]
    return EdgeFits(**cols)
