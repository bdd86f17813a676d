"""Evidence before alarms: a link's loss must be significant against the background rate.

The loss fits (``loss.py``) pick links whose lost packets their likelihood explains better
than a tiny ``background_loss``; on a real fabric, where every path loses a few packets in a
million, that made a link with two lost probes in a window lossy (issue 28: access links
called faulty at 0.1-0.5 % measured on one flow). Each link a fit keeps is therefore tested
against the background its flows show anyway:

- the background is per *hop*: every link of a fabric loses a little, so a row crossing
  ``h`` links loses ~``h · q`` (an intra-leaf row crosses 2, an inter-leaf row of a
  leaf-spine 4). ``q`` is the maximum-likelihood rate of that model: lost / (sent · h) summed
  over every row, then again without the rows of the chosen links that the fit's own
  threshold (``loss_llr``) calls lossy against the rest's rate (a fault must not raise the
  background it is tested against). Not over the rows crossing *no* chosen link: on
  background loss alone the fit picks dozens of links, and the rows left are those that
  happened to lose nothing (q read 2.6x low on the simulator, and background links passed);
- under "link l adds nothing", the loss a fit puts on l is at most every lost packet of the
  rows that may cross it (at EM's fixed point ``x_l = rate_l · S_l = Σ_r lost_r · share_rl``,
  each row's lost packets shared among its chosen links, ``share <= 1``): Poisson with mean
  ``E_l = q · Σ_{r: w_rl > 0} sent_r · h_r = q · K_l · S_l`` (``S_l = Σ_r w_rl sent_r`` the
  link's weighted packets, ``w_rl`` 1 on a known path and 1/N over N ECMP candidates;
  ``K_l`` from ``Incidence.hop_factors``: the mean hop count of its rows on known paths,
  N times it on spread ones, since the fit explains a spread row's loss by N times the
  rate on one candidate), floored at the fits' per-link floor times ``S_l``: the
  configured ``background_loss``, lowered once the long horizon's counts bound the
  background per hop below it (``learned_floor``). The lab runs with 1e-3 against a measured
  ~1e-5 per hop; held at 1e-3, a 1 % fault on a 400-probe uplink (4 lost a second against
  0.4 expected) could not pass the level before its sixth window;
  One background rate per *row* instead (the first version) held only while every row
  crossed as many links on known paths: at 1024 hosts on 2-3 leaves a fabric link carries
  only 4-hop rows (1e5-1e7 packets) against a row rate averaged with 2-hop intra-leaf rows,
  and with paths unknown the fit read 2x that again; far past the level, background loss
  alone made whole ECMP groups faulty;
- the link is kept when the Chernoff bound on that tail, ``P(X >= x) <= exp(-LLR(x, E_l))``
  (``x = rate_l · S_l``, the loss the fit puts on l), is below ``alpha =
  false_alarms_per_link_hour / tests per link-hour`` (three fits — this window, the decayed
  long horizon and the onset horizon's last three windows, ``horizon`` — per window; 16.2 at
  1 s windows and 1e-3). A bound, and the decayed counts are less dispersed than Poisson, so
  the rate of links passing per link-hour is at most the stated one; a ``faulty`` verdict
  needs two consecutive windows (``fault_windows``) on top;
- and a link whose rows also cross other links that pass that test, only if its rows'
  loss stands out (the same alpha) of what the background and those links' fitted rates
  explain, each spread row's path a hidden draw and each row's loss binomial
  (``beyond_others_llr``): a row takes one real path, so its share of a lossy spine is the
  spine's rate or nothing, not the even split the fit gives it, and over a few rows that
  draw varies far past Poisson. Without it, a NIC whose incoming rows crossed a 1 % spine
  downlink more often than 1/3 had its access link `faulty` at 3.3e-4 (simulator sweep,
  host 3L 3S, paths unknown). A link sharing no rows with the others passes it whenever it
  passes the first test.

The rate a link's weighted counts (``LossFit.sent``, ``.lost``) show with no fault, ``q · H_l``
(``H_l`` the mean hop count of its rows), goes with the gated fit (``LossFit.background``):
the heal test compares against it, and the switch rule (``attribution``) reads a link's loss
above it.

Lost acks (``engine._with_acks``) are tested against a null of their own: a background per
hop learned over the ack rows alone, and no link's evidence may rest on one agent's rows
(``without_one_agent_llr``). Agents count a late ack as lost, and busy agents, by turns, make
many on their flows (the lab: 0.5-4 % of acks against ~1e-5 per hop for probes, one NIC's
bursts 5x the others'); tested against the probes' background they made every fabric link
faulty.

The kept links' strength (what ``confidence`` is the posterior of) is that LLR against the
learned background instead of against the fit's floor: loss that barely stands out of the
background reads as barely confident, and a link whose loss is the background's is not
reported at all, whatever the floor.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .config import TriangulateConfig
from .incidence import Incidence
from .loss import LossFit, poisson_llr


class AckRows(NamedTuple):
    """Where a fit's rows are acks (``engine._with_acks``): from row ``start`` on, one per
    flow, each received by its flow's source NIC and sent by its destination NIC; the
    incidence of the rows before (the probes') and of those (the acks'), each kept per
    layout with its own cached factors."""

    start: int
    probes: Incidence
    twin: Incidence
    receiver: np.ndarray  # per ack row: the NIC number counting it (the flow's source)
    sender: np.ndarray  # and the NIC answering with it (the flow's destination)
    nic_host: np.ndarray  # per NIC number, its host's (one agent per host)


_HOUR_S = 3600.0
_FITS_PER_WINDOW = 3  # the window's fit, the long-horizon fit and the onset fit


def alarm_llr(cfg: TriangulateConfig, window_s: float) -> float:
    """The LLR a link's loss needs against the background: log(1/alpha) per test."""
    tests_per_hour = _FITS_PER_WINDOW * _HOUR_S / max(window_s, 1e-3)
    return math.log(tests_per_hour / cfg.false_alarms_per_link_hour)


