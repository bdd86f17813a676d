"""Drift tracking across windows: a two-state Kalman filter per host, and clock-step detection.

State per host: offset θ (ns, raw − fleet) at the time of the last update and drift δ (ppb,
which is ns per s). Between updates θ grows by δ·dt; the drift itself wanders as a random walk
with spectral density q ppb²/s, starting at ``q_drift`` (50 ppb/√s: oscillator ageing is ~20
ppb/√s on commodity TCXOs, and temperature steps of a few hundred ppb every minute or so add
about as much again) and adapted per host from the whiteness of its innovations
(``_adapt_q``). Each window's network solve is one measurement of (θ, δ) with the standard
errors it reports. Agents extrapolate the published (θ, δ) between updates: that is the
real-time mode.

Clock steps: if the measured offset is more than ``step_k`` standard deviations of the
innovation (and more than ``step_floor_ns``) away from the prediction, the host's clock was
stepped (or its oscillator jumped): the filter restarts from the measurement instead of
averaging the step in slowly. One clean window after the step is therefore enough to
re-converge. A false alarm only costs the averaging of one window. That holds for a
*confirmed* measurement (see below); an unconfirmed one must show the jump twice in a row.

Measurement noise: the network solve's standard errors are lower bounds, but with one or two
edges (a small lab) it knows nothing of the real scatter. Each host therefore keeps running
estimates of its offset and drift measurement variances from its own innovations (``adapt``
≈ 10 windows), so a noisy host is averaged over more windows. Only innovations within
``change_k`` standard deviations feed that estimate: a larger one is a change of the clock,
not noise.

Drift changes (temperature steps of a few hundred ppb): an innovation beyond ``change_k`` σ
widens the state's covariance by the squared innovation (offset and drift) before it is
folded in, so the window is followed at once instead of averaged in over many; learnt as
measurement noise instead, such steps would leave the host's error high for several windows.
A false alarm only costs that host the averaging of one window.

Confirmation: a measurement the network solve cross-checked (``trust``: the host has
``min_edges`` or more edges that agree) is believed at once. A pairwise-only host (a two-host
lab) has nothing to check its window against, and under load its single windows can be µs
off (one or two pure pairs per direction): its surprises (> ``change_k`` σ) count only when
the next window surprises the same way. Unconfirmed, a ``change_k``–``gate_k`` σ innovation is
folded in as usual (no widening), and a larger one — even step-sized — is not folded in (the
host coasts); confirmed, the former widens the state and the latter restarts it. The
confirming window must also agree with the first surprise (within ``change_k`` σ or
``confirm_rel`` of the innovation): runs of wild windows on the same side must not restart
the filter.

A host not measured in a window coasts on its prediction (its uncertainty grows) and is
reported unsynchronized until measured again. How these rules were found: ``docs/notes/sync.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fleetlens.records import ClockModel

from .config import SyncConfig


@dataclass
class HostState:
    t_ns: int  # fleet time of the state
    theta: float
    drift: float
    p: np.ndarray  # 2x2 covariance (ns², ns·ppb, ppb²)
    r: np.ndarray = field(default_factory=lambda: np.zeros(2))  # running measurement
    # variance estimates (offset ns², drift ppb²)
    rejected: int = 0  # the last measurement surprised (> change_k σ) this way (±1), or 0
    # this host's drift process noise (ppb²/s): cfg.q_drift at first, adapted (``_adapt_q``)
    q: float = float("nan")
    last_nu: float = float("nan")  # the last normalized offset innovation (NaN: chain broken)
    rho: float = 0.0  # running lag-1 correlation of the normalized offset innovations
    last_theta: float = float("nan")  # the last surprising measurement (offset, ns) ...
    last_t: int = 0  # ... and its time


@dataclass
class DriftTracker:
    cfg: SyncConfig = field(default_factory=SyncConfig)
    states: dict[str, HostState] = field(default_factory=dict)

    def seed(self, model: ClockModel) -> None:
        """Start a host from a model handed in by the caller (e.g. after a collector restart)."""
        if model.host_id in self.states:
            return
        bound = model.error_bound_ns if model.synced and model.error_bound_ns else None
        var = (bound / 3.0) ** 2 if bound else self.cfg.max_p_theta_ns2
        t_fleet = int(model.t0_ns - round(model.offset_ns))
        p = np.diag([var, 100.0**2 if bound else 1e10])
        st = HostState(t_fleet, model.offset_ns, model.drift_ppb, p, q=self.cfg.q_drift)
        self.states[model.host_id] = st

    def predict_many(
        self, hosts: list[str], t_ns: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every host's predicted state at ``t_ns``: offsets, drifts, offset and drift
        variances (NaN where a host is not tracked)."""
        th, dr, p = _States.of([self.states.get(h) for h in hosts], t_ns, self.cfg.q_drift).predict(
            t_ns
        )
        return th, dr, p[0, 0], p[1, 1]

    def update(
        self,
        host: str,
        t_ns: int,
        theta: float,
        s_theta: float,
        drift: float | None,
        s_drift: float,
        trust: bool = False,
        evidence_sd: float = 0.0,
    ) -> bool:
        """Fold in one measurement; returns True when a clock step was detected.

        ``drift`` None (or ``s_drift`` ≥ ``cfg.drift_unknown_ppb``): the window had no slope; only
        the offset is measured (the drift is learnt from successive offsets), and nothing is
        folded into the running drift-noise estimate. ``trust``: the measurement is known
        good (cross-checked by several edges), so a surprise is a change of the clock,
        followed at once; otherwise a surprise must show twice in a row. ``evidence_sd``
        (ns): this window's own extra offset uncertainty (see ``_evidence``)."""
        d = np.nan if drift is None else drift
        one = (np.array([v], np.float64) for v in (theta, s_theta, d, s_drift, evidence_sd))
        th, s_th, dr, s_dr, ev = one
        return bool(self.update_many([host], t_ns, th, s_th, dr, s_dr, np.array([trust]), ev)[0])

    @np.errstate(invalid="ignore", divide="ignore")  # untracked hosts: NaN, unused
    def update_many(
        self,
        hosts: list[str],
        t_ns: int,
        theta: np.ndarray,
        s_theta: np.ndarray,
        drift: np.ndarray,
        s_drift: np.ndarray,
        trust: np.ndarray,
        evidence_sd: np.ndarray,
    ) -> np.ndarray:
        """:meth:`update` of several hosts at once (``drift`` NaN: no slope), every rule
        as masks over the hosts; returns where a clock step was detected."""
        cfg, n = self.cfg, len(hosts)
        old = _States.of([self.states.get(h) for h in hosts], t_ns, cfg.q_drift)
        has_d = np.isfinite(drift) & (s_drift < cfg.drift_unknown_ppb)
        floor = np.stack([s_theta**2, np.where(has_d, s_drift**2, 0.0)])
        extra = _evidence(evidence_sd, s_theta, s_drift, has_d)
        th, dr, p = old.predict(t_ns)
        stale = old.known & (t_ns - old.t_ns > cfg.track_stale_ns)
        fresh = ~old.known | stale | ~(p[0, 0] < cfg.max_p_theta_ns2)  # NaN: not tracked
        r = np.maximum(floor, old.r) + extra
        new_d = np.where(has_d, drift, dr)
        innov = np.stack([theta - th, np.where(has_d, new_d - dr, 0.0)])
        sd = np.sqrt(np.stack([p[0, 0] + r[0], p[1, 1] + r[1]]))
        z = np.abs(innov) / sd
        z[1] = np.where(has_d, z[1], 0.0)
        side = np.where(innov[0] > 0, 1, -1)
        # Confirmed: a cross-checked measurement, or the previous window surprised the same
        # way and agrees with this one (a step or a new drift shows the same new line twice;
        # two wild windows in a row under load, 7.6 and 2.6 µs off, do not).
        again = theta - (old.last_theta + dr * (t_ns - old.last_t) * 1e-9)
        agree = np.abs(again) <= np.maximum(
            cfg.change_k * sd[0], cfg.confirm_rel * np.abs(innov[0])
        )
        sure = trust | ((old.rejected * side >= 1) & agree)
        step = np.abs(innov[0]) > cfg.step_k * sd[0] + cfg.step_floor_ns
        stepped = ~fresh & step & sure
        # A gated-out window is an outlier or a real change of the clock, not a sample of the
        # measurement noise: it must not inflate the running noise estimate (that made a host
        # whose drift prior was wrong keep µs error bounds for tens of windows). Unconfirmed,
        # even a step-sized one is coasted over (two-host lab under load: single windows 6-8
        # µs off, each taken as a clock step, made p99 6.4 µs).
        gated = ~fresh & ~stepped & (step | (z > cfg.gate_k).any(axis=0))
        coast = gated & ~sure
        changed = (z > cfg.change_k).any(axis=0)
        fold = ~fresh & ~stepped & ~gated
        # More than the noise explains but short of the gate, confirmed: the clock changed (a
        # drift step). Widen the state by what the innovation shows so this window is followed
        # rather than averaged in over many, and learn no noise from it.
        p = _widen(p, innov, has_d, fold & changed & sure, cfg.change_s)
        pending = np.where(fold & changed & ~sure, side, 0)
        # running noise estimates from the innovations the prediction does not explain, unless
        # the window's own evidence calls it poor (its innovation is its, not the host's)
        learn = fold & ~changed & ~(extra[0] > np.maximum(old.r[0], floor[0]))
        r_obs = np.maximum(innov**2 - np.stack([p[0, 0], p[1, 1]]) - extra, floor)
        mixed = np.where(old.r > 0, (1 - cfg.adapt) * old.r + cfg.adapt * r_obs, r_obs)
        r_new = np.where(learn & np.stack([np.ones(n, bool), has_d]), mixed, old.r)
        x, p_new = _kalman(th, dr, p, innov, r, has_d)
        nu = innov[0] / sd[0]
        rho, q = _adapt_q(old, nu, fold & ~changed, cfg)
        # restarts: at a fresh host's first (or stale) measurement from the floors, and at a
        # confirmed step or gated surprise from this window's noise
        restart = fresh | stepped | (gated & sure)
        known_d = np.where(gated, True, has_d | (old.p[1, 1] < cfg.drift_unknown_ppb**2))
        known_d = np.where(fresh, has_d, known_d)
        d0 = np.where(fresh, np.where(has_d, drift, np.where(old.known, dr, 0.0)), new_d)
        r0 = np.where(fresh, floor, r)
        for i, h in enumerate(hosts):
            if restart[i]:
                self._restart(h, t_ns, float(theta[i]), float(d0[i]), r0[:, i], bool(known_d[i]))
            elif coast[i]:
                self.states[h] = HostState(
                    t_ns, float(th[i]), float(dr[i]), p[:, :, i].copy(), old.r[:, i].copy(),
                    int(side[i]), float(old.q[i]), last_theta=float(theta[i]), last_t=t_ns,
                )  # fmt: skip
            else:
                st = HostState(t_ns, float(x[0, i]), float(x[1, i]), p_new[:, :, i].copy(),
                               r_new[:, i].copy(), int(pending[i]), float(old.q[i]))  # fmt: skip
                if pending[i]:
                    st.last_theta, st.last_t = float(theta[i]), t_ns
                elif not changed[i]:
                    st.rho, st.q, st.last_nu = float(rho[i]), float(q[i]), float(nu[i])
                self.states[h] = st
        return stepped

    def _restart(
        self, host: str, t_ns: int, theta: float, drift: float, r: np.ndarray, drift_known: bool
    ) -> None:
        """Start over at a measurement; an unknown drift gets the prior of real drifts and no
        running noise estimates (the next informative window seeds them)."""
        r, cfg = r.copy(), self.cfg
        # One window is all the restarted state rests on, and windows that cause restarts
        # (agents starting, a step inside the window) fit worse than they say: trust the
        # next windows as much as this one.
        k = cfg.restart_inflate
        p_dd = k * (r[1] if r[1] > 0 else cfg.drift_restart_ppb**2)
        p = np.diag([k * r[0], p_dd if drift_known else cfg.drift_unknown_ppb**2])
        if not drift_known:  # a slope-less (short) window: nothing to learn its noise from
            r[:] = 0.0
        q = self.states[host].q if host in self.states else cfg.q_drift
        self.states[host] = HostState(t_ns, theta, drift, p, r, 0, q)

    def model(self, host: str, t_ns: int, synced: bool) -> ClockModel:
        """The published model at fleet time ``t_ns`` (coasting if not updated there)."""
        return self.models([host], t_ns, np.array([synced]))[0]

    def models(self, hosts: list[str], t_ns: int, synced: np.ndarray) -> list[ClockModel]:
        """:meth:`model` of several hosts (identity where not tracked)."""
        th, dr, var, _ = self.predict_many(hosts, t_ns)
        cols = zip(hosts, th.tolist(), dr.tolist(), var.tolist(), synced.tolist(), strict=True)
        return [
            ClockModel(h, int(t_ns + round(a)), a, b, 3.0 * math.sqrt(v), bool(s))
            if h in self.states
            else ClockModel.identity(h)
            for h, a, b, v, s in cols
        ]


