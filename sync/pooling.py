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

Cost: the collector keeps the last ``max(pool_sizes) − 1`` windows' hull points (about 32 B
per point, a few points per flow and window): ~25 MB per window at 1024 hosts × 8 NICs × 16
peers, where a smaller largest span (``SyncConfig(pool_sizes=(1, 8))``) is the sensible
setting. The runs behind these choices: ``docs/notes/sync.md``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from fleetlens.hull import lower_hull_rows
from fleetlens.summary import pad_rows

from .config import SyncConfig
from .edgefit import EdgeFits
from .purity import HullPoints


@dataclass
class _EdgeTrack:
    t_ref: int  # fleet time the lines' intercepts are at
    a: np.ndarray  # per span: intercept (ns)
    b: np.ndarray  # per span: slope
    ok: np.ndarray  # per span: the line was usable
    margin: np.ndarray  # per span: the line's margin (ns)
    score: np.ndarray  # per span: running mean squared prediction error
    scored: np.ndarray  # per span: predictions scored so far
    pending: np.ndarray  # per span: surprises in a row so far
    bend: np.ndarray  # per span: running mean squared intrusion (``_intrusion``)

    @classmethod
    def follow(
        cls,
        old: _EdgeTrack | None,
        t_ref: int,
        a: np.ndarray,
        b: np.ndarray,
        ok: np.ndarray,
        margin: np.ndarray,
    ) -> _EdgeTrack:
        """This window's lines, with the running scores of the edge's last track (``old``), or
        fresh ones for an edge not tracked."""
        if old is not None:
            return cls(t_ref, a, b, ok, margin, old.score, old.scored, old.pending, old.bend)
        n = a.size
        zeros = np.zeros(n, np.int64)
        return cls(t_ref, a, b, ok, margin, np.zeros(n), zeros, zeros.copy(), np.full(n, np.nan))


@dataclass
class Pooled:
    """The current window's points plus older windows' points, in the current numbering."""

    src: np.ndarray  # NIC number of the sender (current window's NIC list)
    dst: np.ndarray
    t_raw: np.ndarray
    owd_raw: np.ndarray
    age: np.ndarray  # windows before the current one (0: current)


class HullPool:
    """The last windows' hull points and, per edge, each span's last line and score."""

    def __init__(self, cfg: SyncConfig) -> None:
        self.cfg = cfg
        self.sizes = sizes = cfg.pool_sizes
        self.history: deque[tuple[int | None, HullPoints]] = deque(maxlen=max(sizes) - 1)
        self.tracks: dict[str, _EdgeTrack] = {}
        self.noise = np.zeros(0)  # per edge of the last choice: the chosen span's noise, ns
        self.best = 0  # the fleet's best-ranked span at the last choice (index)

    def pooled(self, pts: HullPoints, gen: int | None) -> Pooled:
        """The stored windows' points whose NICs occur in the current window; a window's age
        is counted in window generations (a missed window still counts)."""
        pos = {n: i for i, n in enumerate(pts.nics)}
        parts = [(pts.src, pts.dst, pts.t_raw, pts.owd_raw, 0)]
        for k, (g, old) in enumerate(reversed(self.history), start=1):
            age = gen - g if gen is not None and g is not None else k
            if not 0 < age < max(self.sizes):
                continue
            remap = np.array([pos.get(n, -1) for n in old.nics], np.int64)
            s, d = remap[old.src], remap[old.dst]
            keep = (s >= 0) & (d >= 0)
            parts.append((s[keep], d[keep], old.t_raw[keep], old.owd_raw[keep], age))
        src, dst, t_raw, owd_raw = (np.concatenate([p[i] for p in parts]) for i in range(4))
        ages = np.concatenate([np.full(p[0].size, p[4], np.int64) for p in parts])
        return Pooled(src, dst, t_raw, owd_raw, ages)

    def remember(self, pts: HullPoints, gen: int | None) -> None:
        if len(self.sizes) > 1:
            self.history.append((gen, pts))

    def choose(
        self,
        keys: list[str],
        t_ref: int,
        fits: list[EdgeFits],
        slope: np.ndarray,
        now: tuple[np.ndarray, ...] | None = None,
    ) -> tuple[EdgeFits, np.ndarray]:
        """Score every span on this window, then pick one fit per edge; returns the chosen
        fits and the span index per edge. ``fits[0]`` is the single-window fit; ``slope``
        (per edge, ns/ns; the current network drift difference) carries the spans' last
        intercepts to this window where no span longer than one window is usable now."""
        one = fits[0]
        ok = np.array([f.usable & ~f.soft for f in fits])  # (spans, edges)
        a = np.array([f.a for f in fits])
        b = np.array([f.b for f in fits])
        margin = np.array([f.margin for f in fits])
        # The carrying slope: the longest usable span's (a single window's slope is off by
        # ~100 ppb with software stamps, 100 ns over the 1 s carried: that noise, common to
        # all spans, would drown the differences between them).
        longest = ok.shape[0] - 1 - np.argmax(ok[::-1], axis=0)
        carry = np.where(ok.any(axis=0), b[longest, np.arange(len(keys))], slope)
        cfg, tracks = self.cfg, []
        for e, key in enumerate(keys):
            tr = self.tracks.get(key)
            if tr is not None and t_ref - tr.t_ref > cfg.pool_stale_ns:  # gone: start over
                tr = None
            if tr is not None and ok[0, e]:
                _score(tr, one.a[e], t_ref, float(carry[e]), cfg)
            tracks.append(tr)
        if now is not None:
            _bend(tracks, _intrusion(tracks, now, t_ref, carry, ok.shape[0]), cfg.score_weight)
        usable = np.array([f.usable for f in fits])
        choice, self.best = _pick(tracks, ok, usable, self.best, cfg)
        self.noise = _noise(tracks, choice, cfg.min_scored)
        for e, (key, tr) in enumerate(zip(keys, tracks, strict=True)):
            self.tracks[key] = _EdgeTrack.follow(
                tr, t_ref, a[:, e].copy(), b[:, e].copy(), ok[:, e].copy(), margin[:, e].copy()
            )
        return _select(fits, choice), choice

    def forget(self, keys: list[str]) -> None:
        """Edges of a host whose clock stepped: their spans start over."""
        for k in keys:
            self.tracks.pop(k, None)


