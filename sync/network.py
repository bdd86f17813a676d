"""Network effect: per-host offsets (and drifts) from all edge estimates at once.

Every edge says ``x_hi − x_lo ≈ z_e``. Around any loop of the probe graph the true differences
sum to zero, so the edge errors that do not sum to zero are visible and get averaged away: the
weighted least-squares solution ``min Σ w_e (x_hi − x_lo − z_e)²`` over the whole graph keeps
only the part of the edge errors that is a potential (a per-host constant, e.g. a host whose
every path is asymmetric — unobservable by any two-way method) and cuts the rest by roughly the
square root of the degree.

Solve: the normal equations ``L x = Bᵀ W z`` with the weighted graph Laplacian ``L``. Probe
graphs are expanders (random long peer offsets), whose Laplacians are well conditioned but fill
in badly under a direct factorization, so conjugate gradients with a Jacobi preconditioner are
used (tens of iterations, O(edges) memory), with two rounds of iterative refinement because
the first-window offsets are ±50 ms and we want sub-ns agreement. Only the largest connected
component is solved; hosts outside it have no common time with the fleet.

Anchor: the solution is defined up to a constant. With a configured reference host, that
host's value is 0. Otherwise the fleet mean: on the first solve the mean is 0, later the
(20 %-trimmed) mean change from the prior is 0, so fleet time stays continuous from window to
window and one host stepping its clock does not drag everybody.

Outliers (asymmetric paths, a bad link, a stepped clock inside the window): iteratively
reweighted least squares. The residual scale is ``s = 1.4826·MAD`` (robust) with a floor;
residuals beyond ``huber_k·s`` get Huber weights, beyond ``outlier_k·s`` (and beyond the floor)
the edge is flagged and removed (``reject=False``: Huber weights only, used for drifts, whose
edge slopes scatter with the clocks' wander rather than with path faults). Hosts left with
fewer than ``min_edges`` edges are dropped as unsynchronized: with two edges a conflict
cannot be told apart from a wrong edge; with three the majority wins.

The kept edges and hosts depend only on which edges have weight: the Huber rounds never zero
a weight, and a window's drift solve keeps the offsets' surviving edges, so an
:class:`ActiveSets` shared by a window's solves computes each distinct set (degree pruning and
connected components) once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from .config import DEFAULT, SyncConfig


class ActiveSets:
    """The kept edges and hosts of one edge geometry, per set of weighted edges (memoized),
    and the sparsity pattern of their Laplacian.

    Exact: :func:`_active` reads nothing of the weights but which are positive."""

    KEEP = 8  # sets remembered: a window's solves make 2-4, and the next window's repeat them

    def __init__(self, n: int, lo: np.ndarray, hi: np.ndarray, min_edges: int) -> None:
        self.n, self.lo, self.hi, self.min_edges = n, lo, hi, min_edges
        self._seen: list[tuple[np.ndarray, tuple[np.ndarray, np.ndarray], list[_Pattern]]] = []

    def of(self, n: int, lo: np.ndarray, hi: np.ndarray, min_edges: int) -> ActiveSets:
        """These sets for another window's geometry if it is this one's (the usual case: the
        same edges between the same hosts, whose sets and Laplacian patterns, ~15 ms at 1024
        hosts, are then not found again), else new ones."""
        same = (n, min_edges) == (self.n, self.min_edges)
        if same and np.array_equal(lo, self.lo) and np.array_equal(hi, self.hi):
            return self
        return ActiveSets(n, lo, hi, min_edges)

    def __call__(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._entry(w)[1]

    def pattern(self, w: np.ndarray) -> _Pattern:
        """The Laplacian pattern of the edges kept of those weighted in ``w``, over the hosts
        kept with them."""
        _, (active, solved), memo = self._entry(w)
        if not memo:
            memo.append(_Pattern(self.n, self.lo, self.hi, active, solved))
        return memo[0]

    def _entry(
        self, w: np.ndarray
    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray], list[_Pattern]]:
        on = w > 0
        for entry in self._seen:
            if np.array_equal(entry[0], on):
                return entry
        entry = (on, _active(self.n, self.lo, self.hi, on, self.min_edges), [])
        self._seen = [*self._seen[-(self.KEEP - 1) :], entry]
        return entry


class _Pattern:
    """The weighted Laplacian's CSR structure over one set of kept edges (``on``) and
    hosts, built once; a solve's weights only refill its values (each entry the sum of its
    edges' weights in edge order: scipy's duplicate summation up to rounding)."""

    def __init__(
        self, n: int, lo: np.ndarray, hi: np.ndarray, on: np.ndarray, solved: np.ndarray
    ) -> None:
        idx = np.full(n, -1)
        self.m = m = int(solved.sum())
        idx[solved] = np.arange(m)
        self.on = on
        self.i, self.j = i, j = idx[lo[on]], idx[hi[on]]
        code = np.r_[i, j, i, j] * m + np.r_[i, j, j, i]
        uniq, self.pos = np.unique(code, return_inverse=True)
        self.indptr = np.searchsorted(uniq, np.arange(m + 1) * m)
        self.indices = uniq % m
        self.nnz = uniq.size

    def matrix(self, w: np.ndarray) -> sp.csr_matrix:
        """The Laplacian with the kept edges' weights ``w[on]``."""
        wz = w[self.on]
        data = np.bincount(self.pos, np.concatenate([wz, wz, -wz, -wz]), self.nnz)
        return sp.csr_matrix((data, self.indices, self.indptr), (self.m, self.m))


