"""The engine facade: one callable the collector runs every window.

``Triangulator(topology, config)`` instances satisfy ``fleetlens.engines.Triangulate``
(``(windows, topology, prev_verdicts) -> list[Verdict]``) and keep the state that spans windows:
remembered paths, per-flow delay baselines, long-horizon loss evidence, link healthy levels,
NIC sending rates and the verdict hysteresis.

Per window: decode the records into flow rows and their factorized incidence (``paths``,
``incidence``), fit loss three times — on this window alone (fast: black holes, heavy loss;
beside it, in a window that lost acks, a fit with the acks as rows of their own on the
reverse paths, which only adds links, ``_with_acks``), on exponentially decayed per-flow
counts (slow: 0.01 % loss needs tens of seconds of probes) and on the last windows' sums
(onset: a fault too weak for one window, which the slow counts' clean past dilutes;
``horizon``; neither counts the probes lost while an agent starts, ``_starting``, nor
those of a first window the agents started during, ``_forget_partial_start``) —
fit delay (``delay``), fold links into switches, NICs and hosts (``attribution``), widen a
finding on a link the observed flows cannot tell from others to its whole ambiguity group
(``identify``), and update the verdicts (``verdicts``); a link verdict names its group's id
and size, at confidence <= 1/N.

Cost: the flows repeat window after window, so the decoded layout and the per-flow state stay
aligned with the window's rows and are updated in place; the loss fits expand only lossy
flows (and the flows of the links they pick); delay tomography runs on a fixed hash-sample of
the flows when a window has more than ``delay_sample_rows`` of them (a delay fault moves
*every* flow of its link, so a uniform sample of a few hundred flows per fabric link finds
and sizes it as well as all of them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from fleetlens.records import Verdict
from fleetlens.topology import Topology

from .attribution import Attributor, Finding
from .config import TriangulateConfig
from .delay import DelayFit, DelayModel
from .ecmp import ecmp_groups
from .evidence import AckRows, LossEvidence, learned_floor
from .horizon import DecayedCounts, WindowSums
from .identify import Ambiguity, observed_groups, widen
from .incidence import Incidence
from .loss import LossFit, fit_incidence
from .paths import SPORT_SPAN, FlowBatch, Frame, PathModel
from .verdicts import Evidence, VerdictTracker


@dataclass
class WindowReport:
    """What the last window looked like, for tests, bench and logs."""

    now_ns: int = 0
    rows: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    groups: list[list[str]] = field(default_factory=list)  # ambiguity groups (link ids)


class _DelaySample(NamedTuple):
    """The rows delay tomography runs on for one layout (``token``): all (``rows`` None) or a
    fixed hash-sample, their incidence entries, and the per-flow columns that stay the same
    while the layout does (key, src, dst, sport, known)."""

    token: object
    rows: np.ndarray | None
    ent: tuple[np.ndarray, np.ndarray, np.ndarray]
    fixed: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


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
        nic_host = self.nic_host = topo.index.nic_host
        groups = ecmp_groups(topo)
        self.delay = DelayModel(p.n_links, p.n_nics, nic_host, groups, self.cfg)
        self.attrib = Attributor(topo, p.link_ids, groups, p.nic_up, p.nic_down, nic_host, self.cfg)
        self.tracker = VerdictTracker(self.cfg)
        self.loss_ev = LossEvidence(self.cfg, p.n_links)  # the one-window fit's and slow's
        self.slow = DecayedCounts(self.cfg.loss_decay_s)
        self.onset = WindowSums(self.cfg.loss_onset_windows, p.n_links)
        self.onset_ev = LossEvidence(self.cfg, p.n_links)  # its own background and heal test
        self.ack_ev = LossEvidence(self.cfg, p.n_links)  # the acks' fit's (_with_acks)
        self.floor = self.cfg.background_loss  # the fits' per-link background (learned_floor)
        self.sending = np.zeros(p.n_nics)
        self.started = np.zeros(p.n_nics, bool)  # NICs that sent rows in an earlier window
        self._first_sent: np.ndarray | None = None  # per NIC, its probes in the first window
        self._sample: _DelaySample | None = None
        self._seen: tuple = (b"", frozenset())  # see _observed
        self._amb: tuple[object, Ambiguity] | None = None  # (layout token, its groups)
        # (layout token, the flows' and acks' incidence, the acks' alone): see _with_acks
        self._ack_inc: tuple[object, Incidence, Incidence] | None = None

    def __call__(
        self, windows: pa.Table, topology: Topology | None, prev: dict[str, Verdict]
    ) -> list[Verdict]:
        topo = topology or self.topo
        if topo is None:
            raise ValueError("triangulation needs a topology (none given, none configured)")
        if self.topo is None or (topo is not self.topo and _link_ids(topo) != self.paths.link_ids):
            self._build(topo)
        self.tracker.seed(prev)
        if windows.num_rows == 0:
            return self._held()
        f = self.paths.frame(windows)
        self.last = WindowReport(f.end_ns, f.n, f.dropped)
        if f.n == 0:
            return self._held()
        return self._window(f)

    def _held(self) -> list[Verdict]:
        """The tracked verdicts unchanged (a window without usable rows), groups as last."""
        out = [self.tracker.verdict(s) for s in self.tracker.tracks]
        return out if self._amb is None else self._name_groups(out, self._amb[1])

    # ---- one window -----------------------------------------------------------------------
    def _window(self, f: Frame) -> list[Verdict]:
        cfg = self.cfg
        S = f.inc.link_sums(f.sent)
        first = not self.started.any()
        self._forget_partial_start(f)
        starting = self._starting(f)
        lost_kept = f.lost if starting is None else np.where(starting, 0.0, f.lost)
        gamma, lossy_now, lossy_all = self.slow.add(f, lost_kept)
        lossy_onset = self.onset.add(f, lost_kept)
        if starting is not None:  # the window's own lossy rows, start-up losses included
            lossy_now = np.flatnonzero(f.lost > 0)
        if first:
            self._first_sent = np.bincount(f.src, f.sent, self.paths.n_nics)
        fast = fit_incidence(
            f.inc, f.sent, f.lost, S,
            self.floor, cfg.loss_llr, cfg.min_lost, cfg.max_links_per_fit, lossy_now,
        )  # fmt: skip
        fast = self.loss_ev.gate(fast, f.inc, f.sent, f.lost, _window_s(f), self.floor)
        fast = self._with_acks(f, S, fast, lossy_now)
        extra = self._horizon_loss(f, fast, S, self.slow, self.loss_ev, gamma, lossy_all)
        self.floor = learned_floor(cfg, *self.loss_ev.support)  # from the next fit on
        onset = self._horizon_loss(f, fast, S, self.onset, self.onset_ev, None, lossy_onset)
        for lk, got in onset.items():  # the stronger evidence of the two horizons
            if got[1] > extra.get(lk, (0.0, -1.0))[1]:
                extra[lk] = got
        db = self._delay_batch(f)
        dfit = self.delay.observe(db)
        silent = self._silent(f)
        blamed = self._blamed()
        raw = self._loss_without(f, fast, silent | blamed)
        amb = self._ambiguity(f)
        link_ids = self.paths.link_ids
        findings = self.attrib.attribute(fast, extra, dfit, silent, blamed, raw)
        findings = widen(findings, amb, link_ids)
        self.last.findings, self.last.groups = findings, amb.named(link_ids)
        bad = {x.subject: self._evidence(x, f, db, dfit) for x in findings}
        clean = self._observed(fast)
        self.tracker.update(bad, clean, f.end_ns)
        out = [self.tracker.verdict(s) for s in self.tracker.tracks]
        if cfg.emit_healthy_links:
            quiet = clean - self.tracker.tracks.keys()
            out += [Verdict(s, "link", "healthy", f.end_ns) for s in sorted(quiet)]
        self.tracker.forget_healthy()
        return self._name_groups(out, amb)

    def _with_acks(
        self, f: Frame, S: np.ndarray, fast: LossFit, lossy: np.ndarray | None
    ) -> LossFit:
        """``fast`` (the window's gated fit of its probes, ``lossy`` their lossy rows when
        listed) with the links the window's lost acks add.

        With lost acks, a second fit runs on every flow row and a twin per row after them:
        its acks (one per pair the receiver heard) on the reverse path
        (``PathModel.ack_incidence``), whose fabric part is spread over its ECMP candidates,
        gated against the acks' own background, no link's evidence resting on one agent's
        rows (``evidence``). A link that drops only acks then explains their loss as a
        forward-lossy link explains lost probes, and an ack's loss never counts against the
        forward path. What it keeps that
        the probes' fit did not is added, held under ``strong_llr`` (needing
        ``fault_windows`` windows in a row to be faulty: a busy agent's burst of late acks
        lasts a window or two, a link dropping acks goes on; on the lab, 92 lost acks in one
        window, 51 into one leaf's NICs, made the fit put 12 % on one of its downlinks,
        LLR 53; the next window lost 3). The probes' links, rates and per-link counts stay
        as their own fit has them: in one joint fit the acks' background, 1000x the
        probes' on the lab, swamped a starting host's lost probes (5 % into its NICs, LLR 58
        in the fit, not kept), and a fault's rate read the clean acks crossing it."""
        cfg = self.cfg
        if not cfg.ack_evidence or f.acks is None or not f.acks[1].any():
            return fast
        a_sent, a_lost = f.acks
        got = self._ack_inc
        if got is None or got[0] != f.token:
            a = self.paths.ack_incidence(f)
            both = Incidence(
                np.concatenate([f.inc.up, a.up]), np.concatenate([f.inc.dn, a.dn]),
                np.concatenate([f.inc.route, a.route]), f.inc.routes, f.inc.n_links,
            )  # fmt: skip
            got = self._ack_inc = (f.token, both, a)
        _, inc, a_inc = got
        lossy = np.flatnonzero(f.lost > 0) if lossy is None else lossy
        sent, lost = np.concatenate([f.sent, a_sent]), np.concatenate([f.lost, a_lost])
        fit = fit_incidence(
            inc, sent, lost, S + a_inc.link_sums(a_sent),
            self.floor, cfg.loss_llr, cfg.min_lost, cfg.max_links_per_fit,
            np.concatenate([lossy, f.n + np.flatnonzero(a_lost > 0)]),
        )  # fmt: skip
        acks = AckRows(f.n, f.inc, a_inc, f.src, f.dst, self.nic_host)
        fit = self.ack_ev.gate(fit, inc, sent, lost, _window_s(f), self.floor, acks)
        new = ~np.isin(fit.links, fast.links)
        below = np.nextafter(cfg.strong_llr, 0.0)
        return LossFit(
            np.concatenate([fast.links, fit.links[new]]),
            np.concatenate([fast.rate, fit.rate[new]]),
            np.concatenate([fast.llr, np.minimum(fit.llr[new], below)]),
            fast.sent, fast.lost, fast.spread, fast.background,
        )  # fmt: skip

    def _ambiguity(self, f: Frame) -> Ambiguity:
        """The ambiguity groups of the frame's flows (kept while its layout token is)."""
        if self._amb is None or self._amb[0] != f.token:
            self._amb = (f.token, observed_groups(f.inc, f.key, self.paths.link_ids))
        return self._amb[1]

    def _name_groups(self, verdicts: list[Verdict], amb: Ambiguity) -> list[Verdict]:
        """Each link verdict of a group member carries the group's id and size, and at most
        confidence 1/N: the evidence is the group's, which member it is stays unknown."""
        if not amb.members:
            return verdicts
        index = self.paths.link_index
        for v in verdicts:
            lk = index.get(v.subject, -1) if v.kind == "link" else -1
            g = int(amb.group_of[lk]) if lk >= 0 else -1
            if g >= 0:
                v.group_id, v.group_size = amb.ids[g], int(amb.members[g].size)
                v.confidence = min(v.confidence, 1.0 / v.group_size)
        return verdicts

    def _horizon_loss(
        self,
        f: Frame,
        fast: LossFit,
        S: np.ndarray,
        h: DecayedCounts | WindowSums,
        ev: LossEvidence,
        gamma: float | None,
        lossy: np.ndarray | None,
    ) -> dict[int, tuple[float, float]]:
        """Loss fit on one horizon's decayed counts (``h``, updated this window), gated by
        ``ev``; its links not in the one-window fit count unless this window shows them
        healed (then their old losses on this horizon are forgotten)."""
        cfg = self.cfg
        inc, aligned = h.incidence(f, self.paths)
        if isinstance(h, WindowSums):
            sums = h.link_sums(f, inc, aligned, S)
        else:
            assert gamma is not None
            sums = h.link_sums(f, inc, aligned, S, gamma)
        fit = fit_incidence(
            inc, h.sent, h.lost, sums,
            self.floor, cfg.loss_llr, cfg.min_lost, cfg.max_links_per_fit, lossy,
        )  # fmt: skip
        fit = ev.gate(fit, inc, h.sent, h.lost, _window_s(f), self.floor)
        only = ~np.isin(fit.links, fast.links)
        links, rate, llr = fit.links[only], fit.rate[only], fit.llr[only]
        healed = ev.healed(links, rate, fast.sent[links], fast.lost[links])
        if healed.any():
            h.forget(inc.rows_of(links[healed]))  # healed: forget the old losses
        keep = ~healed
        return {
            int(lk): (float(r), float(x))
            for lk, r, x in zip(links[keep], rate[keep], llr[keep], strict=True)
        }

    def _delay_batch(self, f: Frame) -> FlowBatch:
        """The rows delay tomography runs on: all, or a fixed hash-sample of a big window."""
        sample = self._delay_sample(f)
        rows, ent = sample.rows, sample.ent
        key, src, dst, sport, known = sample.fixed
        if rows is None:
            return FlowBatch(key, src, dst, sport, f.sent, f.lost, f.owd_min, known,
                             *ent, f.start_ns, f.end_ns, f.dropped)  # fmt: skip
        return FlowBatch(
            key, src, dst, sport, f.sent[rows], f.lost[rows], f.owd_min[rows], known,
            *ent, f.start_ns, f.end_ns, f.dropped,
        )  # fmt: skip

    def _delay_sample(self, f: Frame) -> _DelaySample:
        """The delay sample of the frame's layout (kept while the layout's token is the same)."""
        last = self._sample
        if last is not None and last.token == f.token:
            return last
        rows: np.ndarray | None = None
        step = 1
        while f.n > step * self.cfg.delay_sample_rows:
            step *= 2
        if step > 1:  # hash of the flow key: the same flows every window
            h = (f.key * 0x9E3779B1) >> 7
            rows = np.flatnonzero(h % step == 0)
        ent = f.inc.entries(rows)
        fixed = (f.key, f.src, f.dst, f.sport, f.known) if rows is None else (
            f.key[rows], f.src[rows], f.dst[rows], f.sport[rows], f.known[rows])  # fmt: skip
        self._sample = _DelaySample(f.token, rows, ent, fixed)
        return self._sample

    def _loss_without(
        self, f: Frame, fast: LossFit, nics: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per link, the (sent, lost) packets of its flows that neither start nor end at
        ``nics`` (silent or already blamed). A dead host's flows lose everything on every
        link into its leaf; counted in, they made that leaf's other links look as bad as a
        lossy uplink, and the leaf was reported as a failed switch in place of the link."""
        sent, lost = fast.sent, fast.lost
        if nics.any():  # their flows: those crossing their access links (an inverse index)
            p = self.paths
            acc = np.concatenate([p.nic_up[nics], p.nic_down[nics]])
            rows = f.inc.rows_of(acc[acc >= 0])
            if rows.size:
                inc = f.inc.take(rows)
                sent = sent - inc.link_sums(f.sent[rows])
                lost = lost - inc.link_sums(f.lost[rows])
        return sent, lost

    def _blamed(self) -> np.ndarray:
        """NICs under a current non-healthy NIC or host verdict."""
        tracks = self.tracker.tracks.items()
        bad = {s for s, t in tracks if t.state != "healthy" and t.kind in ("nic", "host")}
        p = self.paths
        if not bad:
            return np.zeros(p.n_nics, bool)
        return np.array(
            [
                nic in bad or host in bad
                for nic, host in zip(p.nic_ids, p.nic_host_name, strict=True)
            ]
        )

    def _starting(self, f: Frame) -> np.ndarray | None:
        """The rows to or from a NIC whose agent starts (None: none): one that sent no rows
        before this window, or, in the first window, none in it either. Their lost probes
        are the start's, not the network's.

        The one-window fit sees them (a host whose agent starts late is reported as that
        host); the horizons do not. Counted there, an agent's start went on as evidence after
        its host had answered every probe for seconds: on the lab, ~100-200 probes lost to
        and from a starting host's NICs in the first window or two, decayed on the long
        horizon, made the host `faulty` in windows 4-9 (0.17-0.35 % over its rows, LLR
        23-25), once the fits' floor had been learned down from the configured 1e-3. The
        first window's senders count from it on: where every agent runs from the start (the
        simulator) nothing is left out, and a fault there from the start keeps its first
        window (0.01 % localized in 30 s needs all of them)."""
        before = self.started
        if before.all():
            return None
        self.started = before | (self._rows_per_src(f) > 0)
        fresh = ~before if before.any() else ~self.started
        starting = fresh[f.src] | fresh[f.dst]
        return starting if starting.any() else None

    def _forget_partial_start(self, f: Frame) -> None:
        """At the engine's second window: the first window's lost probes of the rows to or
        from a NIC that sent under ``start_fraction`` of what it sends now forgotten on both
        horizons. Its agent started during that window, and so did its peers' answers.

        Where every agent sends from the engine's first window on, ``_starting`` counts that
        window (a fault present from the start needs it), and where they all started during
        it, its probes were lost to whoever answered late: on the lab (rail 4L2S) every NIC
        sent 0.24-0.59 of its second window's probes in its first, `h05` lost 22, 8 and 12
        of 96 per NIC to three late peers, and those losses, decayed on the long horizon,
        made `h05` `faulty` in windows 4-9 ("every NIC bad out", LLR 23) once the fits'
        floor was learned down. Later windows sent 0.65-2.3x their predecessor's in the
        stored lab runs; the simulator's first window is a full one and keeps its losses."""
        first = self._first_sent
        if first is None:
            return
        self._first_sent = None
        part = first < self.cfg.start_fraction * np.bincount(f.src, f.sent, first.size)
        if not part.any():
            return
        for h in (self.slow, self.onset):
            pair = h.acc.keys // SPORT_SPAN
            h.forget(np.flatnonzero(part[pair // first.size] | part[pair % first.size]))

    def _silent(self, f: Frame) -> np.ndarray:
        """NICs sending far fewer flow rows than usual (a stalled or dead sender)."""
        now = self._rows_per_src(f)
        silent = (self.sending >= 4) & (now < self.cfg.silent_fraction * self.sending)
        upd = ~silent
        self.sending[upd] = np.where(
            self.sending[upd] > 0, 0.8 * self.sending[upd] + 0.2 * now[upd], now[upd]
        )
        return silent

    def _rows_per_src(self, f: Frame) -> np.ndarray:
        got = getattr(self, "_per_src", None)
        if got is None or got[0] != f.token:
            now = np.bincount(f.src, minlength=self.paths.n_nics).astype(np.float64)
            got = self._per_src = (f.token, now)
        return got[1]

    def _evidence(self, x: Finding, f: Frame, db: FlowBatch, dfit: DelayFit) -> Evidence:
        """The flows behind a finding: lossy rows crossing its links, or (delay) late rows of
        the delay sample crossing them."""
        cfg = self.cfg
        if x.links:
            rows = f.inc.rows_of(np.array(x.links, np.int64))
            d_rows = self._in_sample(rows)
        else:  # a host clock event: every row to or from the host
            hosts = np.array([h == x.subject for h in self.paths.nic_host_name])
            rows = np.flatnonzero(hosts[f.src] | hosts[f.dst])
            d_rows = np.flatnonzero(hosts[db.src] | hosts[db.dst])
        late = np.nan_to_num(np.abs(dfit.row_excess[d_rows]), nan=0.0)
        d_hit = d_rows[late >= max(0.5 * x.delay_ns, cfg.delay_min_ns)]
        keys = np.union1d(f.key[rows[f.lost[rows] > 0]], db.key[d_hit])
        if keys.size == 0:
            keys = f.key[rows]
        labels = [self.paths.flow_label(k) for k in keys[: cfg.evidence_flows]]
        return Evidence(x.kind, x.strength, x.loss, x.delay_ns, labels, int(keys.size))

    def _in_sample(self, rows: np.ndarray) -> np.ndarray:
        """The delay batch's rows (``_delay_batch``) among the frame's sorted ``rows``."""
        assert self._sample is not None  # made with the delay batch of this window
        sample = self._sample.rows
        if sample is None:
            return rows
        at = np.searchsorted(sample, rows)
        hit = at < sample.size
        hit[hit] = sample[at[hit]] == rows[hit]
        return at[hit]

    def _observed(self, fast: LossFit) -> frozenset[str]:
        """Links with probes this window, and every tracked NIC, host and switch."""
        mask = fast.sent > 0
        seen = mask.tobytes()
        if self._seen[0] != seen:  # the same links window after window: one set of ids
            ids = self.paths.link_ids
            self._seen = (seen, frozenset(ids[i] for i in np.flatnonzero(mask)))
        devices = {s for s, t in self.tracker.tracks.items() if t.kind != "link"}
        return self._seen[1] | devices


def _window_s(f: Frame) -> float:
    return max(f.end_ns - f.start_ns, 1) * 1e-9


def _link_ids(topo: Topology) -> list[str]:
    return [lk.id for lk in topo.links]
