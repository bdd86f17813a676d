"""Loss tomography: which links explain the lost probes, and at what loss rate.

Model: a flow's packets survive with the product of its links' success rates. For the small
loss rates that matter the expected lost count of row f is ``sent_f · (p0 + Σ_l w_fl p_l)`` (w
is 1 on a known path, the ECMP share on a candidate path), so each link's lost count is Poisson
with that mean. The fit is a greedy sparse maximum-likelihood search (better suited than
NetBouncer's dense least squares when few links are bad and access links see few flows):

1. for every link, the log-likelihood gained, flow by flow, by letting it drop at the rate that
   explains its unexplained lost packets (against "already explained, plus background");
2. take the link with the largest ratio, estimate its rate, and explain its flows' losses;
3. after every pick, re-estimate all chosen links jointly by EM (maximum likelihood: each lost
   packet is shared among its flow's links in proportion to their rates) and drop any link
   whose removal costs less than the threshold in log-likelihood — an early pick can be a link
   that merely shares flows with several bad ones (e.g. a spine uplink when many of that
   spine's downlinks drop); dropped links are not picked again;
4. stop when no link passes the threshold.

Black holes (rate 1) fit the same way; the Poisson ratio is only used to rank and test.

``fit_incidence`` is the same search over a factorized :class:`~.incidence.Incidence`: a flow
without lost packets only enters the likelihood through its link's packet total ``S`` (given,
computed once per window), so the search expands the entries of the lossy flows only; of the
flows crossing a chosen link (their explained rate sets the expectation of the other links
those flows cross) it reads per-link sums, made once per link picked. With no loss anywhere
it returns at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .incidence import Incidence

_EM_TOL = 1e-4  # relative change of every rate at which EM has converged


@dataclass
class LossFit:
    links: np.ndarray  # chosen link numbers
    rate: np.ndarray  # their loss rates
    llr: np.ndarray  # their log-likelihood ratios (others held fixed)
    sent: np.ndarray  # per link (all links): weighted packets crossing it
    lost: np.ndarray  # per link: weighted lost packets of its flows
    # per link: the part of ``lost`` from flows whose path was uncertain (ECMP-spread weight
    # < 1): evidence that its ECMP siblings received in equal measure (see attribution)
    spread: np.ndarray | None = None
    # per link: the loss rate its flows show with no fault (``evidence``: the background per
    # hop times their mean hop count); None before the significance gate
    background: np.ndarray | None = None

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

    @cached_property
    def S(self) -> np.ndarray:  # per-link weighted packets sent
        return np.bincount(self.link, self.ws, self.n)

    @cached_property
    def O(self) -> np.ndarray:  # noqa: E743 - per-link weighted packets lost
        return np.bincount(self.link, self.w * self.lost[self.row], self.n)

    @cached_property
    def spread(self) -> np.ndarray:  # per-link weighted lost packets on uncertain paths
        unsure = self.w < 1.0 - 1e-9
        return np.bincount(self.link[unsure], (self.w * self.lost[self.row])[unsure], self.n)

    def on_links(self, mask: np.ndarray) -> _Fit:
        """The same fit over only the entries of links where ``mask`` is set (their link sums
        are unchanged; everything else reads 0) — the greedy scores only these."""
        e = mask[self.link]
        return _Fit(self.row[e], self.link[e], self.w[e], self.sent, self.lost, self.n, self.p0)

    def restrict(self, links: np.ndarray) -> _Fit:
        """The same fit over only the rows that cross one of ``links`` (cheap refinement)."""
        rows = np.zeros(self.sent.size, bool)
        rows[self.row[np.isin(self.link, links)]] = True
        e = rows[self.row]
        return _Fit(self.row[e], self.link[e], self.w[e], self.sent, self.lost, self.n, self.p0)

    def em(
        self, links: np.ndarray, rate: np.ndarray, iters: int = 30, s: np.ndarray | None = None
    ) -> np.ndarray:
        """Maximum-likelihood rates of ``links`` (EM for the Poisson linear model): each lost
        packet is shared among the links of its flow in proportion to their rates. ``s``: the
        links' weighted packets when this fit holds only some of their rows (the lossy ones:
        a row without lost packets enters only through them)."""
        if not links.size:
            return rate
        pos = np.full(self.n, -1)
        pos[links] = np.arange(links.size)
        on = pos[self.link] >= 0
        r, li, w = self.row[on], pos[self.link[on]], self.w[on]
        if s is None:
            s = np.bincount(li, w * self.sent[r], links.size)
        lost_w = w * self.lost[r]
        for _ in range(iters):
            m = self.p0 + np.bincount(r, w * rate[li], self.sent.size)
            share = np.bincount(li, lost_w / m[r], links.size)
            new = np.minimum(rate * share / np.maximum(s, 1e-12), 1.0)
            # one link, or links sharing no flows: exact after one step; stop once settled
            done = np.all(np.abs(new - rate) <= _EM_TOL * np.maximum(new, self.p0))
            rate = new
            if done:
                break
        return rate

    def drop_llr(
        self, links: np.ndarray, rate: np.ndarray, s: np.ndarray | None = None
    ) -> np.ndarray:
        """Per chosen link: log-likelihood lost when its rate is set to 0, others fixed;
        ``s`` as for :meth:`em` (the packets' term is then ``rate · s``)."""
        pos = np.full(self.n, -1)
        pos[links] = np.arange(links.size)
        on = pos[self.link] >= 0
        r, li, w = self.row[on], pos[self.link[on]], self.w[on]
        m = self.p0 + np.bincount(r, w * rate[li], self.sent.size)
        part = w * rate[li]
        without = np.maximum(m[r] - part, self.p0)
        if s is not None:
            return np.bincount(li, self.lost[r] * np.log(m[r] / without), links.size) - rate * s
        gain = self.lost[r] * np.log(m[r] / without) - self.sent[r] * part
        return np.bincount(li, gain, links.size)

    def gain(self, rate_row: np.ndarray, p: np.ndarray) -> np.ndarray:
        """Per link: log-likelihood gained by giving it rate ``p``, flow by flow. Unexplained
        losses weigh by how unexplained they are (an aggregate Poisson ratio would let a link
        with a few lost packets and nothing explained beat the real, busier culprit)."""
        m = self.p0 + rate_row[self.row]
        add = self.w * p[self.link]
        g = self.lost[self.row] * np.log1p(add / m) - self.sent[self.row] * add
        return np.bincount(self.link, g, self.n)

    def expected(self, rate_row: np.ndarray) -> np.ndarray:
        """Per link: the lost packets its flows should show given the rows' explained rate."""
        return np.bincount(self.link, self.ws * (self.p0 + rate_row[self.row]), self.n)

    def row_rate(self, links: np.ndarray, rate: np.ndarray) -> np.ndarray:
        per_link = np.zeros(self.n)
        per_link[links] = rate
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
    chosen = np.empty(0, np.int64)
    rate = np.empty(0)
    banned = min_lost > f.O
    cand = f.on_links(~banned)  # links with no lost packets can never be picked
    rate_row = np.zeros(sent.size)
    for _ in range(max_links):
        if banned.all():
            break
        exp = cand.expected(rate_row)
        p_hat = np.clip((f.O - exp) / np.maximum(f.S, 1e-12), 0.0, 1.0)
        llr = np.where(banned, 0.0, cand.gain(rate_row, p_hat))
        llr[chosen] = 0.0
        best = int(np.argmax(llr))
        if llr[best] < threshold:
            break
        p = float(p_hat[best])
        chosen, rate = np.append(chosen, best), np.append(rate, max(p, 1e-6))
        sub = f.restrict(chosen)
        rate = sub.em(chosen, rate)
        keep = sub.drop_llr(chosen, rate) >= threshold
        if not keep.all():  # a link that only shared flows with the bad ones: never again
            banned[chosen[~keep]] = True
            chosen, rate = chosen[keep], sub.em(chosen[keep], rate[keep])
        rate_row = f.restrict(chosen).row_rate(chosen, rate)
    sub = f.restrict(chosen)
    llr = sub.drop_llr(chosen, rate) if chosen.size else np.empty(0)
    keep = llr >= threshold
    return LossFit(chosen[keep], rate[keep], llr[keep], f.S, f.O, f.spread)


def _local(inc: Incidence, rows: np.ndarray, sent, lost, S, n_links, p0) -> _Fit:
    """A fit over ``rows`` only (renumbered 0..), with the packet totals ``S`` of all rows."""
    r, lk, w = inc.entries(rows)
    f = _Fit(r, lk, w, sent[rows], lost[rows], n_links, p0)
    f.__dict__["S"] = S
    return f


class _Columns:
    """What the fit reads of the rows the links it picks may carry, one pass per link picked
    (``Incidence.link_sums_of``, no entries expanded): per link k, its weighted packets
    ``s_k = Σ_r w_rk sent_r`` and its column of ``C_lk = Σ_r w_rl w_rk sent_r``, so that
    the loss the chosen links explain on every link's rows is ``Σ_k rate_k C_lk``; kept
    only on the links the fit ``need``s it for (those with lost packets enough to be picked).

    Exact while no row's summed rate passes 1 (the fit's row rate is capped there): a row
    crossing no link of rate above ``1 / max_links`` cannot pass it, and the rows of those
    that are above (a black hole, a heavy fault: few links) are read again each time."""

    def __init__(self, inc: Incidence, sent: np.ndarray, need: np.ndarray) -> None:
        self.inc, self.sent, self.need = inc, sent, need
        self.at = np.full(inc.n_links, -1)  # per link, its column (-1: none yet)
        # the columns' nonzero entries, column after column: (link, value, column)
        self.ent: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.flat: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.s: list[float] = []
        self.cap = 1.0 / inc.max_links()

    def packets(self, links: np.ndarray) -> np.ndarray:
        """``s_k`` of ``links`` (their columns made when first asked for)."""
        for k in links[self.at[links] < 0].tolist():
            rows = self.inc.rows_of(np.array([k]))
            one = np.zeros(self.inc.n_links)
            one[k] = 1.0
            x = self.inc.row_sums(rows, one) * self.sent[rows]
            col = self.inc.link_sums_of(rows, x)
            on = np.flatnonzero(self.need & (col != 0))  # few: a leaf's links, on spread
            self.at[k] = len(self.s)
            self.ent.append((on, col[on], np.full(on.size, self.at[k])))
            self.s.append(float(x.sum()))
            self.flat = None
        return np.array(self.s)[self.at[links]]

    def explained(self, links: np.ndarray, rate: np.ndarray) -> np.ndarray:
        """Per link where ``need`` is set (0 elsewhere): ``Σ_r w_rl sent_r min(Σ_k w_rk rate_k,
        1)`` over ``links`` at ``rate``."""
        self.packets(links)
        if not links.size:
            return np.zeros(self.inc.n_links)
        if self.flat is None:
            lk, val, col = zip(*self.ent, strict=True)
            self.flat = np.concatenate(lk), np.concatenate(val), np.concatenate(col)
        lk, val, col = self.flat
        on = np.zeros(len(self.s))
        on[self.at[links]] = rate
        out = np.bincount(lk, val * on[col], self.inc.n_links)
        big = links[rate > self.cap]
        if rate.sum() > 1.0 and big.size:  # rows whose rate the cap at 1 cuts
            rows = self.inc.rows_of(big)
            per_link = np.zeros(self.inc.n_links)
            per_link[links] = rate
            over = np.maximum(self.inc.row_sums(rows, per_link) - 1.0, 0.0)
            if over.any():
                out -= self.need * self.inc.link_sums_of(rows, self.sent[rows] * over)
        return out


def fit_incidence(
    inc: Incidence,
    sent: np.ndarray,
    lost: np.ndarray,
    S: np.ndarray,
    p0: float = 1e-6,
    threshold: float = 12.0,
    min_lost: float = 2.0,
    max_links: int = 64,
    lossy: np.ndarray | None = None,
) -> LossFit:
    """:func:`fit_loss` on a factorized incidence; ``S = inc.link_sums(sent)``; ``lossy``:
    the rows with ``lost > 0`` in order, when the caller has them.

    Only the lossy rows' entries are expanded: the likelihood's other terms are per link
    (``S``, and the chosen links' packets and explained loss, ``_Columns``), so a pick costs
    a pass over its own rows once, not over every chosen link's rows' entries each time
    (with paths unknown a fabric link's rows are its leaf's share of the window, each spread
    over ~16 candidate links: ~98 M entries in a fit of the acks on the reference fabric)."""
    n = inc.n_links
    if lossy is None:
        lossy = np.flatnonzero(lost > 0)
    f = _local(inc, lossy, sent, lost, S, n, p0)
    O = f.O  # noqa: E741 - lossless rows add nothing
    chosen, rate = np.empty(0, np.int64), np.empty(0)
    banned = min_lost > O
    cand = f.on_links(~banned)
    cols = _Columns(inc, sent, ~banned)  # the links that can be picked: their expectation
    rate_lossy = np.zeros(lossy.size)  # explained rate of the lossy rows
    for _ in range(max_links):
        if banned.all():
            break
        exp = p0 * S + cols.explained(chosen, rate)
        p_hat = np.clip((O - exp) / np.maximum(S, 1e-12), 0.0, 1.0)
        m = p0 + rate_lossy[cand.row]
        g = cand.lost[cand.row] * np.log1p(cand.w * p_hat[cand.link] / m)
        llr = np.where(banned, 0.0, np.bincount(cand.link, g, n) - p_hat * S)
        llr[chosen] = 0.0
        best = int(np.argmax(llr))
        if llr[best] < threshold:
            break
        chosen, rate = np.append(chosen, best), np.append(rate, max(float(p_hat[best]), 1e-6))
        s = cols.packets(chosen)
        rate = f.em(chosen, rate, s=s)
        keep = f.drop_llr(chosen, rate, s) >= threshold
        if not keep.all():  # a link that only shared flows with the bad ones: never again
            banned[chosen[~keep]] = True
            chosen, s = chosen[keep], s[keep]
            rate = f.em(chosen, rate[keep], s=s)
        rate_lossy = f.row_rate(chosen, rate)
    llr = f.drop_llr(chosen, rate, cols.packets(chosen)) if chosen.size else np.empty(0)
    keep = llr >= threshold
    return LossFit(chosen[keep], rate[keep], llr[keep], S, O, f.spread)