@dataclass
class NetSolution:
    x: np.ndarray  # per host (NaN where not solved)
    solved: np.ndarray  # bool per host
    weight: np.ndarray  # final per-edge weight (0: removed)
    outlier: np.ndarray  # bool per edge
    residual: np.ndarray  # per edge, z − (x_hi − x_lo)
    scale: float  # robust residual scale
    sigma: np.ndarray  # per-host standard error estimate (NaN where not solved)


def solve_network(
    n: int,
    lo: np.ndarray,
    hi: np.ndarray,
    z: np.ndarray,
    w0: np.ndarray,
    prior: np.ndarray,
    has_prior: np.ndarray,
    floor: float,
    reference: int | None = None,
    reject: bool = True,
    cfg: SyncConfig = DEFAULT,
    active_sets: ActiveSets | None = None,
) -> NetSolution:
    """Robust weighted LS of per-host values from edge differences ``z ≈ x[hi] − x[lo]``.

    ``active_sets``: shared by solves over the same ``lo``/``hi`` (one per call if None)."""
    sets = ActiveSets(n, lo, hi, cfg.min_edges) if active_sets is None else active_sets
    w = w0.astype(np.float64).copy()
    x, solved, s = prior.astype(np.float64).copy(), np.zeros(n, bool), floor
    # Huber rounds first (every edge keeps a bounded pull, so no host is ever cut off by its
    # own stale value), then one hard rejection on the converged M-estimate.
    for _ in range(cfg.irls_rounds):
        active, solved = sets(w)
        if not solved.any():
            break
        x = _solve(sets.pattern(w), z, w, x, solved, cfg)
        x = _anchor(x, prior, has_prior, solved, reference, cfg.trim)
        r = z - (x[hi] - x[lo])
        live = active & (w0 > 0)
        s = max(1.4826 * float(np.median(np.abs(r[live]))) if live.any() else floor, floor)
        new_w = w0 * np.minimum(1.0, cfg.huber_k * s / np.maximum(np.abs(r), 1e-12))
        done = np.allclose(new_w, w, rtol=1e-3, atol=1e-6)
        w = new_w
        if done:
            break
    r = z - (np.nan_to_num(x)[hi] - np.nan_to_num(x)[lo])
    judged = solved[lo] & solved[hi]
    outlier = (np.abs(r) > cfg.outlier_k * s) & (w0 > 0) & judged & reject
    w = np.where(outlier, 0.0, w)
    # The last round changed the weights: solve once more so x, weights and residuals agree
    # (a host re-admitted in the last round would otherwise keep a stale value).
    active, solved = sets(w)
    if solved.any():
        x = _solve(sets.pattern(w), z, w, x, solved, cfg)
        x = _anchor(x, prior, has_prior, solved, reference, cfg.trim)
    w = np.where(active, w, 0.0)
    r = z - (np.nan_to_num(x)[hi] - np.nan_to_num(x)[lo])
    sigma = _sigma(n, lo, hi, r, w, s)
    x = np.where(solved, x, np.nan)
    return NetSolution(x, solved, w, outlier, r, s, np.where(solved, sigma, np.nan))