def _score(tr: _EdgeTrack, measured: float, t_ref: int, slope: float, cfg: SyncConfig) -> None:
    # Every span's intercept is carried by the same slope: what is scored is how good each
    # span's value at the end of its span was, the quantity the solve uses. (Each span's own
    # slope would charge a single window for its slope noise, ~100 ppb = 100 ns over 1 s,
    # which its in-window value does not have: long spans then won where they bend.)
    pred = tr.a + slope * float(t_ref - tr.t_ref)
    err2 = np.minimum((measured - pred) ** 2, cfg.score_cap_ns**2)
    upd = tr.ok
    # cfg.surprise_run surprises in a row (the clocks bent: a drift jump) take a span out; it
    # must predict cfg.min_scored windows again before it is used. Fewer are more often the
    # single-window reference being wild (two-host lab under load: windows 6-8 µs off, and
    # bursts of them, which took the 32-window span out and left 8- or 1-window fits in use,
    # 100-400 ns off, where the 32-window one stayed within ~20 ns): they are not scored at
    # all. A clock step is handled apart (``forget``).
    surprise = upd & (tr.scored >= cfg.min_scored) & (err2 > cfg.surprise_k**2 * tr.score)
    eligible = upd & (tr.scored >= cfg.min_scored)
    if eligible.sum() >= 2 and surprise[eligible].all():
        # Every span, the previous single window included, misses it: this window's single
        # fit is the wild one, not the spans (a bend leaves the previous window's line close
        # and the long spans off). Nothing is scored or counted.
        return
    again = tr.pending >= cfg.surprise_run
    tr.pending = np.where(again, 0, tr.pending)
    upd = upd & (tr.pending == 0)
    tr.scored = np.where(again, 0, tr.scored)
    w = cfg.score_weight
    tr.score = np.where(upd, (1 - w) * tr.score + w * err2, tr.score)
    tr.score = np.where(upd & (tr.scored == 0), err2, tr.score)
    tr.scored = tr.scored + upd


