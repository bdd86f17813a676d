"""Delay on links that only never-reported paths cross: found per ECMP group, not per link.

A flow whose path is unknown is spread over its ECMP candidates at weight 1/N, so a link's low
quantile (``delay``) cannot move: of the flows that might cross a delayed uplink only the 1/N
hashed onto it are late. The group sees it, though: each such flow crosses exactly one uplink of
its leaf (one member of the group, see ``ecmp``), so a delay on one member makes a *share* 1/N
of the group's flows late by the same amount, where a healthy group has its usual share of
late flows (queueing) — a binomial count, tested against that learned share.

- Which flows: a flow counts for a group when its candidate weights on the group's members sum
  to one (it certainly crosses one of them); only groups none of whose members has enough
  known-path flows for the per-link statistic are judged (those are located exactly).
- Late: residual excess (after the links already located are explained away) of at least the
  window's delay floor, in this window and the flow's last one. A delayed member makes the
  same flows late every window (ECMP hashing is stable); queueing a different few each time
  (persistently late on the k=8 fat-tree at load 0.2: ~0.5 % of a group's flows; late in one
  window: ~20 %).
- Reported: the late share must rise by at least ``_MIN_RISE`` (3/4) of 1/N over the group's
  healthy share — not half: a delayed core link of a k=8 fat-tree made 13 % of the flows into
  one of its leaves late, over half of the 1/4 an edge group's member would — by ``delay_z``
  standard deviations (binomial, or the group's own spread over clean windows if wider), on
  at least ``delay_min_flows`` extra late flows. Taken greedily, most significant first; a
  chosen group's late flows no longer count for the others (a delayed uplink of leaf A also
  makes a few flows into every other leaf late: they are explained by A's group).
- Size: the median excess of the group's late flows over that of its other flows (a healthy
  flow sits ~100 ns above its trailing minimum). Not a quantile of all its flows: flows late
  this window only (queueing) crowd the top and pushed that 15 % up on the reference fabric.
- The members cannot be told apart from end-to-end delays any more than from losses: every
  member is reported at confidence 1/N (``attribution``), and one reported path resolves it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import TriangulateConfig
from .ecmp import group_of_link
from .paths import FlowBatch
from .store import unique

_MIN_RISE = 0.75  # of 1/N: most of the flows one delayed member makes late (module doc)
_FULL = 1.0 - 1e-6  # candidate weights on a group summing to this: the flow crosses it


@dataclass
class GroupDelayFinding:
    group: int
    members: np.ndarray  # link numbers of the group
    excess: float  # estimated added delay, ns
    z: float  # rise of the late share in binomial standard deviations
    late: int  # late flows of the group this window
    flows: int  # flows counted for the group


class GroupDelay:
    """Per-group healthy late share, learned over clean windows, and the per-window test."""

    def __init__(self, groups: list[np.ndarray], n_links: int, cfg: TriangulateConfig) -> None:
        self.groups, self.cfg = groups, cfg
        self.first, self.second = group_of_link(groups, n_links)
        self.size = np.array([g.size for g in groups], np.float64)
        self.share = np.zeros(len(groups))  # healthy late share
        self.var = np.zeros(len(groups))  # its variance over clean windows
        self.seen = np.zeros(len(groups), np.int64)  # clean windows behind it

    def observe(
        self,
        b: FlowBatch,
        e: np.ndarray,
        late_rows: np.ndarray,
        unknown: np.ndarray,
        n_sure: np.ndarray,
    ) -> list[GroupDelayFinding]:
        """``e``: per row residual excess; ``late_rows``: per row, late this window and the
        last (1), not (0), not known (-1: left out); ``unknown``: entries of flows with
        unknown paths and an excess this window; ``n_sure``: per link, its known-path flows."""
        if unknown.size == 0 or not self.groups:
            return []
        rows, grp = self._memberships(b, unknown)
        judged = np.ones(len(self.groups), bool)
        for g_of in (self.first, self.second):
            has = g_of >= 0
            np.logical_and.at(judged, g_of[has], n_sure[has] < self.cfg.delay_min_flows)
        keep = judged[grp] & (late_rows[rows] >= 0)
        rows, grp = rows[keep], grp[keep]
        late = late_rows[rows] == 1
        found = self._pick(rows, grp, late, e)
        self._learn(grp, late, [f.group for f in found])
        return found

    def _memberships(self, b: FlowBatch, unknown: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row, group) of every unknown-path flow that certainly crosses one group member."""
        link, row, w = b.ent_link[unknown], b.ent_row[unknown], b.ent_w[unknown]
        n_groups = len(self.groups)
        keys, wts = [], []
        for g_of in (self.first, self.second):
            g = g_of[link]
            on = g >= 0
            keys.append(row[on] * n_groups + g[on])
            wts.append(w[on])
        uniq, inv = unique(np.concatenate(keys), inverse=True)
        full = uniq[np.bincount(inv, np.concatenate(wts)) >= _FULL]
        return full // n_groups, full % n_groups

    def _pick(
        self, rows: np.ndarray, grp: np.ndarray, late: np.ndarray, e: np.ndarray
    ) -> list[GroupDelayFinding]:
        cfg, n_groups = self.cfg, len(self.groups)
        n = np.maximum(np.bincount(grp, minlength=n_groups), 1).astype(np.float64)
        p0 = self.share
        sd = self._spread(n)
        late = late.copy()
        found: list[GroupDelayFinding] = []
        for _ in range(16):
            k = np.bincount(grp, late, n_groups)
            rise = k / n - p0
            z = rise / sd
            ok = (self.seen > 0) & (rise >= _MIN_RISE / self.size) & (z >= cfg.delay_z)
            ok &= rise * n >= cfg.delay_min_flows
            ok[[f.group for f in found]] = False
            if not ok.any():
                break
            g = int(np.argmax(np.where(ok, z, -np.inf)))
            mine = grp == g
            ee, hit = e[rows[mine]], late[mine]
            excess = float(np.median(ee[hit]) - (np.median(ee[~hit]) if (~hit).any() else 0.0))
            found.append(
                GroupDelayFinding(g, self.groups[g], excess, float(z[g]), int(k[g]), int(n[g]))
            )
            late &= ~np.isin(rows, rows[mine & late])  # explained: they count for no other group
        return found

    def _spread(self, n: np.ndarray) -> np.ndarray:
        """Healthy spread of a group's late share: binomial, but at least its own spread over
        clean windows (flows of one link queue together, so shares swing more than independent
        flows would). Not a spread across groups: on a small fabric half of them see a fault."""
        p0 = self.share
        return np.maximum(np.sqrt(np.maximum(p0, 1 / n) * (1 - p0) / n), np.sqrt(self.var))

    def _learn(self, grp: np.ndarray, late: np.ndarray, chosen: list[int]) -> None:
        """EWMA of each clean group's late share (its normal queueing) and of its spread."""
        n_groups = len(self.groups)
        n = np.bincount(grp, minlength=n_groups)
        clean = n >= self.cfg.delay_min_flows
        clean[chosen] = False
        dev = np.bincount(grp, late, n_groups)[clean] / n[clean] - self.share[clean]
        a = np.where(self.seen[clean] > 0, self.cfg.delay_ewma, 1.0)  # first: take it as is
        self.share[clean] += a * dev
        self.var[clean] = np.where(
            self.seen[clean] > 0, (1 - a) * (self.var[clean] + a * dev**2), 0.0
        )
        self.seen[clean] += 1
