"""Per-edge max-margin fit: the clock-difference line between two hosts from their hulls.

For a NIC pair (lo, hi) the one-way delays lo→hi are ``owd = d + Δ(t)`` and hi→lo are
``owd' = d' − Δ(t)``, with ``Δ = θ_hi − θ_lo`` (θ = raw − fleet) and delays ``d, d' > 0``. So
the lo→hi points lie above the line ``Δ(t) = a + b·t`` and the sign-flipped hi→lo points
below it; with symmetric minimum delays the line is midway. The max-margin separator (the
hard-margin SVM of Huygens) depends only on the lower hull of the upper set and the upper hull
of the lower set, which is what the agents send.

How it is solved, exactly, all edges in one call (points grouped per edge once, one pass per
edge in Cython, :mod:`._csr`): for a fixed slope ``b`` the best intercept and margin are
``F(b) = min_up (y − b·t)``, ``G(b) = max_low (y − b·t)``, ``margin = (F − G)/2``,
``a = (F + G)/2``. ``margin(b)`` is concave and piecewise linear, its breakpoints the edge
slopes of the upper set's lower hull and of the lower set's upper hull, and ``t_low* − t_up*``
at the active points is a supergradient. The optimum is the breakpoint where it turns
non-positive: one walk along both hulls in order of their edge slopes finds it (O(h) per
edge; the bisection it replaced took 48 passes over the points and stopped within 1e-17 of
it). The margin is measured vertically (in ns of offset), which differs from the Euclidean
SVM margin by a factor ``cos(atan b) > 1 − 1e-7``: the same line.

Overlap (margin < 0) cannot happen with linear clocks and positive delays; it means a clock
step or a timestamping fault inside the window. Those edges get a soft-margin fit over the
same points, the two directions' pair hulls (ν-SVM as a small LP with HiGHS, ``soft_nu`` =
0.2: at most a fifth of the points may violate the margin), flagged ``soft`` so the network
solve trusts them less and the solver can tell an unstable host.

Slope: with points spanning less than ``min_span_ns`` (0.2 s) the slope is too uncertain to
use (a 100 ns noise over 0.2 s is 500 ppb); the edge then keeps the prior slope (from the
previous drift estimates) and contributes to offsets only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog

from ._csr import floors, group_points, slope_edges
from .config import DEFAULT, SyncConfig

Points = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # (edge, upper, t, y) per point


@dataclass
class EdgeFits:
    """One row per edge: Δ(t) = a + b·t (t in ns relative to the solve's reference time)."""

    a: np.ndarray  # ns
    b: np.ndarray  # dimensionless (ns/ns)
    margin: np.ndarray  # ns; negative before the soft fit means the sets overlapped
    n_up: np.ndarray  # points the hard-margin fit was given (hull points at most)
    n_low: np.ndarray
    slope_ok: np.ndarray  # bool
    soft: np.ndarray  # bool: the soft-margin fit was used
    usable: np.ndarray  # bool: both sides have points (and a soft fit succeeded if needed)
    span: np.ndarray  # ns between the edge's first and last point


def fit_edges(
    edge: np.ndarray,
    upper: np.ndarray,
    t: np.ndarray,
    y: np.ndarray,
    n_edges: int,
    b_prior: np.ndarray,
    bracket: np.ndarray | float | None = None,
    cfg: SyncConfig = DEFAULT,
) -> EdgeFits:
    """Fit every edge. ``upper`` marks lo→hi points (y = owd); the others are hi→lo points
    already sign-flipped (y = −owd). ``t`` is in ns on a common time axis. ``bracket``: the
    slope searched within ``b_prior ± bracket`` (per edge; default ``cfg.slope_bracket``); an
    optimum at its edge keeps ``b_prior`` (not ``slope_ok``). The hard-margin line rests on
    hull points only, so the points may be just each direction's hull; the soft-margin fit
    of an overlapping edge counts the points given (the solver's: the pair hulls, all that
    an agent sends since it cuts its rows to them)."""
    bracket = cfg.slope_bracket if bracket is None else bracket
    # CSR rows: edge e's upper points are row 2e, its lower points row 2e + 1
    off, tc, yc = group_points(
        np.ascontiguousarray(edge, np.int64), np.ascontiguousarray(upper, bool).view(np.uint8),
        np.ascontiguousarray(t, np.float64), np.ascontiguousarray(y, np.float64), n_edges,
    )  # fmt: skip
    counts = np.diff(off)
    nu, nl = counts[0::2], counts[1::2]
    usable = (nu > 0) & (nl > 0)
    bracket = np.broadcast_to(np.asarray(bracket, np.float64), b_prior.shape)
    b, span = np.empty(n_edges), np.empty(n_edges)
    b_prior = np.ascontiguousarray(b_prior, np.float64)
    slope_edges(off, tc, yc, b_prior, np.ascontiguousarray(bracket), b, span)
    at_edge = np.abs(b - b_prior) > 0.999 * bracket
    slope_ok = usable & (span >= cfg.min_span_ns) & ~at_edge
    b = np.where(slope_ok, b, b_prior)
    f, g = np.empty(n_edges), np.empty(n_edges)
    floors(off, tc, yc, b, f, g)
    with np.errstate(invalid="ignore"):  # an edge with one side empty: inf − inf
        a, margin = 0.5 * (f + g), 0.5 * (f - g)
    a, margin = np.where(usable, a, 0.0), np.where(usable, margin, 0.0)
    fits = EdgeFits(a, b, margin, nu, nl, slope_ok, np.zeros(n_edges, bool), usable, span)
    _soft_fallback(fits, (edge, upper, t, y), cfg)
    return fits


def _soft_fallback(fits: EdgeFits, points: Points, cfg: SyncConfig) -> None:
    bad = np.flatnonzero(fits.usable & (fits.margin < 0))
    if bad.size > cfg.max_soft_edges:
        fits.usable[bad[cfg.max_soft_edges :]] = False
        bad = bad[: cfg.max_soft_edges]
    if not bad.size:
        return
    edge, upper, t, y = points
    order = np.argsort(edge, kind="stable")
    starts = np.searchsorted(edge[order], bad)
    ends = np.searchsorted(edge[order], bad, side="right")
    for e, s, z in zip(bad, starts, ends, strict=True):
        idx = order[s:z]
        got = soft_margin(t[idx], y[idx], upper[idx], float(fits.b[e]), cfg)
        if got is None:
            fits.usable[e] = False
            continue
        fits.a[e], fits.b[e], fits.margin[e] = got
        fits.soft[e] = True


def soft_margin(
    t: np.ndarray, y: np.ndarray, upper: np.ndarray, b_prior: float, cfg: SyncConfig = DEFAULT
) -> tuple[float, float, float] | None:
    """ν-soft-margin separator of one edge's points as an LP: max m − Σξ/(ν n).

    Variables ``[a, b', m, ξ...]`` with t in seconds (b' in ns/s) for conditioning. Returns
    ``(a, b, m)`` with b in ns/ns, or None if HiGHS fails.
    """
    n = t.size
    ts = t * 1e-9
    sign = np.where(upper, 1.0, -1.0)
    # upper: a + b t + m − ξ ≤ y ; lower: −a − b t + m − ξ ≤ −y
    a_ub = np.zeros((n, 3 + n))
    a_ub[:, 0], a_ub[:, 1], a_ub[:, 2] = sign, sign * ts, 1.0
    a_ub[np.arange(n), 3 + np.arange(n)] = -1.0
    c = np.concatenate([[0.0, 0.0, -1.0], np.full(n, 1.0 / (cfg.soft_nu * n))])
    lim = cfg.slope_bracket * 1e9
    bounds = [(None, None), (b_prior * 1e9 - lim, b_prior * 1e9 + lim), (0, None)]
    bounds += [(0, None)] * n
    res = linprog(c, A_ub=a_ub, b_ub=sign * y, bounds=bounds, method="highs")
    if res.status != 0:
        return None
    return float(res.x[0]), float(res.x[1]) * 1e-9, float(res.x[2])
