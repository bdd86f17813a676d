"""The audit's judgement: every link and NIC validated or failed, with its evidence.

Input: per-flow aggregates over the whole audit period (:class:`fleetlens.audit.data.Flows`) and the
topology. A pre-handover audit has minutes of data, so instead of the collector's per-window
verdicts (built to react in seconds) it fits the whole period at once:

- **Loss**: the triangulation engine's sparse maximum-likelihood loss tomography
  (``fleetlens.triangulate.loss.fit_loss``) on every flow's total sent/lost, over the flow's
  learned path (or, for a flow whose path was never learned, spread over its ECMP candidates
  by :mod:`fleetlens.audit.paths`). A link fails when the fit blames it at a rate
  of at least ``max_loss``.
- **Delay**: a degraded link that was bad before the audit started has no clean baseline in
  time, so each flow is compared with the *other paths of the same NIC pair* over the same
  period: ``excess_f = owd_f - min(owd of the pair's flows)``. Clock errors cancel (same two
  hosts, same period); a flow through a slow fabric link is late by that link's delay. Per
  fabric link the median excess of the flows crossing it; greedy, the most consistent link
  first (the largest share of late flows: a slow link delays all of its flows), each
  chosen link's delay subtracted from its flows before the next pick, so links that merely
  share flows with it are explained away). A link fails at ``max_delay_ns``. Access links
  cannot be judged this way (every path of a pair crosses the same two); their loss is fitted
  like any link's.
- **Host-side loss**: a host whose agent is starved of CPU drops probes on *all* its NICs at
  once; left alone, the fit would blame the access links. Each host with two or more NICs
  gets two pseudo-links in the fit (crossed by every flow from it / to it): one term explains
  loss spread over all its NICs better than any one access link, while loss on one NIC's
  cable stays on that cable. Host-side loss is reported per host as a warning (it is not the
  fabric), not as a failed link.
- **NICs** fail when one of their access links fails, or when they are silent (sent probes
  never answered / nothing received) over the audit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from scipy.stats import chi2

from fleetlens.audit.data import Flows
from fleetlens.audit.options import Thresholds
from fleetlens.audit.paths import FlowRows, TopoIndex, flow_rows
from fleetlens.topology import Topology
from fleetlens.triangulate.loss import fit_loss


@dataclass
class LinkJudgement:
    link_id: str
    tier: str
    status: str = "validated"  # validated | failed | unobserved
    reasons: list[str] = field(default_factory=list)
    flows: int = 0  # flows crossing it (known path, or candidate share > 0)
    probes: float = 0.0  # probe packets crossing it (candidate shares weighted)
    lost: float = 0.0  # lost packets of the flows crossing it
    loss_rate: float = 0.0  # the fit's estimate of the link's own loss (0: not blamed)
    loss_upper: float = 0.0  # 95 % upper bound on its loss, from the unexplained losses
    loss_llr: float = 0.0
    delay_flows: int = 0  # known-path flows behind the delay statistic
    excess_delay_ns: float | None = None  # median excess of its flows (None: no data)
    known_path_share: float = 0.0  # share of its probes from flows with a learned path
    # Links the evidence cannot tell this one from (flows without a learned path spread over
    # their ECMP candidates: a leaf's uplinks look alike), when this one failed on them.
    ambiguous_with: list[str] = field(default_factory=list)


@dataclass
class NicJudgement:
    nic_id: str
    status: str = "validated"
    reasons: list[str] = field(default_factory=list)
    flows_out: int = 0
    flows_in: int = 0
    sent_out: float = 0.0
    lost_out: float = 0.0
    sent_in: float = 0.0
    lost_in: float = 0.0


@dataclass
class Judgement:
    links: list[LinkJudgement]
    nics: list[NicJudgement]
    host_loss: dict[str, dict[str, float]]  # host -> {"sending"|"receiving": fitted loss}
    flows: int
    flows_known_path: int
    dropped: dict[str, int]
    pair_excess: list[dict]  # per (src host, dst host): max path excess ns (heatmap)


def judge(topo: Topology, flows: Flows, th: Thresholds) -> Judgement:
    pm = TopoIndex(topo)
    b = flow_rows(
        pm, pa.array(flows.src.tolist(), pa.string()), pa.array(flows.dst.tolist(), pa.string()),
        flows.sent, flows.received, flows.owd_ns, flows.path,
    )  # fmt: skip
    links = [LinkJudgement(lk.id, lk.tier) for lk in topo.links]
    host_loss = _loss(b, pm, topo, links, th)
    _ambiguity(b, links)
    excess = _delay(b, pm, links, th)
    _observed(links, th)
    nics = _nics(b, pm, links, th)
    return Judgement(
        links, nics, host_loss, b.n, int(b.known.sum()), b.dropped,
        _pair_excess(b, pm, topo, excess),
    )  # fmt: skip


# ---- loss ------------------------------------------------------------------------------------
def _host_terms(b: FlowRows, pm: TopoIndex, topo: Topology) -> tuple[np.ndarray, ...]:
    """Incidence of the host pseudo-links: number n_links + 2h (sending) and + 2h + 1
    (receiving) for host h, for hosts with >= 2 NICs (with one NIC a host term and the access
    link would be the same column)."""
    host_of = pm.nic_host
    hosts = topo.hosts
    multi = np.bincount(host_of, minlength=len(hosts)) >= 2
    rows = np.arange(b.n)
    out_ok, in_ok = multi[host_of[b.src]], multi[host_of[b.dst]]
    row = np.concatenate([rows[out_ok], rows[in_ok]])
    link = pm.n_links + np.concatenate([2 * host_of[b.src[out_ok]], 2 * host_of[b.dst[in_ok]] + 1])
    return row, link, np.ones(row.size)


def _loss(
    b: FlowRows, pm: TopoIndex, topo: Topology, links: list[LinkJudgement], th: Thresholds
) -> dict[str, dict[str, float]]:
    h_row, h_link, h_w = _host_terms(b, pm, topo)
    n_all = pm.n_links + 2 * len(topo.hosts)
    fit = fit_loss(
        np.concatenate([b.ent_row, h_row]), np.concatenate([b.ent_link, h_link]),
        np.concatenate([b.ent_w, h_w]), b.sent, b.lost, n_all,
        th.background_loss, th.loss_llr, 2.0,
    )  # fmt: skip
    rate_all = fit.rate_of(n_all)
    host_loss = {
        h: {"sending": float(rate_all[pm.n_links + 2 * i]),
            "receiving": float(rate_all[pm.n_links + 2 * i + 1])}
        for i, h in enumerate(topo.hosts)
        if rate_all[pm.n_links + 2 * i : pm.n_links + 2 * i + 2].any()
    }  # fmt: skip
    n_links = pm.n_links
    rate = rate_all[:n_links]
    llr = np.zeros(n_all)
    llr[fit.links] = fit.llr
    # Losses of each row the fit leaves unexplained, charged to every link of the row: the
    # most loss a link could still hide (a conservative bound for a validated link).
    row_rate = np.bincount(b.ent_row, b.ent_w * rate[b.ent_link], b.n)
    row_rate += np.bincount(h_row, h_w * rate_all[h_link], b.n)
    unexplained = np.maximum(b.lost - b.sent * np.minimum(row_rate, 1.0), 0.0)
    resid = np.bincount(b.ent_link, b.ent_w * unexplained[b.ent_row], n_links)
    upper = chi2.ppf(0.95, 2 * (np.floor(resid) + 1)) / 2 / np.maximum(fit.sent[:n_links], 1e-12)
    flows = np.bincount(b.ent_link, b.ent_w > 0, n_links)
    for i, lj in enumerate(links):
        lj.flows, lj.probes, lj.lost = int(flows[i]), float(fit.sent[i]), float(fit.lost[i])
        lj.loss_rate, lj.loss_llr = float(rate[i]), float(llr[i])
        lj.loss_upper = float(max(min(upper[i], 1.0), rate[i]))
        if rate[i] >= th.max_loss:
            lj.status = "failed"
            lj.reasons.append(
                f"loss {100 * rate[i]:.3g} % >= {100 * th.max_loss:.3g} % "
                f"(LLR {llr[i]:.0f}, {fit.lost[i]:.0f} of {fit.sent[i]:.0f} probes lost "
                "on flows crossing it)"
            )
    return host_loss


def _ambiguity(b: FlowRows, links: list[LinkJudgement], share: float = 0.9) -> None:
    """For each link failed on loss: its share of known-path evidence, and the links whose
    probes over the same flows are nearly the same (cosine >= 0.95) — with mostly unknown
    paths those carry the same evidence and the fit's pick among them is arbitrary."""
    n = len(links)
    known_w = np.bincount(b.ent_link, b.ent_w * b.sent[b.ent_row] * b.known[b.ent_row], n)
    total_w = np.bincount(b.ent_link, b.ent_w * b.sent[b.ent_row], n)
    for i, lj in enumerate(links):
        lj.known_path_share = float(known_w[i] / total_w[i]) if total_w[i] else 0.0
    for i, lj in enumerate(links):
        if lj.status != "failed" or lj.known_path_share >= share:
            continue
        mine = np.zeros(b.n)
        on = b.ent_link == i
        np.add.at(mine, b.ent_row[on], b.ent_w[on])
        dot = np.bincount(b.ent_link, b.ent_w * mine[b.ent_row] * b.sent[b.ent_row], n)
        norm = np.sqrt(np.bincount(b.ent_link, b.ent_w**2 * b.sent[b.ent_row], n))
        cos = dot / np.maximum(norm * norm[i], 1e-12)
        lj.ambiguous_with = [links[j].link_id for j in np.flatnonzero(cos >= 0.95) if j != i]
        if lj.ambiguous_with:
            lj.reasons.append(
                f"only {100 * lj.known_path_share:.0f} % of its probes had a learned path: "
                f"cannot be told from {', '.join(lj.ambiguous_with)}"
            )
        for j in np.flatnonzero(cos >= 0.95).tolist():
            if j != i and links[j].status != "failed":  # the whole group is suspect
                links[j].status = "failed"
                links[j].ambiguous_with = [lj.link_id]
                links[j].reasons.append(
                    f"shares the evidence of {lj.link_id} (loss {100 * lj.loss_rate:.3g} %): "
                    "without learned paths the fit cannot say which of them loses"
                )