def background(
    fit: LossFit,
    inc: Incidence,
    sent: np.ndarray,
    lost: np.ndarray,
    need: float,
    s_l: np.ndarray | None = None,
) -> tuple[float, float, float]:
    """The background loss per hop: lost / hop-packets over every row of ``inc``, then
    without the rows of the chosen links whose loss reaches ``need`` against the rest (0 with
    nothing sent); with the lost packets and hop-packets it is the ratio of. ``s_l``: the
    chosen links' weighted packets over these rows when the fit's (its ``sent``) are over
    more (the probes' or the acks' rows of a fit over both).

    "The rest": each link is tested against the rate of every row's packets and losses but
    its own rows' hop-packets and the loss the fit puts on it. Against the rate of all rows,
    a fault that was the window's only loss raised its own background: on the lab's rail
    3L4S uplink, 5 lost of ~400 probes (1 %) read as 0.3 expected, not heavy, and the gate
    then tested them against that same inflated rate (LLR 9.6) instead of the floor."""
    h = inc.hops()
    s_l = fit.sent[fit.links] if s_l is None else s_l
    own = inc.hop_factors(sent)[1][fit.links] * s_l
    hs, lo = float(sent @ h), float(lost.sum())
    if hs <= 0:
        return 0.0, 0.0, 0.0
    x = fit.rate * s_l
    rest = hs - own
    q_rest = np.where(rest > 0, np.maximum(lo - x, 0.0) / np.maximum(rest, 1e-300), lo / hs)
    heavy = fit.links[poisson_llr(x, q_rest * own) >= need]
    if heavy.size:
        hit = inc.rows_of(heavy)
        hs -= float(sent[hit] @ h[hit])
        lo -= float(lost[hit].sum())
    lo, hs = max(lo, 0.0), max(hs, 0.0)
    return (lo / hs if hs > 0 else 0.0), lo, hs


