"""Devices and endpoints: report a switch instead of N links, a NIC/host instead of the network.

Input is the set of links the tomography found bad this window; output is the list of
subjects to report (links, switches, NICs, hosts), each with what implicated it.

- Switch: when at least ``device_fraction`` of a switch's fabric links are implicated — chosen
  by the fit, or showing at least half the loss / delay of the chosen links at that switch (the
  fit leaves the downlinks of a dead spine unchosen because the uplinks already explain their
  flows; loss read above the link's background, ``LossFit.background``: a 4-hop path's
  background is not a link's loss) — the switch is reported and its links (access links too,
  for a leaf) are not.
- NIC ("rule the network out"): both directions of a NIC's access link bad — its flows are bad
  whichever spine they cross, in and out — or the NIC stopped sending (silent) while its
  incoming flows are bad. Access-link delays are only known as round trips (see ``delay``), so
  they are always reported on the NIC with the round-trip sum.
- Host: every NIC of the host is bad, or every NIC bad in the same direction (a stalled agent),
  or a clock event. Its NICs and access links are then folded into it.
- Unidentifiable: a lossy link whose lost packets come mostly from flows whose path was never
  reported (spread over the ECMP candidates) shares that evidence equally with its ECMP
  siblings (the other uplinks of its leaf, the other downlinks into it, see ``ecmp``): no
  method can tell which one it is from end-to-end counts. Every sibling with the same evidence
  is reported, each with confidence 1/N (the uniform prior) — an honest "one of these N"
  instead of a confident arbitrary pick. The drain decisions are the same whichever sibling it
  is (all NICs of that leaf), and a single reported path resolves it. Delay found on such a
  group (``group_delay``) is reported the same way, and so are the fabric links that share
  every timed flow with a delayed link (``delay``'s ties: at start-up, with only some clocks
  trusted).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fleetlens.topology import Topology

from .delay import DelayFit
from .ecmp import siblings
from .loss import LossFit
from .verdicts import strength_for

_SPREAD_SHARE = 0.5  # share of a link's lost packets on uncertain paths -> maybe unidentifiable
_SAME_EVIDENCE = 0.2  # siblings whose lost packets differ by less than this share: the same


@dataclass
class Finding:
    subject: str
    kind: str  # link | switch | nic | host
    loss: float = 0.0
    delay_ns: float = 0.0
    strength: float = 0.0  # log-likelihood-ratio scale
    links: list[int] = field(default_factory=list)  # link numbers behind it (for evidence)
    note: str = ""


class Attributor:
    def __init__(
        self,
        topo: Topology,
        link_ids: list[str],
        groups: list[np.ndarray],
        nic_up: np.ndarray,
        nic_down: np.ndarray,
        nic_host: np.ndarray,  # host number (in ``topo.hosts``) of each NIC
        cfg,
    ) -> None:
        self.topo, self.cfg = topo, cfg
        self.link_ids = link_ids
        self.nic_ids = [n.id for n in topo.nics]
        self.nic_up, self.nic_down = nic_up, nic_down
        idx = topo.index.link
        switches = {s.id for s in topo.switches}
        touching: dict[str, list] = {s.id: [] for s in topo.switches}
        for lk in topo.links:  # one pass over the links, not one per switch
            for end in {lk.a, lk.b} & switches:
                touching[end].append(lk)
        self.switch_fabric: dict[str, np.ndarray] = {}
        self.switch_all: dict[str, np.ndarray] = {}
        for s in topo.switches:
            fab = [idx[lk.id] for lk in touching[s.id] if lk.a in switches and lk.b in switches]
            self.switch_fabric[s.id] = np.array(fab, np.int64)
            self.switch_all[s.id] = np.array([idx[lk.id] for lk in touching[s.id]], np.int64)
        nic_no = topo.index.nic
        self.host_nics = {h: [nic_no[n.id] for n in ns] for h, ns in topo.nics_by_host.items()}
        self.host_names = list(topo.hosts)
        self.n_hosts = len(self.host_names)
        self.nic_host = nic_host
        self.host_size = np.bincount(self.nic_host, minlength=self.n_hosts)
        self.nic_host_name = [n.host for n in topo.nics]
        self.siblings = siblings(groups, len(link_ids))
        self.access = np.zeros(len(link_ids), bool)
        for links in (nic_up, nic_down):
            self.access[links[links >= 0]] = True

    def attribute(
        self,
        loss: LossFit,
        loss_extra: dict[int, tuple[float, float]],
        delay: DelayFit,
        silent: np.ndarray,
        blamed: np.ndarray | None = None,
        raw: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> list[Finding]:
        """``blamed``: NICs whose host or NIC already has a verdict; their access links stay
        folded into that endpoint (a stall ending mid-window still loses incoming probes).
        ``raw``: per link, the (sent, lost) packets whose loss rate the switch test compares
        (default: all of its flows', ``loss.sent``/``loss.lost``; the engine leaves out the
        flows of silent and blamed NICs)."""
        n = len(self.link_ids)
        rate = np.zeros(n)
        strength = np.zeros(n)
        for lk, (r, s) in loss_extra.items():
            rate[lk], strength[lk] = r, s
        rate[loss.links] = np.maximum(rate[loss.links], loss.rate)
        strength[loss.links] = np.maximum(strength[loss.links], loss.llr)
        dly = np.zeros(n)
        dly[delay.links] = delay.excess
        strength[delay.links] = np.maximum(strength[delay.links], 0.5 * delay.z**2)
        bad = (rate > 0) | (dly > 0)
        sent, lost = raw if raw is not None else (loss.sent, loss.lost)
        # a threshold, not > 0: sums with some flows taken out leave float dust behind
        raw_rate = np.where(sent > 1e-9, np.maximum(lost, 0.0) / np.maximum(sent, 1e-9), 0.0)
        if loss.background is not None:  # what a link's flows lose above their background
            raw_rate = np.maximum(raw_rate - loss.background, 0.0)
        raw_dly = np.nan_to_num(delay.median - 0.0, nan=0.0)
        out: list[Finding] = []
        used = np.zeros(n, bool)
        out += self._switches(bad, rate, dly, raw_rate, raw_dly, strength, used)
        out += self._tied_delay(delay, rate, strength, used)
        held = silent if blamed is None else silent | blamed
        out += self._endpoints(bad & ~used, rate, dly, strength, held, delay, used)
        out += self._one_sided_hosts(bad & ~used, rate, dly, strength, used)
        out += self._unidentifiable(bad & ~used & (dly == 0), rate, strength, loss, used)
        out += self._unidentifiable_delay(delay, used)
        for lk in np.flatnonzero(bad & ~used).tolist():
            out.append(Finding(self.link_ids[lk], "link", rate[lk], dly[lk], strength[lk], [lk]))
        return out

    def _switches(self, bad, rate, dly, raw_rate, raw_dly, strength, used) -> list[Finding]:
        out = []
        for sw, fab in self.switch_fabric.items():
            chosen = fab[bad[fab]]
            if fab.size < 2 or chosen.size < 2:
                continue
            r_ref, d_ref = rate[chosen].max(), dly[chosen].max()
            implicated = bad[fab].copy()
            if r_ref > 0:
                implicated |= raw_rate[fab] >= 0.5 * r_ref
            if d_ref > 0:
                implicated |= raw_dly[fab] >= 0.5 * d_ref
            if implicated.mean() < self.cfg.device_fraction:
                continue
            links = self.switch_all[sw]
            used[links] = True
            note = f"{int(implicated.sum())}/{fab.size} fabric links implicated"
            out.append(
                Finding(sw, "switch", float(r_ref), float(d_ref),
                        float(strength[links].max()), chosen.tolist(), note)
            )  # fmt: skip
        return out

    def _unidentifiable(self, bad, rate, strength, loss: LossFit, used) -> list[Finding]:
        """Loss on a link whose evidence its ECMP siblings share equally (paths unknown): all
        of them, each with confidence 1/N (see the module doc)."""
        out: list[Finding] = []
        if loss.spread is None:
            return out
        for lk in np.flatnonzero(bad).tolist():
            o = loss.lost[lk]
            if used[lk] or o <= 0 or loss.spread[lk] < _SPREAD_SHARE * o:
                continue
            sib = self.siblings[lk]
            same = sib[np.abs(loss.lost[sib] - o) <= _SAME_EVIDENCE * o]
            if same.size < 2:
                continue
            used[same] = True
            s = min(float(strength[lk]), strength_for(1.0 / same.size))
            note = f"one of {same.size} ECMP-equivalent links (paths never reported)"
            out += [Finding(self.link_ids[m], "link", float(rate[lk]), 0.0, s, [m], note)
                    for m in same.tolist()]  # fmt: skip
        return out

    def _tied_delay(self, delay: DelayFit, rate, strength, used) -> list[Finding]:
        """A delayed link and the fabric links that share all its timed flows (``delay``'s
        ties): each reported with the same excess at confidence 1/N. Ties with an access link
        are left to the NIC rules (``_endpoints``), which judge access links on round trips;
        loss on a member tells them apart."""
        out: list[Finding] = []
        for lk, excess in zip(delay.links.tolist(), delay.excess.tolist(), strict=True):
            members = np.array([lk, *delay.ties.get(lk, [])], np.int64)
            if members.size < 2 or (used | self.access | (rate > 0))[members].any():
                continue
            used[members] = True
            s = min(float(strength[lk]), strength_for(1.0 / members.size))
            note = f"one of {members.size} links the timed flows cannot tell apart"
            out += [Finding(self.link_ids[m], "link", 0.0, excess, s, [m], note)
                    for m in members.tolist()]  # fmt: skip
        return out

    def _unidentifiable_delay(self, delay: DelayFit, used: np.ndarray) -> list[Finding]:
        """Delay on an ECMP group that only never-reported paths cross (``group_delay``):
        every member, each with confidence 1/N."""
        out: list[Finding] = []
        for g in delay.groups:
            free = g.members[~used[g.members]]
            used[free] = True
            s = min(0.5 * g.z**2, strength_for(1.0 / g.members.size))
            note = (f"one of {g.members.size} ECMP-equivalent links (paths never reported): "
                    f"{g.late}/{g.flows} flows late")  # fmt: skip
            out += [Finding(self.link_ids[m], "link", 0.0, g.excess, s, [m], note)
                    for m in free.tolist()]  # fmt: skip
        return out

    def _one_sided_hosts(self, bad, rate, dly, strength, used) -> list[Finding]:
        """Every NIC of a host bad in the same direction: with rail wiring each NIC hangs off
        a different leaf, so N independent link faults at once are far less likely than the
        host itself (a stalled agent loses acks and stamps late on every NIC)."""
        out = []
        all_out = np.bincount(self.nic_host, bad[self.nic_up], self.n_hosts) == self.host_size
        all_in = np.bincount(self.nic_host, bad[self.nic_down], self.n_hosts) == self.host_size
        one_sided = (all_out | all_in) & (self.host_size >= 2)  # the loop only over those
        for h in [self.host_names[i] for i in np.flatnonzero(one_sided)]:
            nics = self.host_nics[h]
            for side, way in ((self.nic_up[nics], "out"), (self.nic_down[nics], "in")):
                if not bad[side].all():
                    continue
                used[side] = True
                out.append(
                    Finding(h, "host", float(rate[side].max()), float(dly[side].max()),
                            float(strength[side].max()), side.tolist(), f"every NIC bad {way}")
                )  # fmt: skip
        return out

    def _endpoints(self, bad, rate, dly, strength, silent, delay: DelayFit, used) -> list[Finding]:
        nic_find: dict[int, Finding] = {}
        up_bad, down_bad = bad[self.nic_up], bad[self.nic_down]
        both = up_bad & down_bad
        quiet = silent & (down_bad | up_bad)
        for i in np.flatnonzero(both | quiet).tolist():
            up, down = int(self.nic_up[i]), int(self.nic_down[i])
            used[[up, down]] = True
            why = "silent" if quiet[i] and not both[i] else "bad in and out"
            nic_find[i] = Finding(
                self.nic_ids[i], "nic", float(max(rate[up], rate[down])),
                float(dly[up] + dly[down]), float(max(strength[up], strength[down])),
                [up, down], why,
            )  # fmt: skip
        out = self._clock_steps(delay)
        clocked = {self.host_names[h] for h in delay.clock_hosts}
        hosts = {self.nic_host_name[i] for i in nic_find}
        for h in sorted(hosts):
            nics = self.host_nics[h]
            if h in clocked:
                for i in nics:
                    nic_find.pop(i, None)
            elif len(nics) >= 2 and all(i in nic_find for i in nics):
                fs = [nic_find.pop(i) for i in nics]
                out.append(
                    Finding(h, "host", max(f.loss for f in fs), max(f.delay_ns for f in fs),
                            max(f.strength for f in fs), [lk for f in fs for lk in f.links],
                            "every NIC bad")
                )  # fmt: skip
        return out + list(nic_find.values())

    def _clock_steps(self, delay: DelayFit) -> list[Finding]:
        """A host finding per clock step (all its NICs late one way, early the other)."""
        return [
            Finding(self.host_names[h], "host", 0.0, 0.0, 40.0, [], f"clock step {c:.0f} ns")
            for h, c in delay.clock_hosts.items()
        ]