def _adapt_q(old: _States, nu: np.ndarray, on: np.ndarray, cfg: SyncConfig) -> np.ndarray:
    """Process noise from the whiteness of the innovations, where ``on``: the hosts' new
    (rho, q) as a (2, hosts) array (the old ones elsewhere). With the right process noise a
    Kalman filter's innovations are white; too much and the filter follows each measurement,
    so consecutive innovations share that measurement's error with opposite signs (lag-1
    correlation → −0.5); too little and it lags a wandering clock (correlation > 0). The
    running lag-1 correlation (weight ``cfg.adapt``) scales the host's drift process noise
    by exp(``cfg.q_gain``·ρ) per window, within [``cfg.q_min``, ``cfg.q_max``]. The measurement
    noise is learnt at the same time from the size of the innovations; the two are told apart only
    because one shapes their correlation and the other their size. (Two lab hosts on one
    clock: true drift 0, the filter started for ±100 ppm wander averaged ~3 windows.)"""
    on = on & np.isfinite(old.last_nu)
    w = cfg.adapt
    rho = np.where(on, (1 - w) * old.rho + w * np.clip(nu * old.last_nu, -4.0, 4.0), old.rho)
    q = np.where(on, np.clip(old.q * np.exp(cfg.q_gain * rho), cfg.q_min, cfg.q_max), old.q)
    return np.stack([rho, q])