def learned_floor(cfg: TriangulateConfig, lost: float, hop_sent: float) -> float:
    """The per-link loss the fits and the gate take as normal: ``background_loss``, lowered
    to what the long horizon's counts bound the background per hop by (``lost`` of
    ``hop_sent`` hop-packets: the Poisson upper bound at ``loss_llr``), never below
    ``background_loss_min``."""
    c = cfg.loss_llr
    upper = (lost + c + math.sqrt(c * c + 2.0 * lost * c)) / hop_sent if hop_sent > 0 else math.inf
    return min(cfg.background_loss, max(upper, cfg.background_loss_min))


def beyond_others_llr(
    fit: LossFit,
    inc: Incidence,
    sent: np.ndarray,
    lost: np.ndarray,
    i: int,
    e_bg: float,
    others: np.ndarray,
) -> float:
    """The LLR (a Chernoff bound) of every lost packet of the rows that may cross the fit's
    ``i``-th link against what the background (``e_bg``) and the fit's *other* links (those
    of the ``others`` mask over ``fit.links``) explain, with the path draw of spread rows as
    part of the null.

    The others are the links significant against the background themselves: the fit's
    background picks (a long-horizon fit keeps 5-25 at background rates) absorb some of the
    background ``e_bg`` already counts, and counted twice they hid a weak fault in windows
    it passed the first test in (``test_tri_hold``: 0.05 % on a spine downlink).

    A row spread over ECMP candidates takes one real path: where another chosen link lies on
    some of its candidates, its loss is that link's rate or nothing, not the even split the
    fit gives it. Summed over a few rows the draw varies far past Poisson (a NIC whose incoming
    rows cross a lossy spine more often than 1/N shows excess loss that only its access link
    can take; issue 28, host 3L 3S). Per such row ``r``: ``a_r`` the summed rates of its
    spread chosen links, ``m_r`` their weighted sum (its mean over the draw, since ``w_rk`` is
    the fraction of its candidates crossing k); a path's rate is in ``[0, a_r]``, so by
    convexity the row's moment generating function is at most that of the two-point draw
    ``a_r`` with probability ``m_r / a_r``, else 0. Given its path a row's lost packets are
    binomial: ``sent_r`` packets at ``1 - (1 - k_r)(1 - a_r B_r)``, ``k_r`` the loss of its
    known-path chosen links. Binomial, not Poisson: a row through a dead link (rate ~1) loses
    exactly its packets, where a Poisson of that mean has a spread of its square root, which
    hid a 1 % fault on a spine downlink beside a dead NIC (``test_tri_hosts``). The
    background is Poisson. The bound ``sup_t t·y - log M(t)`` of that null is returned; with
    no other link on its rows it is the Poisson LLR of ``y >= x_l`` against ``e_bg``, so
    never below the plain test's there."""
    link = int(fit.links[i])
    rows = inc.rows_of(np.array([link]))
    y = float(lost[rows].sum())
    mask = others.copy()
    mask[i] = False
    shared = np.intersect1d(rows, inc.rows_of(fit.links[mask]), assume_unique=True)
    if not shared.size:
        return chernoff_llr(y, e_bg, np.empty(0), np.empty(0), np.empty(0), np.empty(0))
    rate = np.zeros(inc.n_links + 1)
    rate[fit.links[mask]] = np.clip(fit.rate[mask], 0.0, 1.0)
    r, lk, w = inc.entries(shared)
    spread = w < 1.0 - 1e-9
    a = np.minimum(np.bincount(r[spread], rate[lk[spread]], shared.size), 1.0)
    m = np.bincount(r[spread], (w * rate[lk])[spread], shared.size)
    with np.errstate(divide="ignore"):  # a dead link: log(0), the row surely lost
        kept = np.bincount(r[~spread], np.log1p(-rate[lk[~spread]]), shared.size)
    k = -np.expm1(kept)
    pi = np.divide(m, a, out=np.zeros(shared.size), where=a > 0)
    return chernoff_llr(y, e_bg, sent[shared], k, a, np.clip(pi, 0.0, 1.0))