# ---- delay -----------------------------------------------------------------------------------
def flow_excess(b: FlowRows, n_nics: int) -> np.ndarray:
    """Per row: one-way delay above the fastest flow of the same NIC pair (NaN: no delay)."""
    pair = b.src * n_nics + b.dst
    uniq, inv = np.unique(pair, return_inverse=True)
    best = np.full(uniq.size, np.inf)
    ok = np.isfinite(b.owd)
    np.minimum.at(best, inv[ok], b.owd[ok])
    return np.where(ok, b.owd - best[inv], np.nan)


def group_quantile(
    group: np.ndarray, value: np.ndarray, n: int, q: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """(q-quantile per group, count per group), NaN for empty groups; exact (one sort),
    linear interpolation between order statistics."""
    order = np.lexsort((value, group))
    g, v = group[order], value[order]
    count = np.bincount(g, minlength=n)
    start = np.concatenate([[0], np.cumsum(count)[:-1]])
    has = count > 0
    pos = q * np.maximum(count - 1, 0)
    lo = start + np.floor(pos).astype(np.int64)
    hi = start + np.ceil(pos).astype(np.int64)
    out = np.full(n, np.nan)
    frac = pos - np.floor(pos)
    out[has] = v[lo[has]] * (1 - frac[has]) + v[hi[has]] * frac[has]
    return out, count


def group_median(group: np.ndarray, value: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    return group_quantile(group, value, n, 0.5)


def _delay(b: FlowRows, pm: TopoIndex, links: list[LinkJudgement], th: Thresholds) -> np.ndarray:
    e = flow_excess(b, pm.n_nics)
    fabric = np.array([lj.tier != "access" for lj in links])
    # Known-path entries only: a flow's excess says nothing about links it may not cross.
    on = b.known[b.ent_row] & fabric[b.ent_link] & np.isfinite(e[b.ent_row])
    row, link = b.ent_row[on], b.ent_link[on]
    work = e.copy()
    chosen: list[int] = []
    for _ in range(len(links)):
        # Pick by consistency first: a slow link makes *every* flow through it late, a link
        # that merely shares flows with it only a fraction of them — a fraction that can still
        # be large when few flows have a learned path and those few are not a fair sample.
        med, cnt = group_median(link, work[row], pm.n_links)
        late = np.bincount(link, work[row] >= th.max_delay_ns, pm.n_links)
        frac = late / np.maximum(cnt, 1)
        ok = (cnt >= th.min_flows) & (med >= th.max_delay_ns)
        ok[chosen] = False
        if not ok.any():
            break
        best = int(np.argmax(np.where(ok, frac + 1e-12 * med, -np.inf)))
        chosen.append(best)
        hit = np.unique(row[link == best])
        work[hit] -= med[best]  # explain these flows' excess by the chosen link
        links[best].status = "failed"
        links[best].excess_delay_ns = float(med[best])
        links[best].delay_flows = int(cnt[best])
        links[best].reasons.append(
            f"excess one-way delay {med[best] / 1e3:.1f} µs >= {th.max_delay_ns / 1e3:.1f} µs "
            f"(median of {int(cnt[best])} flows, {100 * frac[best]:.0f} % of them late, vs "
            "the other paths of their NIC pairs)"
        )
    med, cnt = group_median(link, work[row], pm.n_links)
    for i, lj in enumerate(links):
        if fabric[i] and i not in chosen and cnt[i] > 0:
            lj.excess_delay_ns, lj.delay_flows = float(med[i]), int(cnt[i])
    return e


# ---- coverage and NICs -----------------------------------------------------------------------
def _observed(links: list[LinkJudgement], th: Thresholds) -> None:
    for lj in links:
        if lj.status == "validated" and lj.probes < th.min_probes:
            lj.status = "unobserved"
            lj.reasons.append(f"only {lj.probes:.0f} probes crossed it (< {th.min_probes:.0f})")


def _nics(
    b: FlowRows, pm: TopoIndex, links: list[LinkJudgement], th: Thresholds
) -> list[NicJudgement]:
    n = pm.n_nics
    cnt_out, cnt_in = np.bincount(b.src, minlength=n), np.bincount(b.dst, minlength=n)
    s_out, s_in = np.bincount(b.src, b.sent, n), np.bincount(b.dst, b.sent, n)
    l_out, l_in = np.bincount(b.src, b.lost, n), np.bincount(b.dst, b.lost, n)
    out = []
    for i, nic in enumerate(pm.nic_ids):
        nj = NicJudgement(
            nic, flows_out=int(cnt_out[i]), flows_in=int(cnt_in[i]),
            sent_out=float(s_out[i]), lost_out=float(l_out[i]),
            sent_in=float(s_in[i]), lost_in=float(l_in[i]),
        )  # fmt: skip
        for lk in (pm.nic_up[i], pm.nic_down[i]):
            if lk >= 0 and links[lk].status == "failed":
                nj.reasons.append(f"access link {links[lk].link_id} failed")
        if s_out[i] < th.min_probes or s_in[i] < th.min_probes:
            nj.reasons.append(
                f"too few probes (sent {s_out[i]:.0f}, probed by peers {s_in[i]:.0f})"
            )
        for what, s, lost in (("sent", s_out[i], l_out[i]), ("received", s_in[i], l_in[i])):
            if s > 0 and lost >= 0.5 * s:
                nj.reasons.append(f"silent: {lost:.0f} of {s:.0f} probes {what} were lost")
        nj.status = "failed" if nj.reasons else "validated"
        out.append(nj)
    return out


def _pair_excess(b: FlowRows, pm: TopoIndex, topo: Topology, e: np.ndarray) -> list[dict]:
    """Host pair -> largest path excess and median one-way delay (the report's heatmap)."""
    host_of = pm.nic_host
    nh = len(topo.hosts)
    hp = host_of[b.src] * nh + host_of[b.dst]
    ok = np.isfinite(e)
    worst = np.full(nh * nh, np.nan)
    np.fmax.at(worst, hp[ok], e[ok])
    med, _ = group_median(hp[ok], b.owd[ok], nh * nh)
    rows = []
    for k in np.flatnonzero(np.isfinite(worst)).tolist():
        rows.append(
            {
                "src_host": topo.hosts[k // nh], "dst_host": topo.hosts[k % nh],
                "max_path_excess_ns": float(worst[k]), "owd_median_ns": float(med[k]),
            }
        )  # fmt: skip
    return rows
