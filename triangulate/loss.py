"""Loss tomography: which links explain the lost probes, and at what loss rate.

Model: a flow's packets survive with the product of its links' success rates. For the small
loss rates that matter the expected lost count of row f is ``sent_f · (p0 + Σ_l w_fl p_l)`` (w
is 1 on a known path, the ECMP share on a candidate path), so each link's lost count is Poisson
with that mean. The fit is a greedy sparse maximum-likelihood search (better suited than
NetBouncer's dense least squares when few links are bad and access links see few flows):

1. for every link, the log-likelihood ratio of "this link drops at the rate that explains its
   lost packets" against "its flows' losses are already explained (plus background)";
2. take the link with the largest ratio, estimate its rate, and explain its flows' losses;
3. repeat until no link passes the threshold, then re-estimate the chosen links jointly and
   prune any that no longer pass with the others held fixed (the first pick can be a link that
   merely shares flows with two bad ones).

Black holes (rate 1) fit the same way; the Poisson ratio is only used to rank and test.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class LossFit:
    links: np.ndarray  # chosen link numbers
    rate: np.ndarray  # their loss rates
    llr: np.ndarray  # their log-likelihood ratios (others held fixed)
    sent: np.ndarray  # per link (all links): weighted packets crossing it
    lost: np.ndarray  # per link: weighted lost packets of its flows

    def rate_of(self, n_links: int) -> np.ndarray:
        out = np.zeros(n_links)
        out[self.links] = self.rate
        return out


def poisson_llr(obs: np.ndarray, exp: np.ndarray) -> np.ndarray:
    """Log-likelihood ratio of Poisson mean ``obs`` against mean ``exp`` (0 when obs <= exp)."""
    obs = np.asarray(obs, np.float64)
    exp = np.maximum(np.asarray(exp, np.float64), 1e-12)
    with np.errstate(divide="ignore", invalid="ignore"):
        llr = np.where(obs > 0, obs * np.log(obs / exp), 0.0) - (obs - exp)
    return np.where(obs > exp, llr, 0.0)


class _Fit:
    """Incidence bound to per-row counts; link sums via bincount."""

    def __init__(self, row, link, w, sent, lost, n_links, p0) -> None:
        self.row, self.link, self.w = row, link, w
        self.sent, self.lost, self.n, self.p0 = sent, lost, n_links, p0
        self.ws = w * sent[row]
        self.S = np.bincount(link, self.ws, n_links)
        self.O = np.bincount(link, w * lost[row], n_links)

    def restrict(self, links: np.ndarray) -> _Fit:
        """The same fit over only the rows that cross one of ``links`` (cheap refinement)."""
        rows = np.zeros(self.sent.size, bool)
        rows[self.row[np.isin(self.link, links)]] = True
        e = rows[self.row]
        return _Fit(self.row[e], self.link[e], self.w[e], self.sent, self.lost, self.n, self.p0)

    def expected(self, rate_row: np.ndarray) -> np.ndarray:
        """Per link: the lost packets its flows should show given the rows' explained rate."""
        return np.bincount(self.link, self.ws * (self.p0 + rate_row[self.row]), self.n)

    def row_rate(self, links: np.ndarray, rate: np.ndarray, skip: int = -1) -> np.ndarray:
        per_link = np.zeros(self.n)
        per_link[links] = rate
        if skip >= 0:
            per_link[skip] = 0.0
        r = np.bincount(self.row, self.w * per_link[self.link], self.sent.size)
        return np.minimum(r, 1.0)


def fit_loss(
    row: np.ndarray,
    link: np.ndarray,
    w: np.ndarray,
    sent: np.ndarray,
    lost: np.ndarray,
    n_links: int,
    p0: float = 1e-6,
    threshold: float = 12.0,
    min_lost: float = 2.0,
    max_links: int = 64,
) -> LossFit:
    f = _Fit(row, link, w, sent, lost, n_links, p0)
    chosen: list[int] = []
    rate_row = np.zeros(sent.size)
    candidates = min_lost <= f.O
    if candidates.any():
        for _ in range(max_links):
            exp = f.expected(rate_row)
            llr = np.where(candidates, poisson_llr(f.O, exp), 0.0)
            llr[chosen] = 0.0
            best = int(np.argmax(llr))
            if llr[best] < threshold:
                break
            chosen.append(best)
            p = min(1.0, max(f.O[best] - exp[best], 0.0) / max(f.S[best], 1e-12))
            on = link == best
            np.add.at(rate_row, row[on], w[on] * p)
            np.minimum(rate_row, 1.0, out=rate_row)
    links = np.array(chosen, np.int64)
    rate, llr = _refine(f.restrict(links), links, threshold, min_lost)
    keep = llr >= threshold
    return LossFit(links[keep], rate[keep], llr[keep], f.S, f.O)


def _refine(f: _Fit, links: np.ndarray, threshold: float, min_lost: float):
    """Joint re-estimate (a few Gauss-Seidel sweeps) and leave-one-out pruning."""
    rate = np.zeros(links.size)
    alive = np.ones(links.size, bool)
    llr = np.zeros(links.size)
    for _ in range(4):
        for i, lk in enumerate(links.tolist()):
            if not alive[i]:
                continue
            others = f.row_rate(links[alive], rate[alive], skip=lk)
            exp = f.expected(others)[lk]
            rate[i] = min(1.0, max(f.O[lk] - exp, 0.0) / max(f.S[lk], 1e-12))
            llr[i] = poisson_llr(f.O[lk], exp)
            if llr[i] < threshold or f.O[lk] - exp < min_lost:
                alive[i] = False
                rate[i] = 0.0
                llr[i] = 0.0
        if links.size <= 1:
            break
    return rate, llr