def _active(
    n: int, lo: np.ndarray, hi: np.ndarray, edge_on: np.ndarray, min_edges: int
) -> tuple[np.ndarray, np.ndarray]:
    """Edges and hosts kept of the weighted edges ``edge_on``: drop hosts with < ``min_edges``
    edges until stable, then keep the largest connected component."""
    while True:
        deg = np.bincount(lo[edge_on], minlength=n) + np.bincount(hi[edge_on], minlength=n)
        host_ok = deg >= min_edges
        keep = edge_on & host_ok[lo] & host_ok[hi]
        if np.array_equal(keep, edge_on):
            break
        edge_on = keep
    if not edge_on.any():
        return edge_on, np.zeros(n, bool)
    g = sp.coo_matrix((np.ones(int(edge_on.sum())), (lo[edge_on], hi[edge_on])), (n, n))
    _, label = connected_components(g, directed=False)
    used = np.zeros(n, bool)
    used[lo[edge_on]] = used[hi[edge_on]] = True
    big = np.bincount(label[used]).argmax()
    solved = used & (label == big)
    return edge_on & solved[lo], solved


def _solve(
    pat: _Pattern, z: np.ndarray, w: np.ndarray, x0: np.ndarray, solved: np.ndarray, cfg: SyncConfig
) -> np.ndarray:
    """``x0`` refined on the solved hosts by CG on the Laplacian of ``pat``'s edges (their
    weights in ``w``; the other edges' are not read)."""
    m, i, j, wz = pat.m, pat.i, pat.j, w[pat.on]
    lap = pat.matrix(w)
    diag = lap.diagonal()
    inv_diag = 1.0 / np.where(diag > 0, diag, 1.0)  # Jacobi preconditioner
    x = x0[solved].astype(np.float64).copy()
    for _ in range(cfg.refine):
        r = z[pat.on] - (x[j] - x[i])
        rhs = np.bincount(j, wz * r, minlength=m) - np.bincount(i, wz * r, minlength=m)
        rhs -= rhs.mean()  # exactly consistent (sums to 0 on the component), despite rounding
        scale = float(np.abs(rhs).max())
        if scale < cfg.cg_atol:  # the previous round already solved it closely enough
            break
        tol = cfg.cg_atol / scale  # the 2-norm's bound keeps every host's sum below cg_atol
        dx = _pcg(lap, rhs / scale, inv_diag, cfg.cg_rtol, tol, maxiter=1000)
        x += (dx - dx.mean()) * scale
    out = x0.astype(np.float64).copy()
    out[solved] = x
    return out


def _pcg(
    lap: sp.csr_matrix, b: np.ndarray, inv_diag: np.ndarray, rtol: float, atol: float, maxiter: int
) -> np.ndarray:
    """Jacobi-preconditioned conjugate gradients from zero until ``‖b − L x‖₂ < max(atol,
    rtol·‖b‖₂)``: scipy's ``cg`` step for step (the same iterates), without its operator
    wrappers around each product, which were half of an iteration's time at 1024 hosts."""
    stop = max(atol, rtol * float(np.linalg.norm(b)))
    x = np.zeros_like(b)
    r = b.copy()
    p, rho_prev = None, 1.0
    for _ in range(maxiter):
        if np.linalg.norm(r) < stop:
            break
        z = inv_diag * r
        rho = np.dot(r, z)
        if p is None:
            p = z.copy()
        else:
            p *= rho / rho_prev
            p += z
        q = lap @ p
        alpha = rho / np.dot(p, q)
        x += alpha * p
        r -= alpha * q
        rho_prev = rho
    return x


def _anchor(
    x: np.ndarray,
    prior: np.ndarray,
    has_prior: np.ndarray,
    solved: np.ndarray,
    reference: int | None,
    trim: float,
) -> np.ndarray:
    if reference is not None and solved[reference]:
        return x - x[reference]
    both = solved & has_prior
    if both.sum() >= 3:
        d = np.sort(x[both] - prior[both])
        k = int(trim * d.size)
        shift = d[k : d.size - k].mean()
    else:
        shift = x[solved].mean()
    return x - shift


def _sigma(
    n: int, lo: np.ndarray, hi: np.ndarray, r: np.ndarray, w: np.ndarray, s: float
) -> np.ndarray:
    """Standard error per host: its weighted residual rms (at least the global scale) over
    the square root of its effective edge count."""
    wr2 = w * r * r
    sw = np.bincount(lo, w, n) + np.bincount(hi, w, n)
    swr2 = np.bincount(lo, wr2, n) + np.bincount(hi, wr2, n)
    rms2 = np.where(sw > 0, swr2 / np.maximum(sw, 1e-12), np.inf)
    return np.sqrt(np.maximum(rms2, s * s) / np.maximum(sw, 1e-12))
