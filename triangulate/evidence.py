"""Evidence before alarms: a link's loss must be significant against the background rate.

The loss fits (``loss.py``) pick links whose lost packets their likelihood explains better
than a tiny ``background_loss``; on a real fabric, where every path loses a few packets in a
million, that made a link with two lost probes in a window lossy (issue 28: access links
called faulty at 0.1-0.5 % measured on one flow). Each link a fit keeps is therefore tested
against the background its flows show anyway:

- the background ``q`` is a row's loss rate (whatever links it crosses, so no path length
  enters): lost / sent over every row, then again without the rows of the chosen links that
  the fit's own threshold (``loss_llr``) calls lossy even against that (a fault must not
  raise the background it is tested against), floored at ``background_loss``. Not over the
  rows crossing *no* chosen link: on background loss alone the fit picks dozens of links,
  and the rows left are those that happened to lose nothing (q read 2.6x low on the
  simulator, and background links passed);
- under "link l adds nothing", the lost packets the fit puts on l (``rate_l · S_l``, S_l the
  packets its flows carried, weighted by path share) are Poisson with mean ``q · S_l``;
- the link is kept when the Chernoff bound on that tail, ``P(X >= x) <= exp(-LLR(x, q S_l))``,
  is below ``alpha = false_alarms_per_link_hour / tests per link-hour`` (three fits — this
  window, the decayed long horizon and the onset horizon's last three windows, ``horizon`` —
  per window; 16.2 at 1 s windows and 1e-3). A bound,
  and the decayed counts are less dispersed than Poisson, so the rate of links passing per
  link-hour is at most the stated one; a ``faulty`` verdict needs two consecutive windows
  (``fault_windows``) on top.

The kept links' strength (what ``confidence`` is the posterior of) is that LLR against the
learned background instead of against the fit's floor: loss that barely stands out of the
background reads as barely confident, and a link whose loss is the background's is not
reported at all, whatever the floor.
"""

from __future__ import annotations

import math

import numpy as np

from .config import TriangulateConfig
from .incidence import Incidence
from .loss import LossFit, poisson_llr

_HOUR_S = 3600.0
_FITS_PER_WINDOW = 3  # the window's fit, the long-horizon fit and the onset fit


def alarm_llr(cfg: TriangulateConfig, window_s: float) -> float:
    """The LLR a link's loss needs against the background: log(1/alpha) per test."""
    tests_per_hour = _FITS_PER_WINDOW * _HOUR_S / max(window_s, 1e-3)
    return math.log(tests_per_hour / cfg.false_alarms_per_link_hour)


def background(
    fit: LossFit, inc: Incidence, sent: np.ndarray, lost: np.ndarray, need: float
) -> float:
    """A row's background loss rate: over every row, then without the rows of the chosen
    links whose loss reaches ``need`` against that (lost / sent; 0 with nothing sent)."""
    s, lo = float(sent.sum()), float(lost.sum())
    if s <= 0:
        return 0.0
    s_l = fit.sent[fit.links]
    heavy = fit.links[poisson_llr(fit.rate * s_l, lo / s * s_l) >= need]
    if heavy.size:
        rows = inc.rows_of(heavy)
        s -= float(sent[rows].sum())
        lo -= float(lost[rows].sum())
    return max(lo, 0.0) / s if s > 0 else 0.0


class LossEvidence:
    """The significance gate of both fits and the heal test of long-horizon links; keeps the
    last background rate and, per link, the heal test's running statistic."""

    def __init__(self, cfg: TriangulateConfig, n_links: int) -> None:
        self.cfg = cfg
        self.q = cfg.background_loss  # the last fit's background (a row's loss rate)
        self.cusum = np.zeros(n_links)

    def gate(
        self, fit: LossFit, inc: Incidence, sent: np.ndarray, lost: np.ndarray, window_s: float
    ) -> LossFit:
        """``fit`` with only its links whose loss is significant against the rows'
        background, their ``llr`` replaced by the LLR of that test."""
        cfg = self.cfg
        self.q = max(background(fit, inc, sent, lost, cfg.loss_llr), cfg.background_loss)
        if not fit.links.size:
            return fit
        s_l = fit.sent[fit.links]
        llr = poisson_llr(fit.rate * s_l, self.q * s_l)
        keep = llr >= alarm_llr(cfg, window_s)
        return LossFit(fit.links[keep], fit.rate[keep], llr[keep], fit.sent, fit.lost, fit.spread)

    def healed(
        self, links: np.ndarray, rate: np.ndarray, sent: np.ndarray, lost: np.ndarray
    ) -> np.ndarray:
        """Which of the long-horizon ``links`` (at their ``rate``) this window's counts of
        their flows (``sent``, ``lost``) show healed.

        A CUSUM of the log-likelihood ratio "background only" against "background + rate",
        window after window (Poisson: ``lost · log(q / (q + r)) + sent · r``): clean windows
        add to it, a window with the fault's losses takes it back towards 0, and a link is
        healed once it reaches ``loss_llr``. One window is enough when it carried ~12/r
        packets without a loss; at low rates the windows add up, so a 0.05 % fault on a link
        of a few thousand packets a second clears within 30 s of its heal, where the old
        one-window rule (10 lost packets expected) kept it for minutes. A link leaving the
        long-horizon set starts again from 0."""
        q = self.q
        step = lost * np.log(q / (q + rate)) + sent * rate
        now = np.zeros_like(self.cusum)
        now[links] = np.maximum(self.cusum[links] + step, 0.0)
        done = now[links] >= self.cfg.loss_llr
        now[links[done]] = 0.0
        self.cusum = now
        return done
