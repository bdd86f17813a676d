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

    def predict(self, host: str, t_ns: int) -> tuple[float, float, np.ndarray] | None:
        st = self.states.get(host)
        if st is None:
            return None
        dt = (t_ns - st.t_ns) * 1e-9
        f = np.array([[1.0, dt], [0.0, 1.0]])
        adt = abs(dt)
        q = st.q * np.array([[adt**3 / 3, dt**2 / 2], [dt**2 / 2, adt]])
        return st.theta + st.drift * dt, st.drift, f @ st.p @ f.T + q

    def predict_many(
        self, hosts: list[str], t_ns: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`predict` of every host at once: offsets, drifts, offset and drift
        variances (NaN where a host is not tracked). Same arithmetic as :meth:`predict`."""
        sts = [self.states.get(h) for h in hosts]
        t0 = np.array([s.t_ns if s else t_ns for s in sts], np.int64)
        v = np.array([(s.theta, s.drift, s.p[0, 0], s.p[0, 1], s.p[1, 0], s.p[1, 1], s.q)
                      if s else (np.nan,) * 7 for s in sts], np.float64).reshape(-1, 7)  # fmt: skip
        theta, drift, p00, p01, p10, p11, q = v.T
        dt = (t_ns - t0) * 1e-9
        adt = np.abs(dt)
        var_theta = (p00 + dt * p10) + (p01 + dt * p11) * dt + q * (adt**3 / 3)
        return theta + drift * dt, drift, var_theta, p11 + q * adt

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
        cfg = self.cfg
        meas_d = drift if drift is not None and s_drift < cfg.drift_unknown_ppb else None
        has_d = meas_d is not None
        idx = [0, 1] if has_d else [0]
        floor = np.array([s_theta**2, s_drift**2 if has_d else 0.0])
        extra = _evidence(evidence_sd, s_theta, s_drift, has_d)
        pred = self.predict(host, t_ns)
        stale = host in self.states and t_ns - self.states[host].t_ns > cfg.track_stale_ns
        if pred is None or stale or pred[2][0, 0] >= cfg.max_p_theta_ns2:
            d0 = meas_d if meas_d is not None else (pred[1] if pred is not None else 0.0)
            self._restart(host, t_ns, theta, d0, floor, has_d)
            return False
        th, dr, p = pred
        old = self.states[host]
        r = np.maximum(floor, old.r) + extra
        new_d = meas_d if meas_d is not None else dr
        innov = (np.array([theta, new_d]) - np.array([th, dr]))[idx]
        s = p[np.ix_(idx, idx)] + np.diag(r[idx])
        sd = np.sqrt(np.diag(s))
        z = np.abs(innov) / sd
        side = 1 if innov[0] > 0 else -1
        # Confirmed: a cross-checked measurement, or the previous window surprised the same
        # way and agrees with this one (a step or a new drift shows the same new line twice;
        # two wild windows in a row under load, 7.6 and 2.6 µs off, do not).
        again = theta - (old.last_theta + dr * (t_ns - old.last_t) * 1e-9)
        agree = abs(again) <= max(cfg.change_k * sd[0], cfg.confirm_rel * abs(innov[0]))
        sure = trust or (old.rejected * side >= 1 and bool(agree))
        step = abs(innov[0]) > cfg.step_k * sd[0] + cfg.step_floor_ns
        if step and sure:
            drift_known = has_d or old.p[1, 1] < cfg.drift_unknown_ppb**2
            self._restart(host, t_ns, theta, new_d, r, drift_known)
            return True
        if step or (z > cfg.gate_k).any():
            # A gated-out window is an outlier or a real change of the clock, not a sample of
            # the measurement noise: it must not inflate the running noise estimate (that made
            # a host whose drift prior was wrong keep µs error bounds for tens of windows).
            # Unconfirmed, even a step-sized one is coasted over (two-host lab under load:
            # single windows 6-8 µs off, each taken as a clock step, made p99 6.4 µs).
            if sure:
                self._restart(host, t_ns, theta, new_d, r, True)
                return False
            self.states[host] = HostState(
                t_ns, th, dr, p, old.r, side, old.q, last_theta=theta, last_t=t_ns
            )
            return False
        r_new, pending = old.r.copy(), 0
        changed = bool((z > cfg.change_k).any())
        if changed and sure:
            # More than the noise explains but short of the gate, confirmed: the clock changed
            # (a drift step). Widen the state by what the innovation shows so this window is
            # followed rather than averaged in over many, and learn no noise from it.
            p = _widen(p, innov, has_d, cfg.change_s)
            s = p[np.ix_(idx, idx)] + np.diag(r[idx])
        elif changed:  # unconfirmed: folded in as usual, noise not learnt from it
            pending = side
        elif extra[0] > max(old.r[0], floor[0]):
            pass  # a window its own evidence calls poor: its innovation is its, not the host's
        else:  # running noise estimates from the innovations the prediction does not explain
            r_obs = np.maximum(innov**2 - np.diag(p)[idx] - extra[idx], floor[idx])
            w = cfg.adapt
            r_new[idx] = np.where(old.r[idx] > 0, (1 - w) * old.r[idx] + w * r_obs, r_obs)
        k = p[:, idx] @ np.linalg.inv(s)
        x = np.array([th, dr]) + k @ innov
        h = np.eye(2)[idx]
        p_new = (np.eye(2) - k @ h) @ p
        p_new = 0.5 * (p_new + p_new.T)
        st = HostState(t_ns, float(x[0]), float(x[1]), p_new, r_new, pending, old.q)
        if pending:
            st.last_theta, st.last_t = theta, t_ns
        if not pending and not changed:
            _adapt_q(st, old, float(innov[0] / sd[0]), cfg)
        self.states[host] = st
        return False

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
        pred = self.predict(host, t_ns)
        if pred is None:
            return ClockModel.identity(host)
        th, dr, p = pred
        bound = 3.0 * float(np.sqrt(p[0, 0]))
        return ClockModel(host, int(t_ns + round(th)), float(th), float(dr), bound, synced)


def _adapt_q(st: HostState, old: HostState, nu: float, cfg: SyncConfig) -> None:
    """Process noise from the whiteness of the innovations. With the right process noise a
    Kalman filter's innovations are white; too much and the filter follows each measurement,
    so consecutive innovations share that measurement's error with opposite signs (lag-1
    correlation → −0.5); too little and it lags a wandering clock (correlation > 0). The
    running lag-1 correlation (weight ``cfg.adapt``) scales the host's drift process noise
    by exp(``cfg.q_gain``·ρ) per window, within [``cfg.q_min``, ``cfg.q_max``]. The measurement
    noise is learnt at the same time from the size of the innovations; the two are told apart only
    because one shapes their correlation and the other their size. (Two lab hosts on one
    clock: true drift 0, the filter started for ±100 ppm wander averaged ~3 windows.)"""
    st.rho = old.rho
    if np.isfinite(old.last_nu):
        w = cfg.adapt
        st.rho = (1 - w) * old.rho + w * float(np.clip(nu * old.last_nu, -4.0, 4.0))
        st.q = float(np.clip(old.q * np.exp(cfg.q_gain * st.rho), cfg.q_min, cfg.q_max))
    st.last_nu = nu


def _evidence(sd: float, s_theta: float, s_drift: float, has_d: bool) -> np.ndarray:
    """A window's own extra measurement variance (offset ns², drift ppb²) on top of the
    host's running noise estimate: added for this window only, and taken out of the
    innovation before the running estimate learns from it. The drift extra is the offset
    extra over the base the window's slope rests on (s_drift ≈ 2 s_theta / base)."""
    if sd <= 0.0:
        return np.zeros(2)
    per_ns = s_drift / max(s_theta, 1e-9) if has_d else 0.0
    return np.array([sd**2, (sd * per_ns) ** 2])


def _widen(p: np.ndarray, innov: np.ndarray, has_d: bool, change_s: float) -> np.ndarray:
    """Covariance after a detected clock change: the offset and drift variances grow by the
    squared innovations (a drift change seen only in the offset is ``change_s`` old)."""
    p = p.copy()
    p[0, 0] += innov[0] ** 2
    p[1, 1] += innov[1] ** 2 if has_d else (innov[0] / change_s) ** 2
    return p