def _evidence(
    sd: np.ndarray, s_theta: np.ndarray, s_drift: np.ndarray, has_d: np.ndarray
) -> np.ndarray:
    """A window's own extra measurement variance (offset ns², drift ppb²; (2, hosts)) on top
    of the host's running noise estimate: added for this window only, and taken out of the
    innovation before the running estimate learns from it. The drift extra is the offset
    extra over the base the window's slope rests on (s_drift ≈ 2 s_theta / base)."""
    sd = np.maximum(sd, 0.0)
    per_ns = np.where(has_d, s_drift / np.maximum(s_theta, 1e-9), 0.0)
    return np.stack([sd**2, (sd * per_ns) ** 2])


def _widen(
    p: np.ndarray, innov: np.ndarray, has_d: np.ndarray, on: np.ndarray, change_s: float
) -> np.ndarray:
    """Covariances after a detected clock change, where ``on``: the offset and drift variances
    grow by the squared innovations (a drift change seen only in the offset is ``change_s``
    old)."""
    p = p.copy()
    p[0, 0] += np.where(on, innov[0] ** 2, 0.0)
    p[1, 1] += np.where(on, np.where(has_d, innov[1] ** 2, (innov[0] / change_s) ** 2), 0.0)
    return p


@dataclass
class _States:
    """Hosts' states as arrays (one column per host; NaN, 0 or defaults where untracked)."""

    known: np.ndarray
    t_ns: np.ndarray
    theta: np.ndarray
    drift: np.ndarray
    p: np.ndarray  # (2, 2, hosts)
    r: np.ndarray  # (2, hosts)
    rejected: np.ndarray
    q: np.ndarray
    last_nu: np.ndarray
    rho: np.ndarray
    last_theta: np.ndarray
    last_t: np.ndarray

    @classmethod
    def of(cls, sts: list[HostState | None], t_ns: int, q0: float) -> _States:
        nan = float("nan")
        none = (t_ns, nan, nan, nan, nan, nan, nan, 0.0, 0.0, 0, q0, nan, 0.0, nan, 0)
        rows = [(s.t_ns, s.theta, s.drift, *s.p.ravel(), *s.r, s.rejected, s.q, s.last_nu,
                 s.rho, s.last_theta, s.last_t) if s else none for s in sts]  # fmt: skip
        v = np.array(rows, np.float64).reshape(-1, 15).T
        ints = np.array([(r[0], r[14]) for r in rows], np.int64).reshape(-1, 2).T
        known = np.array([s is not None for s in sts], bool)
        p = v[3:7].reshape(2, 2, -1)
        return cls(known, ints[0], v[1], v[2], p, v[7:9], v[9], v[10], v[11], v[12], v[13],
                   ints[1])  # fmt: skip

    def predict(self, t_ns: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`DriftTracker.predict` of every host: offsets, drifts, covariances."""
        dt = (t_ns - self.t_ns) * 1e-9
        adt = np.abs(dt)
        (p00, p01), (p10, p11) = self.p
        fp = np.array([[p00 + dt * p10, p01 + dt * p11], [p10, p11]])  # F·P
        p = np.array([[fp[0, 0] + fp[0, 1] * dt, fp[0, 1]], [fp[1, 0] + fp[1, 1] * dt, fp[1, 1]]])
        p[0, 0] += self.q * (adt**3 / 3)
        p[0, 1] += self.q * (dt**2 / 2)
        p[1, 0] += self.q * (dt**2 / 2)
        p[1, 1] += self.q * adt
        return self.theta + self.drift * dt, self.drift, p


def _kalman(
    th: np.ndarray, dr: np.ndarray, p: np.ndarray, innov: np.ndarray, r: np.ndarray,
    has_d: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The Kalman update of every host: offset and drift measured where ``has_d``, else the
    offset only. Returns the states (2, hosts) and their covariances (2, 2, hosts)."""
    (p00, p01), (p10, p11) = p
    s00, s11 = p00 + r[0], np.where(has_d, p11 + r[1], 1.0)
    s01, s10 = np.where(has_d, p01, 0.0), np.where(has_d, p10, 0.0)
    det = s00 * s11 - s01 * s10
    i00, i01, i10, i11 = s11 / det, -s01 / det, -s10 / det, s00 / det  # S⁻¹ (offset only: 1/s00)
    # K = P[:, idx] S⁻¹, the drift column zero where only the offset is measured
    k00, k10 = p00 * i00 + p01 * i10, p10 * i00 + p11 * i10
    k01 = np.where(has_d, p00 * i01 + p01 * i11, 0.0)
    k11 = np.where(has_d, p10 * i01 + p11 * i11, 0.0)
    x = np.stack([th + k00 * innov[0] + k01 * innov[1], dr + k10 * innov[0] + k11 * innov[1]])
    # (I − K H) P, with I − K H = R S⁻¹ on the measured rows (S = P + R there): no
    # cancellation of 1 − K where a drift variance of 1e10 ppb² (a slope-less restart) meets
    # a measured drift
    a00 = r[0] * i00
    a01 = np.where(has_d, r[0] * i01, 0.0)
    a10 = np.where(has_d, r[1] * i10, -k10)
    a11 = np.where(has_d, r[1] * i11, 1.0)
    q = np.array([[a00 * p00 + a01 * p10, a00 * p01 + a01 * p11],
                  [a10 * p00 + a11 * p10, a10 * p01 + a11 * p11]])  # fmt: skip
    q[0, 1] = q[1, 0] = 0.5 * (q[0, 1] + q[1, 0])
    return x, q
