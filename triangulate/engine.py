"""The engine facade: one callable the collector runs every window.

``Triangulator(topology, config)`` instances satisfy ``fleetlens.api.placeholders.Triangulate``
(``(windows, topology, prev_verdicts) -> list[Verdict]``) and keep the state that spans windows:
remembered paths, per-flow delay baselines, long-horizon loss evidence, link healthy levels,
NIC sending rates and the verdict hysteresis.

Per window: decode the records into flow rows and path incidence (``paths``), fit loss twice —
on this window alone (fast: black holes, heavy loss) and on exponentially decayed per-flow
counts (slow: 0.01 % loss needs tens of seconds of probes) — fit delay (``delay``), fold links
into switches, NICs and hosts (``attribution``), and update the verdicts (``verdicts``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from fleetlens.records import Verdict
from fleetlens.topology import Topology

from .attribution import Attributor, Finding
from .config import TriangulateConfig
from .delay import DelayFit, DelayModel
from .loss import LossFit, fit_loss
from .paths import FlowBatch, PathModel
from .store import FlowStore
from .verdicts import Evidence, VerdictTracker

_HEALED_EXPECTED = 10.0  # lost packets a healed link would have shown, to call it healed


@dataclass
class WindowReport:
    """What the last window looked like, for tests, bench and logs."""

    now_ns: int = 0
    rows: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)


class Triangulator:
    """Stateful triangulation; call it once per window with that window's records."""

    def __init__(self, topology: Topology | None = None, config: TriangulateConfig | None = None):
        self.cfg = config or TriangulateConfig()
        self.topo: Topology | None = None
        self.last = WindowReport()
        if topology is not None:
            self._build(topology)

    def _build(self, topo: Topology) -> None:
        self.topo = topo
        self.paths = PathModel(topo)
        p = self.paths
        nic_host = np.array([topo.hosts.index(h) for h in p.nic_host_name], np.int64)
        self.delay = DelayModel(p.n_links, p.n_nics, nic_host, self.cfg)
        self.attrib = Attributor(topo, p.link_ids, p.nic_up, p.nic_down, self.cfg)
        self.acc = FlowStore({"sent": (np.float64, 0.0, 0), "lost": (np.float64, 0.0, 0)})
        self.tracker = VerdictTracker(self.cfg)
        self.sending = np.zeros(p.n_nics)
        self._acc_stamp: tuple = ()
        self._acc_inc: tuple = ()

    def __call__(
        self, windows: pa.Table, topology: Topology | None, prev: dict[str, Verdict]
    ) -> list[Verdict]:
        topo = topology or self.topo
        if topo is None:
            raise ValueError("triangulation needs a topology (none given, none configured)")
        if self.topo is None or _link_ids(topo) != self.paths.link_ids:
            self._build(topo)
        self.tracker.seed(prev)
        if windows.num_rows == 0:
            return [self.tracker.verdict(s) for s in self.tracker.tracks]
        b = self.paths.batch(windows)
        self.last = WindowReport(b.end_ns, b.n, b.dropped)
        if b.n == 0:
            return [self.tracker.verdict(s) for s in self.tracker.tracks]
        return self._window(b)

    # ---- one window -----------------------------------------------------------------------
    def _window(self, b: FlowBatch) -> list[Verdict]:
        cfg, n_links = self.cfg, self.paths.n_links
        fast = fit_loss(
            b.ent_row, b.ent_link, b.ent_w, b.sent, b.lost, n_links,
            cfg.background_loss, cfg.loss_llr, cfg.min_lost, cfg.max_links_per_fit,
        )  # fmt: skip
        extra = self._slow_loss(b, fast)
        dfit = self.delay.observe(b)
        silent = self._silent(b)
        findings = self.attrib.attribute(fast, extra, dfit, silent, self._blamed())
        self.last.findings = findings
        bad = {f.subject: self._evidence(f, b, dfit) for f in findings}
        clean = self._observed(b, fast)
        self.tracker.update(bad, clean, b.end_ns)
        out = [self.tracker.verdict(s) for s in self.tracker.tracks]
        if cfg.emit_healthy_links:
            quiet = clean - self.tracker.tracks.keys()
            out += [Verdict(s, "link", "healthy", b.end_ns) for s in sorted(quiet)]
        self.tracker.forget_healthy()
        return out

    def _slow_loss(self, b: FlowBatch, fast: LossFit) -> dict[int, tuple[float, float]]:
        """Long-horizon loss fit; its links count unless this window shows them healed."""
        cfg = self.cfg
        dt = max(b.end_ns - b.start_ns, 1) * 1e-9
        gamma = math.exp(-dt / cfg.loss_decay_s)
        acc = self.acc
        acc.cols["sent"] *= gamma
        acc.cols["lost"] *= gamma
        at = acc.locate(b.key)
        np.add.at(acc.cols["sent"], at, b.sent)
        np.add.at(acc.cols["lost"], at, b.lost)
        acc.drop(acc.cols["sent"] >= 0.05)
        keys, version = self._acc_stamp or (None, -1)
        if keys is not acc.keys or version != self.paths.version:  # else reuse the incidence
            self._acc_inc = self.paths.incidence_for_keys(acc.keys)
            self._acc_stamp = (acc.keys, self.paths.version)
        row, link, w = self._acc_inc
        slow = fit_loss(
            row, link, w, acc.cols["sent"], acc.cols["lost"], self.paths.n_links,
            cfg.background_loss, cfg.loss_llr, cfg.min_lost, cfg.max_links_per_fit,
        )  # fmt: skip
        out: dict[int, tuple[float, float]] = {}
        fast_set = set(fast.links.tolist())
        for lk, r, llr in zip(slow.links.tolist(), slow.rate, slow.llr, strict=True):
            if lk in fast_set:
                continue
            expect = fast.sent[lk] * r
            if expect >= _HEALED_EXPECTED and fast.lost[lk] <= 0.2 * expect:
                crossing = np.unique(row[link == lk])
                acc.cols["lost"][crossing] = 0.0  # healed: forget the old losses
                continue
            out[lk] = (float(r), float(llr))
        return out

    def _blamed(self) -> np.ndarray:
        """NICs under a current non-healthy NIC or host verdict."""
        bad = {s for s, t in self.tracker.tracks.items() if t.state != "healthy"}
        p = self.paths
        return np.array(
            [
                nic in bad or host in bad
                for nic, host in zip(p.nic_ids, p.nic_host_name, strict=True)
            ]
        )

    def _silent(self, b: FlowBatch) -> np.ndarray:
        """NICs sending far fewer flow rows than usual (a stalled or dead sender)."""
        now = np.bincount(b.src, minlength=self.paths.n_nics).astype(np.float64)
        silent = (self.sending >= 4) & (now < self.cfg.silent_fraction * self.sending)
        upd = ~silent
        self.sending[upd] = np.where(
            self.sending[upd] > 0, 0.8 * self.sending[upd] + 0.2 * now[upd], now[upd]
        )
        return silent

    def _evidence(self, f: Finding, b: FlowBatch, dfit: DelayFit) -> Evidence:
        """The flows behind a finding: lossy or late rows crossing its links."""
        if f.links:
            rows = np.unique(b.ent_row[np.isin(b.ent_link, f.links)])
        else:  # a host clock event: every row to or from the host
            hosts = np.array([h == f.subject for h in self.paths.nic_host_name])
            rows = np.flatnonzero(hosts[b.src] | hosts[b.dst])
        late = np.nan_to_num(np.abs(dfit.row_excess[rows]), nan=0.0)
        hit = rows[(b.lost[rows] > 0) | (late >= max(0.5 * f.delay_ns, self.cfg.delay_min_ns))]
        hit = hit if hit.size else rows
        labels = [self.paths.flow_label(k) for k in b.key[hit[: self.cfg.evidence_flows]]]
        return Evidence(f.kind, f.strength, f.loss, f.delay_ns, labels, int(hit.size))

    def _observed(self, b: FlowBatch, fast: LossFit) -> set[str]:
        seen = np.flatnonzero(fast.sent > 0)
        ids = self.paths.link_ids
        out = {ids[i] for i in seen.tolist()}
        out |= {s for s, t in self.tracker.tracks.items() if t.kind != "link"}
        return out


def _link_ids(topo: Topology) -> list[str]:
    return [lk.id for lk in topo.links]