def _intrusion(
    tracks: list[_EdgeTrack | None],
    now: tuple[np.ndarray, ...],
    t_ref: int,
    carry: np.ndarray,
    n_spans: int,
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
    n_e = len(tracks)
    have = np.array([tr is not None for tr in tracks], bool)
    out = np.full((n_spans, n_e), np.nan)
    if not have.any() or edge.size == 0:
        return out
    a0 = np.zeros((n_spans, n_e))
    m0 = np.zeros((n_spans, n_e))
    ok0 = np.zeros((n_spans, n_e), bool)
    dt = np.zeros(n_e)
    for i, tr in _present(tracks):
        good = tr.ok & (tr.margin > 0)
        if not good.any():
            continue
        # one band for all spans: the narrowest any span found, near the true floors (a
        # span's own margin would charge a single window for its floors sitting high)
        a0[:, i], m0[:, i], ok0[:, i] = tr.a, tr.margin[good].min(), good
        dt[i] = float(t_ref - tr.t_ref)
    line0 = a0 + carry * dt  # each span's line at t = 0 of this window
    use = have[edge]
    e, up, tt, yy = edge[use], upper[use], t[use], y[use]
    for k in range(n_spans):
        r = yy - (line0[k, e] + carry[e] * tt)
        lo_gap = np.full(n_e, np.inf)
        np.minimum.at(lo_gap, e[up], r[up])  # upper points: distance above the line
        hi_gap = np.full(n_e, np.inf)
        np.minimum.at(hi_gap, e[~up], -r[~up])  # lower points: distance below it
        worst = np.maximum(m0[k] - lo_gap, m0[k] - hi_gap)  # -inf where a side is empty
        seen = np.isfinite(lo_gap) | np.isfinite(hi_gap)
        out[k] = np.where(ok0[k] & seen, np.maximum(worst, 0.0), np.nan)
    return out


def _present(tracks: list[_EdgeTrack | None]) -> list[tuple[int, _EdgeTrack]]:
    """The edges that have a track, with their index."""
    return [(i, tr) for i, tr in enumerate(tracks) if tr is not None]


def _bend(tracks: list[_EdgeTrack | None], intrusion: np.ndarray, w: float) -> None:
    """Running mean square of each span's intrusions (weight ``w``)."""
    for e, tr in enumerate(tracks):
        if tr is None:
            continue
        x = intrusion[:, e]
        fresh = np.isfinite(x) & ~np.isfinite(tr.bend)
        upd = np.isfinite(x) & np.isfinite(tr.bend)
        tr.bend = np.where(fresh, x**2, tr.bend)
        tr.bend = np.where(upd, (1 - w) * tr.bend + w * x**2, tr.bend)


def _pick(
    tracks: list[_EdgeTrack | None],
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
    n_sp, n_e = ok.shape
    score = np.full((n_sp, n_e), np.inf)
    scored = np.zeros((n_sp, n_e), np.int64)
    present = _present(tracks)
    if present:
        idx = [i for i, _ in present]
        score[:, idx] = np.array([tr.score for _, tr in present]).T
        scored[:, idx] = np.array([tr.scored for _, tr in present]).T
    allowed = ok & (scored >= cfg.min_scored)
    allowed[0] = True
    med = np.array([np.median(score[k, allowed[k]]) if allowed[k].any() else np.inf
                    for k in range(n_sp)])  # fmt: skip
    med = _rank_by_bend(tracks, allowed, med, cfg)
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
    tracks: list[_EdgeTrack | None], allowed: np.ndarray, med: np.ndarray, cfg: SyncConfig
) -> np.ndarray:
    """Fleet-wide rank value per span from the median intrusion score over the edges where
    it is allowed (see ``_intrusion``; inf for a span scored nowhere), a longer span ranking
    first among equals; ``med`` (prediction scores) until single windows have one."""
    n_sp, n_e = allowed.shape
    bend = np.full((n_sp, n_e), np.nan)
    for i, tr in enumerate(tracks):
        if tr is not None:
            bend[:, i] = tr.bend
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


def _noise(tracks: list[_EdgeTrack | None], choice: np.ndarray, min_scored: int) -> np.ndarray:
    """Each edge's offset noise with the chosen span, from its prediction score: the score
    is the mean square of (span's carried value − next single window), about σ_span² + σ_1²,
    so √(score/2) is σ_1 for the single window and an upper bound for longer spans (0 where
    not yet scored). The network solve cannot see it on a pairwise-only edge (no residual):
    the tracker needs it, or a switch from a smooth 32-window span to a single window (σ 150
    ns in the lab under load) reads as a clock change against a noise estimate learnt on the
    smooth span."""
    out = np.zeros(choice.size)
    for e, tr in enumerate(tracks):
        k = int(choice[e])
        if tr is not None and tr.scored[k] >= min_scored:
            out[e] = np.sqrt(tr.score[k] / 2.0)
    return out


def _select(fits: list[EdgeFits], choice: np.ndarray) -> EdgeFits:
    cols = {}
    for name in ("a", "b", "margin", "n_up", "n_low", "slope_ok", "soft", "usable", "span"):
        stack = np.array([getattr(f, name) for f in fits])
        cols[name] = stack[choice, np.arange(choice.size)]
    return EdgeFits(**cols)


def hull_reduce(
    edge: np.ndarray, upper: np.ndarray, t: np.ndarray, y: np.ndarray, n_edges: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Keep only the points the max-margin fit can rest on: the lower hull of each edge's
    upper (lo→hi) points and the upper hull of its lower points. ``t`` is rounded to ns."""
    row = edge * 2 + (~upper)
    tt = np.rint(t).astype(np.int64)
    yy = np.rint(np.where(upper, y, -y)).astype(np.int64)  # upper hull of y = −(lower of −y)
    rows = 2 * n_edges
    mask, (tm, ym) = pad_rows(row, rows, tt, yy)
    size, ht, hy = lower_hull_rows(tm, ym, mask)
    keep = np.arange(ht.shape[1]) < size[:, None]
    r_idx = np.repeat(np.arange(rows), size)
    up = r_idx % 2 == 0
    hy_f = hy[keep].astype(np.float64)
    return r_idx // 2, up, ht[keep].astype(np.float64), np.where(up, hy_f, -hy_f)