def chernoff_llr(
    y: float, mu: float, n: np.ndarray, k: np.ndarray, a: np.ndarray, pi: np.ndarray
) -> float:
    """``sup_{t >= 0} t·y - log E[e^{tX}]``, X = Poisson(mu) + Σ_r Binomial(n_r, p_r), p_r
    = ``k_r`` or, with probability ``pi_r``, ``1 - (1 - k_r)(1 - a_r)``: bisection on the
    (decreasing) derivative of the concave objective."""
    mu = max(mu, 1e-12)
    p = 1.0 - (1.0 - k) * (1.0 - a)
    if y <= mu + float(n @ (k + pi * (p - k))):
        return 0.0
    with np.errstate(divide="ignore"):  # pi 0 or 1: one branch only
        lq, lp = np.log1p(-pi), np.log(pi)

    def branches(u: float) -> tuple[np.ndarray, np.ndarray]:
        return lq + n * np.log1p(k * u), lp + n * np.log1p(p * u)

    def slope(t: float) -> float:
        u = math.expm1(t)
        b0, b1 = branches(u)
        on = np.exp(b1 - np.logaddexp(b0, b1))  # the draw's weight on the lossy path
        mean = on * n * p / (1.0 + p * u) + (1.0 - on) * n * k / (1.0 + k * u)
        return y - math.exp(t) * (mu + float(mean.sum()))

    lo, hi = 0.0, math.log(y / mu)  # the slope is <= 0 there: the rows only add
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if slope(mid) > 0 else (lo, mid)
    u = math.expm1(lo)
    return max(lo * y - mu * u - float(np.logaddexp(*branches(u)).sum()), 0.0)


def without_one_agent_llr(
    fit: LossFit,
    inc: Incidence,
    sent: np.ndarray,
    lost: np.ndarray,
    acks: AckRows,
    exp: np.ndarray,
    i: int,
) -> float:
    """The Poisson LLR of the lost acks the fit puts on its ``i``-th link against what the
    acks' background explains on every ack row that may cross it (``exp`` per ack row), with
    no host's rows counted above the runner-up's rate: per side (the hosts counting the acks,
    then those sending them), each host's share of the link's lost acks is capped at its
    expected share times the second highest ratio of lost to expected among the hosts; the
    lesser LLR of the two sides. A row's lost acks go to the link by the fit's share of the
    row's loss (its EM responsibility, the background ``exp`` included), so uncapped they sum
    to the loss the first test reads.

    A late ack counts lost, and lateness is one agent's: on the lab (rail 2L2S) one NIC
    "lost" 36 of its ~1370 acks to the other leaf in a window, the other NICs of its leaf
    1-9, and none of its ~1170 acks inside its own leaf (acks of a pair reordered over two
    spines); the next windows, another NIC of the same leaf. Spread over the fabric links
    its acks may cross, three such windows made a healed link's tie group `faulty` again
    22 s after the heal. A link dropping acks drops them on every pair that crosses it, so
    capped it still stands out; one agent's burst does not. Capping at the runner-up, not
    leaving the top host out, keeps the evidence a real fault has on a leaf of a few hosts
    (a 5 % downlink seen through the acks into a leaf of 8 hosts lost a quarter of its LLR
    without its top host). So the acks alone never name an access link: its ack rows are
    one NIC's, and a link that drops them drops that NIC's probes too, which the probes'
    fit sees."""
    link = int(fit.links[i])
    rows = inc.rows_of(np.array([link]))
    rows = rows[rows >= acks.start]
    if not rows.size:
        return 0.0
    a = rows - acks.start
    r, lk, w = inc.entries(rows)
    rate = w * fit.rate_of(inc.n_links)[lk]
    mine = np.bincount(r, np.where(lk == link, rate, 0.0), rows.size)
    total = np.bincount(r, rate, rows.size) + exp[a] / np.maximum(sent[rows], 1e-300)
    y = lost[rows] * np.divide(mine, total, out=np.zeros(rows.size), where=total > 0)
    e = exp[a]
    llr = math.inf
    for nic in (acks.receiver[a], acks.sender[a]):
        host = acks.nic_host[nic]
        y_h, e_h = np.bincount(host, y), np.bincount(host, e)
        ratio = np.sort(np.divide(y_h, e_h, out=np.zeros(e_h.size), where=e_h > 0))
        cap = ratio[-2] if ratio.size > 1 else 0.0
        llr = min(llr, float(poisson_llr(np.minimum(y_h, cap * e_h).sum(), e.sum())))
    return llr


