"""The drift tracker's hosts folded in together (``DriftTracker.update_many``, every rule as
masks over the hosts) against the per-host form it replaced, kept here as the reference:
the same decisions and states to rounding, over windows that take every rule (fresh and
stale hosts, steps, gated and confirmed surprises, drift changes, slope-less windows, poor
evidence)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from fleetlens.sync.config import SyncConfig
from fleetlens.sync.tracking import DriftTracker, HostState


@dataclass
class ScalarTracker(DriftTracker):
    """The tracker as it was: one host per call, numpy 2x2 algebra."""

    def predict(self, host: str, t_ns: int) -> tuple[float, float, np.ndarray] | None:
        st = self.states.get(host)
        if st is None:
            return None
        dt = (t_ns - st.t_ns) * 1e-9
        f = np.array([[1.0, dt], [0.0, 1.0]])
        adt = abs(dt)
        q = st.q * np.array([[adt**3 / 3, dt**2 / 2], [dt**2 / 2, adt]])
        return st.theta + st.drift * dt, st.drift, f @ st.p @ f.T + q

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


FIELDS = ("t_ns", "theta", "drift", "rejected", "q", "last_nu", "rho", "last_theta", "last_t")


def test_hosts_folded_together_equal_the_per_host_updates() -> None:
    rng = np.random.default_rng(8)
    n = 40
    hosts = [f"h{i:02d}" for i in range(n)]
    cfg = SyncConfig()
    vec, ref = DriftTracker(cfg), ScalarTracker(cfg)
    a, b = rng.normal(0, 1e4, n), rng.normal(0, 50, n)  # true offset (ns) and drift (ppb)
    steps, pending, t_ns = 0, 0, 0
    for k in range(60):
        t_ns += 12 * 10**9 if k == 30 else 10**9  # one gap past track_stale_ns
        a += np.where(rng.random(n) < 0.02, 5000.0, 0.0)  # clock steps
        b += np.where(rng.random(n) < 0.05, rng.normal(0, 300, n), 0.0)  # drift steps
        # every host measured, with a slope, where it starts (the first window, the one after
        # the gap): the per-host form's (I − K)P then loses ~1e-3 to cancellation against a
        # slope-less restart's drift variance of 1e10 ppb² (update_many's R S⁻¹ does not)
        start = k in (0, 30)
        on = (rng.random(n) < 0.9) | start
        theta = a + b * t_ns * 1e-9 + rng.normal(0, 20, n)
        theta += np.where(rng.random(n) < 0.05, rng.normal(0, 2000, n), 0.0)  # wild windows
        s_th = rng.uniform(5, 50, n)
        drift = np.where((rng.random(n) < 0.2) & ~start, np.nan, b + rng.normal(0, 30, n))
        s_d = np.where((rng.random(n) < 0.05) & ~start, cfg.drift_unknown_ppb,
                       rng.uniform(10, 100, n))  # fmt: skip
        trust = rng.random(n) < 0.6
        ev = np.where(rng.random(n) < 0.3, rng.uniform(0, 100, n), 0.0)
        names = [h for h, o in zip(hosts, on, strict=True) if o]
        got = vec.update_many(names, t_ns, theta[on], s_th[on], drift[on], s_d[on], trust[on],
                              ev[on])  # fmt: skip
        want = [
            ref.update(
                h,
                t_ns,
                float(theta[i]),
                float(s_th[i]),
                None if np.isnan(drift[i]) else float(drift[i]),
                float(s_d[i]),
                bool(trust[i]),
                float(ev[i]),
            )
            for i, h in enumerate(hosts)
            if on[i]
        ]
        assert got.tolist() == want
        steps += sum(want)
        assert vec.states.keys() == ref.states.keys()
        for h, w in ref.states.items():
            g = vec.states[h]
            for f in FIELDS:
                assert np.isclose(getattr(g, f), getattr(w, f), rtol=1e-6, atol=1e-6,
                                  equal_nan=True), (k, h, f)  # fmt: skip
            assert np.allclose(g.p, w.p, rtol=1e-6, atol=1e-6), (k, h)
            assert np.allclose(g.r, w.r, rtol=1e-6, atol=1e-6), (k, h)
            pending += w.rejected != 0
        models = vec.models(hosts, t_ns, on)
        for m in models:
            if m.host_id in ref.states:
                r = ref.model(m.host_id, t_ns, bool(on[hosts.index(m.host_id)]))
                assert (m.t0_ns, m.synced) == (r.t0_ns, r.synced)
                assert np.isclose(m.offset_ns, r.offset_ns, rtol=1e-12)
                assert np.isclose(m.error_bound_ns, r.error_bound_ns, rtol=1e-9)
    assert steps > 0 and pending > 0  # the step and confirmation rules were taken
