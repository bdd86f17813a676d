"""Delay tomography: excess one-way delay per flow over its own baseline, located on links.

- Baseline: per flow, the minimum ``owd_min`` over a trailing period. It is kept as a running
  minimum that creeps up by ``baseline_slack_ns_per_s`` so a path or clock change is absorbed
  over minutes while a fault (seconds to minutes) stays visible.
- Excess ``d_f = owd_min_f - baseline_f``. Queueing makes a *fraction* of flows slow; a delay
  fault makes *every* flow through the link slow by the same amount, so a link's statistic is
  a low quantile (``delay_quantile``, 0.25) of its flows' excess, compared with that link's
  own healthy level. Not the median: the per-flow excess is bimodal (a flow whose probes all
  queued somewhere sits microseconds up; 30-45 % of flows under normal load), so the median of
  a link with few flows — a sampled core link has ~40-100 — jumps to the queueing mode
  whenever half of them happen to be there, which reported healthy core/agg links on the
  k=32 fat-tree. A low quantile moves only when three quarters of the flows are late, which a
  delay fault does and queueing does not; it also keeps links that share a minority of their
  flows with a delayed link from moving.
- Clocks: fleet-time one-way delays carry the clock error of both hosts. A NIC whose incoming
  flows are late by X while its outgoing flows are early by X has had a clock step (the
  round trip is unchanged): the host's baselines are rebased and a clock event is reported for
  the host — never a link. More generally, the one-way delay of an access link cannot be
  separated from its host's clock offset, so the access links are judged on round-trip sums:
  half of each NIC's in/out median difference is removed as a possible clock term, which leaves
  an access-link delay D split D/2 + D/2 over the NIC's two access links; the attribution
  stage reports the NIC with the round-trip sum D.
- Common rise: what moves every flow alike (the median NIC's in/out shift, when positive)
  is taken out of every flow's excess first: a fleet-wide slowdown is not a link.
- Location: links whose median excess stands above their healthy level by ``delay_min_ns``
  and ``delay_z`` healthy standard deviations are taken greedily, largest first, and their
  estimate is subtracted from the flows crossing them before the next pick (explaining away the
  links that only share some flows with the bad one).
- Paths never reported: what is left late after that is tested per ECMP group
  (``group_delay``), on the flows late in this window and their last.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import _fast
from .config import TriangulateConfig
from .group_delay import GroupDelay, GroupDelayFinding
from .paths import SPORT_SPAN, FlowBatch
from .quantile import Groups, bins_of
from .store import FlowStore, unique

_SIGMA0_NS = 500.0  # healthy spread assumed before a link has history
_SIGMA_FLOOR_NS = 100.0
_NIC_SHIFT_Q = 0.2  # quantile of a NIC's flows taken as its shift (see _nic_medians)
_COMMON_MIN_NICS = 8  # NICs with a shift needed to tell a fleet-wide rise (_common_rise)
_TIE_SHARE = 0.9  # share of both links' timed flows in common that makes two links a tie


@dataclass
class DelayFit:
    links: np.ndarray  # link numbers with excess delay
    excess: np.ndarray  # their estimated added delay, ns
    z: np.ndarray  # their excess in healthy standard deviations
    median: np.ndarray  # per link (all): median excess this window (NaN: no data)
    weight: np.ndarray  # per link (all): flows behind the median
    row_excess: np.ndarray  # per row: clock-corrected excess (NaN: no baseline yet)
    alarmed: np.ndarray  # per link (all): over the alarm threshold before explaining away
    clock_hosts: dict[int, float] = field(default_factory=dict)  # host number -> step ns
    ties: dict[int, list[int]] = field(default_factory=dict)  # chosen link -> see _tied
    groups: list[GroupDelayFinding] = field(default_factory=list)  # see group_delay


class DelayModel:
    def __init__(
        self,
        n_links: int,
        n_nics: int,
        nic_host: np.ndarray,
        groups: list[np.ndarray],
        cfg: TriangulateConfig,
    ):
        self.cfg, self.n_links, self.n_nics = cfg, n_links, n_nics
        self.nic_host = nic_host
        self.flows = FlowStore(
            {"base": (np.float64, np.nan, 0), "t": (np.int64, 0, 0), "late": (np.int8, -1, 0)}
        )
        self.mu = np.zeros(n_links)
        self.var = np.zeros(n_links)
        # windows a link was seen clean: a link is judged only after one (its first window
        # with a baseline has no healthy level yet, and a sampled access link is noisy then)
        self.seen = np.zeros(n_links, np.int64)
        self._judged: tuple = ()  # see _judged_entries
        self._by_nic: tuple = ()  # see _nic_groups
        self.group = GroupDelay(groups, n_links, cfg)

    def observe(self, b: FlowBatch) -> DelayFit:
        at = self.flows.locate(b.key)
        base = self.flows.cols["base"][at]
        d = b.owd_min - base
        meds = self._nic_medians(b, d)
        common = self._common_rise(meds)
        d, meds = d - common, (meds[0] - common, meds[1] - common, meds[2])
        clock = self._clock_events(meds)
        if clock:
            self._rebase(clock)
            d = b.owd_min - self.flows.cols["base"][at] - common
            meds = self._nic_medians(b, d)
        d = d - self._access_split(b, meds)
        fit, resid, floor = self._locate(b, d)
        fit.clock_hosts = clock
        _, _, unknown, n_sure = self._judged_entries(b)
        unknown = unknown[np.isfinite(resid[b.ent_row[unknown]])]  # none in a first window
        if unknown.size:
            late = self._persistently_late(b, at, resid >= floor, unknown)
            fit.groups = self.group.observe(b, resid, late, unknown, n_sure)
        self._update_baselines(b, at)
        self._learn_healthy(fit)
        return fit

    # ---- clocks and access links ----------------------------------------------------------
    def _nic_medians(self, b: FlowBatch, d: np.ndarray):
        """A NIC's in/out shift: a clock or its access link moves *every* flow of the NIC, a
        fabric link behind its leaf only the flows hashed across it (ECMP leaves others on
        other spines), so a low quantile — not the median — keeps fabric faults out of it."""
        into, out_of = self._nic_groups(b)
        q, bins = _NIC_SHIFT_Q, bins_of(d)
        med_in, n_in = into.quantile(bins, q)
        med_out, n_out = out_of.quantile(bins, q)
        enough = (n_in >= self.cfg.delay_min_flows) & (n_out >= self.cfg.delay_min_flows)
        return med_in, med_out, enough

    def _nic_groups(self, b: FlowBatch) -> tuple[Groups, Groups]:
        """The batch's rows by receiving and by sending NIC; kept while the batch's NIC
        columns are the same arrays (the engine reuses them until the flows change)."""
        got = self._by_nic
        if not got or got[0] is not b.dst or got[1] is not b.src:
            n = self.n_nics
            got = self._by_nic = (b.dst, b.src, Groups(b.dst, n), Groups(b.src, n))
        return got[2], got[3]

    @staticmethod
    def _common_rise(meds) -> float:
        """What moved every flow of the fleet alike (the median NIC's shift, in and out), when
        it rose: not a link. On the lab, both cores busy with a fault being injected raised
        every flow's one-way delay by ~1.1 us for a few windows, and access links next to the
        faulted one were blamed; in the simulator a 1.5 us rise of every flow made dozens of
        links, switches and NICs faulty. A link fault moves a minority of NICs' low quantiles."""
        med_in, med_out, enough = meds
        shift = np.concatenate([med_in[enough], med_out[enough]])
        if shift.size < 2 * _COMMON_MIN_NICS:
            return 0.0
        return max(float(np.median(shift)), 0.0)

    def _clock_events(self, meds) -> dict[int, float]:
        """Hosts whose NICs all show in = -out (round trip unchanged) beyond the step size."""
        med_in, med_out, enough = meds
        c = (med_in - med_out) / 2
        s = med_in + med_out
        step = enough & (np.abs(c) >= self.cfg.clock_step_min_ns) & (np.abs(s) <= 0.5 * np.abs(c))
        out: dict[int, float] = {}
        for h in np.unique(self.nic_host[step]).tolist():
            nics = np.flatnonzero((self.nic_host == h) & enough)
            if step[nics].all() and np.ptp(c[nics]) <= 0.2 * np.abs(c[nics]).max():
                out[int(h)] = float(np.mean(c[nics]))
        return out

    def _rebase(self, clock: dict[int, float]) -> None:
        pair = self.flows.keys // SPORT_SPAN
        src_h = self.nic_host[pair // self.n_nics]
        dst_h = self.nic_host[pair % self.n_nics]
        base = self.flows.cols["base"]
        for h, c in clock.items():
            base[dst_h == h] += c
            base[src_h == h] -= c

    def _access_split(self, b: FlowBatch, meds) -> np.ndarray:
        """Per row, the possible clock term of its two endpoints (see the module doc)."""
        med_in, med_out, enough = meds
        a = np.where(enough, (med_in - med_out) / 2, 0.0)
        return a[b.dst] - a[b.src]

    # ---- location -------------------------------------------------------------------------
    def _most_consistent(
        self,
        b: FlowBatch,
        e: np.ndarray,
        ex: np.ndarray,
        wt: np.ndarray,
        z: np.ndarray,
        ok: np.ndarray,
    ) -> int:
        """The candidate whose flows are late most consistently (share of its flows with at
        least half its excess), then the largest z. A delayed fabric link slows *all* its
        flows; the uplink of a NIC behind it only those hashed across it, though its statistic
        can be as large: taking it first would blame the access link too."""
        w = b.ent_w * (e[b.ent_row] >= 0.5 * ex[b.ent_link])
        share = np.bincount(b.ent_link, w, self.n_links) / np.maximum(wt, 1e-12)
        score = np.round(share, 1) + 1e-9 * np.minimum(z, 1e8)
        return int(np.argmax(np.where(ok, score, -np.inf)))

    def _locate(self, b: FlowBatch, d: np.ndarray) -> tuple[DelayFit, np.ndarray, float]:
        """The fit, the rows' excess left after the chosen links, and the window's floor."""
        cfg = self.cfg
        e = d.copy()
        row_bins = bins_of(e)
        # Short windows hold few probes per flow: one queue burst moves a whole link's median.
        span_s = max(b.end_ns - b.start_ns, 1) * 1e-9
        floor = cfg.delay_min_ns * max(1.0, (1.0 / span_s) ** 0.7)
        chosen: dict[int, float] = {}
        z_of: dict[int, float] = {}
        ties: dict[int, list[int]] = {}
        (e_link, e_row, e_w), by_link, _, _ = self._judged_entries(b)
        med, wt = by_link.quantile(row_bins, cfg.delay_quantile)
        med0, wt0, sigma = med, wt, self._sigma(med, wt)
        ex, z, ok = self._alarms(med, wt, sigma, floor)
        alarmed = ok.copy()
        for step in range(16):
            if step:  # the links' medians once the chosen ones are explained away
                med, wt = by_link.quantile(row_bins, cfg.delay_quantile)
                ex, z, ok = self._alarms(med, wt, sigma, floor)
            ok[list(chosen)] = False
            ok[[c for t in ties.values() for c in t]] = False  # see _tied
            if not ok.any():
                break
            best = self._most_consistent(b, e, ex, wt, z, ok)
            chosen[best] = float(ex[best])
            z_of[best] = float(z[best])
            tied = self._tied(best, ok, wt, row_bins >= 0, (e_link, e_row, e_w))
            if tied:
                ties[best] = tied
            on = b.ent_link == best
            np.subtract.at(e, b.ent_row[on], b.ent_w[on] * ex[best])
            moved = np.unique(b.ent_row[on])
            row_bins[moved] = bins_of(e[moved])
        links = np.array(list(chosen), np.int64)
        fit = DelayFit(
            links,
            np.array([chosen[i] for i in links.tolist()]),
            np.array([z_of[i] for i in links.tolist()]),
            med0,
            wt0,
            d,
            alarmed,
            ties=ties,
        )
        return fit, e, floor

    def _alarms(
        self, med: np.ndarray, wt: np.ndarray, sigma: np.ndarray, floor: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per link: (excess median delay over its healthy level, its z, alarmed)."""
        cfg = self.cfg
        ex = med - self.mu
        z = ex / sigma
        ok = (wt >= cfg.delay_min_flows) & (ex >= floor) & (z >= cfg.delay_z)
        ok &= self.seen > 0
        return ex, z, ok

    def _tied(
        self,
        best: int,
        ok: np.ndarray,
        wt: np.ndarray,
        timed: np.ndarray,
        ent: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> list[int]:
        """Other alarmed links whose timed flows are nearly the same as ``best``'s: nothing in
        this window tells them apart (at start-up, while only some hosts' clocks are trusted,
        a delayed uplink and one downlink may share every timed flow). Picking one of them
        confidently blamed the wrong link half the time; they are reported together, each at
        1/N (``attribution``), until flows that cross only one of them are timed."""
        others = np.flatnonzero(ok)
        others = others[others != best]
        if others.size == 0:
            return []
        e_link, e_row, e_w = ent
        on = e_link == best
        mine = np.zeros(timed.size, bool)
        mine[e_row[on][timed[e_row[on]]]] = True
        hit = mine[e_row]
        shared = np.bincount(e_link[hit], e_w[hit], self.n_links)
        need = _TIE_SHARE * np.maximum(wt[others], wt[best])
        return others[shared[others] >= need].tolist()

    def _judged_entries(self, b: FlowBatch) -> tuple[tuple, Groups, np.ndarray, np.ndarray]:
        """(link, row, weight) of the entries a link's statistic is taken over: its flows with
        a known path when it has enough of them. A flow whose path is unknown is spread over
        the ECMP candidates, and only the share of those flows that really crossed a delayed
        link is late — too few for a low quantile (with two spines, half): mixing them in
        hides the fault (``group_delay`` judges those). Also the unknown-path entries and the
        known-path flows per link. Kept while the batch's entries are the same arrays (the
        engine reuses them until the flows or their paths change)."""
        got = self._judged
        if got and got[0] is b.ent_link and got[1] is b.ent_w and got[2] is b.ent_row:
            return got[3]
        sure = b.ent_w >= 1.0 - 1e-9
        n_sure = np.bincount(b.ent_link[sure], minlength=self.n_links)
        use = sure | (n_sure < self.cfg.delay_min_flows)[b.ent_link]
        ent = b.ent_link[use], b.ent_row[use], b.ent_w[use]
        by_link = Groups(ent[0], self.n_links, ent[2], item=ent[1])
        out = ent, by_link, np.flatnonzero(~sure), n_sure
        self._judged = (b.ent_link, b.ent_w, b.ent_row, out)
        return out

    def _sigma(self, med: np.ndarray, wt: np.ndarray) -> np.ndarray:
        """Healthy spread per link: its own learned spread, but at least the robust spread of
        all links this window (links are alike; this also scales with the window length)."""
        ok = np.isfinite(med) & (wt >= self.cfg.delay_min_flows)
        dev = (med - self.mu)[ok]
        mad = 1.4826 * np.median(np.abs(dev - np.median(dev))) if dev.size >= 8 else _SIGMA0_NS
        return np.maximum(np.sqrt(self.var), max(mad, _SIGMA_FLOOR_NS))

    def _persistently_late(
        self, b: FlowBatch, at: np.ndarray, late: np.ndarray, unknown: np.ndarray
    ) -> np.ndarray:
        """Per row, for the flows of unknown path (``group_delay``): 1 if late this window and
        in the flow's last one, 0 if not, -1 if its last window was not judged (a first
        window with a baseline: all 0 would read as a healthy share of none). A delayed link
        makes the same flows late every window (ECMP hashing is stable); queueing makes a
        different few late each time."""
        rows = unique(b.ent_row[unknown])
        col = self.flows.cols["late"]
        out = np.full(b.n, -1, np.int8)
        prev = col[at[rows]]
        out[rows] = np.where(prev < 0, -1, late[rows] & (prev == 1))
        col[at[rows]] = late[rows]
        return out

    # ---- state ----------------------------------------------------------------------------
    def _update_baselines(self, b: FlowBatch, at: np.ndarray) -> None:
        _fast.baseline_update(
            self.flows.cols["base"], self.flows.cols["t"], np.ascontiguousarray(at, np.int64),
            np.ascontiguousarray(b.owd_min, np.float64), int(b.end_ns),
            float(self.cfg.baseline_slack_ns_per_s),
        )  # fmt: skip

    def _learn_healthy(self, fit: DelayFit) -> None:
        """EWMA of each clean link's median excess: its normal queueing level and spread.
        Not clean: every link over the alarm threshold, the chosen ones (explaining away only
        lowers the others) and also one left unchosen because another explained its flows
        (on the lab, a delayed uplink lost the pick to the downlink its few timed flows
        shared; learned as healthy for 12 windows, its level rose to 57 us and its spread to
        92 us, and the next 225 us delay went unreported)."""
        clean = np.isfinite(fit.median) & (fit.weight >= self.cfg.delay_min_flows)
        clean &= ~fit.alarmed
        a = self.cfg.delay_ewma
        # Clip at 4 sigma: queue bursts widen the spread, a fault must not become "normal".
        sig = np.maximum(np.sqrt(self.var[clean]), _SIGMA0_NS)
        dev = np.clip(fit.median[clean] - self.mu[clean], -4 * sig, 4 * sig)
        self.mu[clean] += a * dev
        self.var[clean] = (1 - a) * (self.var[clean] + a * dev**2)
        self.seen[clean] += 1


def _reference_update_baselines(
    base: np.ndarray, t: np.ndarray, at: np.ndarray, obs: np.ndarray, end_ns: int, slack: float
) -> None:
    """The numpy definition of ``_fast.baseline_update`` (tests compare the two)."""
    at, obs = at[np.isfinite(obs)], obs[np.isfinite(obs)]  # no probe: nothing changes
    dt = np.maximum(end_ns - t[at], 0) * 1e-9
    crept = base[at] + slack * np.where(t[at] > 0, dt, 0.0)
    base[at] = np.where(np.isfinite(crept), np.fmin(crept, obs), obs)
    t[at] = end_ns