class LossEvidence:
    """The significance gate of both fits and the heal test of long-horizon links; keeps the
    last background (per hop, and per link) and, per link, the heal test's running
    statistic."""

    def __init__(self, cfg: TriangulateConfig, n_links: int) -> None:
        self.cfg = cfg
        self.q = cfg.background_loss  # the last fit's background per hop
        self.support = (0.0, 0.0)  # the lost packets and hop-packets it was learned from
        self.link_q = np.full(n_links, cfg.background_loss)  # and per link (its rows' rate)
        self.cusum = np.zeros(n_links)

    def gate(
        self,
        fit: LossFit,
        inc: Incidence,
        sent: np.ndarray,
        lost: np.ndarray,
        window_s: float,
        floor: float,
        acks: AckRows | None = None,
    ) -> LossFit:
        """``fit`` (made with ``floor`` as its per-link background) with only its links whose
        loss is significant against their rows' background, their ``llr`` replaced by the LLR
        of that test and the per-link background rate attached. ``acks``: the fit's rows from
        there on are acks, with a background of their own (``_ack_null``), and a link's evidence
        there must not rest on one agent's rows (``without_one_agent_llr``)."""
        cfg = self.cfg
        if acks is None:
            s_l = fit.sent[fit.links]
            self.q, *support = background(fit, inc, sent, lost, cfg.loss_llr)
            hops, reach = inc.hop_factors(sent)
            e_bg = self.q * reach[fit.links] * s_l
        else:
            hops, e_bg, support, exp = self._ack_null(fit, inc, sent, lost, acks)
            s_l = fit.sent[fit.links]
        self.support = (support[0], support[1])
        self.link_q = np.maximum(self.q * hops, floor)
        e_l = np.maximum(e_bg, floor * s_l)
        level = alarm_llr(cfg, window_s)
        llr = poisson_llr(fit.rate * s_l, e_l)
        keep = llr >= level
        if acks is not None:  # none resting on one agent's late acks (few links)
            for i in np.flatnonzero(keep).tolist():
                llr[i] = min(llr[i], without_one_agent_llr(fit, inc, sent, lost, acks, exp, i))
            keep = llr >= level
        passed = keep.copy()  # the others of the second test: links significant themselves
        # alone, a link's second test is the Poisson one on all its rows' loss (>= the first)
        for i in np.flatnonzero(passed).tolist() if passed.sum() > 1 else []:  # few links
            beyond = beyond_others_llr(fit, inc, sent, lost, i, float(e_l[i]), passed)
            llr[i] = min(llr[i], beyond)
        keep = llr >= level
        return LossFit(
            fit.links[keep], fit.rate[keep], llr[keep], fit.sent, fit.lost, fit.spread,
            self.link_q,
        )  # fmt: skip

    def _ack_null(
        self, fit: LossFit, inc: Incidence, sent: np.ndarray, lost: np.ndarray, acks: AckRows
    ) -> tuple[np.ndarray, np.ndarray, list[float], np.ndarray]:
        """The gate's null where the fit's rows from ``acks.start`` on are acks: (per link,
        the mean hop count of its probe rows; per chosen link, the loss the background
        explains on all rows that may cross it; the probes' (lost, hop-packets); per ack row,
        the lost acks the background explains, at the least floor at least).

        Acks get a background per hop of their own. The agents count an ack lost when a
        later ack answered for its pair first, so an ack that comes late is lost too: on the
        lab's 2-vCPU box eight busy agents "lost" 0.5-4 % of all acks, on every flow, while
        the probes lost ~1e-5 per hop. Learned over probes and acks together, that rate was
        ~3x below what every ack row lost, and each fabric link carrying acks (through the ack
        paths' spread) passed the gate. And that loss is not Poisson: it comes and goes with
        how busy each agent is (per NIC, 4 to 18 lost of ~1300 acks in one window of the lab's
        5 % uplink run, around a mean of 9), so a fit that spreads one agent's bad second over
        the fabric links of its leaf passed a Poisson test (``spine1->leaf3`` at 0.7 %, LLR
        23): ``without_one_agent_llr`` caps each agent's share. (Session 34 divided the acks'
        counts by their dispersion over the NICs instead, a quasi-Poisson scale of the whole
        window. One NIC's burst on the lab passed it (the window of the episode above: scale
        8.8, the tie group still at LLR 75), the fit's rate on the links the burst crosses
        explaining it out of the scale; and beside the cap it only cost power: scales of
        2.7-4 in the simulator with agents late on 0.5 % of acks left a reverse-path fault
        seen in acks alone `suspect` for 8 windows.)"""
        n, need, links = acks.start, self.cfg.loss_llr, fit.links
        parts = []  # per class: its rows' (packets, lost, background per hop)
        for inc_c, rows in ((acks.probes, slice(None, n)), (acks.twin, slice(n, None))):
            sent_c, lost_c = sent[rows], lost[rows]
            s_c = inc_c.link_sums(sent_c)[links]
            parts.append((sent_c, *background(fit, inc_c, sent_c, lost_c, need, s_c)))
        (_, self.q, *support), (a_sent, q_ack, *_) = parts
        per_row = np.concatenate([self.q * parts[0][0], q_ack * a_sent]) * inc.hops()
        e_bg = inc.link_sums(per_row, whole=True)[links]
        hops = acks.probes.hop_factors(parts[0][0])[0]
        exp = np.maximum(per_row[n:], self.cfg.background_loss_min * a_sent)
        return hops, e_bg, support, exp

    def healed(
        self, links: np.ndarray, rate: np.ndarray, sent: np.ndarray, lost: np.ndarray
    ) -> np.ndarray:
        """Which of the long-horizon ``links`` (at their ``rate``) this window's counts of
        their flows (``sent``, ``lost``) show healed.

        A CUSUM of the log-likelihood ratio "background only" against "background + rate",
        window after window (Poisson: ``lost · log(q_l / (q_l + r)) + sent · r``, ``q_l`` the
        link's background rate from the last gate): clean windows
        add to it, a window with the fault's losses takes it back towards 0, and a link is
        healed once it reaches ``loss_llr``. One window is enough when it carried ~12/r
        packets without a loss; at low rates the windows add up, so a 0.05 % fault on a link
        of a few thousand packets a second clears within 30 s of its heal, where the old
        one-window rule (10 lost packets expected) kept it for minutes. A link leaving the
        long-horizon set starts again from 0."""
        q = self.link_q[links]
        step = lost * np.log(q / (q + rate)) + sent * rate
        now = np.zeros_like(self.cusum)
        now[links] = np.maximum(self.cusum[links] + step, 0.0)
        done = now[links] >= self.cfg.loss_llr
        now[links[done]] = 0.0
        self.cusum = now
        return done
