"""Published loss-localization methods, as baselines for bench/ only (never used by FleetLens).

Both take the same decoded input as the engine: incidence entries (row, link, weight) from
``fleetlens.triangulate.paths.PathModel`` and per-row probe counts (summed since the fault
window opened, which is their most favourable setting). Neither looks at delay.

- ``vote_007``: 007 (Arzani et al., NSDI'18). Every flow that lost packets casts one vote,
  split evenly over the links of its path; the link with the most votes is blamed, the flows
  it explains are removed, and the vote repeats until the best link has fewer than
  ``min_votes`` votes.
- ``netbouncer``: NetBouncer (Tan et al., NSDI'19). Link success probabilities ``x`` fit the
  path success rates ``y_f = received/sent`` by minimizing ``Σ_f (y_f - Π_l x_l)² +
  λ Σ_l x_l (1 - x_l)`` with coordinate descent (closed form per link); links whose estimated
  loss ``1 - x_l`` exceeds ``threshold`` are blamed.
"""

from __future__ import annotations

import numpy as np


def vote_007(row, link, w, sent, lost, n_links: int, min_votes: float = 1.0) -> set[int]:
    hops = np.bincount(row, w, sent.size)
    active = lost > 0
    share = w / np.maximum(hops[row], 1e-12)
    out: set[int] = set()
    while active.any():
        e = active[row]
        votes = np.bincount(link[e], share[e], n_links)
        best = int(np.argmax(votes))
        if votes[best] < min_votes:
            break
        out.add(best)
        active[row[link == best]] = False
    return out


def netbouncer(
    row, link, sent, lost, n_links: int, lam: float = 0.5, threshold: float = 5e-5,
    sweeps: int = 10,
) -> set[int]:  # fmt: skip
    y = 1.0 - lost / np.maximum(sent, 1e-12)
    x = np.ones(n_links)
    logp = np.zeros(sent.size)  # log of the product of the path's link successes
    order = np.argsort(link, kind="stable")
    starts = np.searchsorted(link[order], np.arange(n_links + 1))
    # links that carry a lossy flow; the others sit at x = 1 (the fit's fixed point there)
    todo = np.unique(link[(y < 1.0)[row]])
    for _ in range(sweeps):
        for lk in todo.tolist():
            rows = row[order[starts[lk] : starts[lk + 1]]]
            c = np.exp(logp[rows] - np.log(max(x[lk], 1e-12)))
            den = float(np.dot(c, c)) - lam
            new = (float(np.dot(y[rows], c)) - lam / 2) / den if den > 0 else 1.0
            new = min(max(new, 1e-9), 1.0)
            logp[rows] += np.log(new) - np.log(max(x[lk], 1e-12))
            x[lk] = new
    return set(np.flatnonzero(1.0 - x > threshold).tolist())
