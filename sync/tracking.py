"""Drift tracking across windows: a two-state Kalman filter per host, and clock-step detection.

State per host: offset θ (ns, raw − fleet) at the time of the last update and drift δ (ppb,
which is ns per s). Between updates θ grows by δ·dt; the drift itself wanders as a random walk
with spectral density ``Q_DRIFT`` ppb²/s. (50 ppb/√s: oscillator ageing is ~20 ppb/√s in the
simulator and on commodity TCXOs, and temperature steps of a few hundred ppb every minute or so
add about as much again.) Each window's network solve is one measurement of (θ, δ) with the
standard errors it reports. Agents extrapolate the published (θ, δ) between updates: that is
the real-time mode.

Clock steps: if the measured offset is more than ``STEP_K`` standard deviations of the
innovation (and more than ``STEP_FLOOR_NS``) away from the prediction, the host's clock was
stepped (or its oscillator jumped): the filter restarts from the measurement instead of
averaging the step in slowly. One clean window after the step is therefore enough to
re-converge. A false alarm only costs the averaging of one window.

Measurement noise: the network solve's standard errors are lower bounds, but with one or two
edges (a small lab) it knows nothing of the real scatter. Each host therefore keeps running
estimates of its offset and drift measurement variances from its own innovations (``ADAPT``
≈ 10 windows), so a noisy host is averaged over more windows. A measurement more than
``GATE_K`` innovation standard deviations off (but short of a step) is not folded in; two
such in a row in the same direction mean the clock really changed (e.g. a drift jump), and
the filter restarts there.

A host not measured in a window coasts on its prediction (its uncertainty grows) and is
reported unsynchronized until measured again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fleetlens.records import ClockModel

Q_DRIFT = 50.0**2  # ppb²/s
GATE_K = 5.0
ADAPT = 0.1  # weight of a new window in the running measurement-noise estimate (~10 windows)
STEP_K = 8.0
STEP_FLOOR_NS = 500.0
MAX_P_THETA_NS2 = 1e14  # unknown offset (10 ms): state from an unsynced model


@dataclass
class HostState:
    t_ns: int  # fleet time of the state
    theta: float
    drift: float
    p: np.ndarray  # 2x2 covariance (ns², ns·ppb, ppb²)
    r: np.ndarray = field(default_factory=lambda: np.zeros(2))  # running measurement
    # variance estimates (offset ns², drift ppb²)
    rejected: int = 0  # consecutive gated-out measurements (signed by direction)


@dataclass
class DriftTracker:
    states: dict[str, HostState] = field(default_factory=dict)

    def seed(self, model: ClockModel) -> None:
        """Start a host from a model handed in by the caller (e.g. after a collector restart)."""
        if model.host_id in self.states:
            return
        bound = model.error_bound_ns if model.synced and model.error_bound_ns else None
        var = (bound / 3.0) ** 2 if bound else MAX_P_THETA_NS2
        t_fleet = int(model.t0_ns - round(model.offset_ns))
        p = np.diag([var, 100.0**2 if bound else 1e10])
        self.states[model.host_id] = HostState(t_fleet, model.offset_ns, model.drift_ppb, p)

    def predict(self, host: str, t_ns: int) -> tuple[float, float, np.ndarray] | None:
        st = self.states.get(host)
        if st is None:
            return None
        dt = (t_ns - st.t_ns) * 1e-9
        f = np.array([[1.0, dt], [0.0, 1.0]])
        adt = abs(dt)
        q = Q_DRIFT * np.array([[adt**3 / 3, dt**2 / 2], [dt**2 / 2, adt]])
        return st.theta + st.drift * dt, st.drift, f @ st.p @ f.T + q

    def update(
        self,
        host: str,
        t_ns: int,
        theta: float,
        s_theta: float,
        drift: float,
        s_drift: float,
        trust: bool = False,
    ) -> bool:
        """Fold in one measurement; returns True when a clock step was detected. ``trust``:
        the measurement is known good (cross-checked by several edges on hardware stamps), so
        a gate-sized surprise is a change of the clock, followed at once."""
        pred = self.predict(host, t_ns)
        floor = np.array([s_theta**2, s_drift**2])
        if pred is None or pred[2][0, 0] >= MAX_P_THETA_NS2:
            self._restart(host, t_ns, theta, drift, floor)
            return False
        th, dr, p = pred
        old = self.states[host]
        r = np.maximum(floor, old.r)
        s = p + np.diag(r)
        innov = np.array([theta - th, drift - dr])
        sd = np.sqrt(np.diag(s))
        if abs(innov[0]) > STEP_K * sd[0] + STEP_FLOOR_NS:
            self._restart(host, t_ns, theta, drift, np.maximum(floor, old.r))
            return True
        out = np.abs(innov) > GATE_K * sd
        if out.any():
            # A gated-out window is an outlier or a real change of the clock, not a sample of
            # the measurement noise: it must not inflate the running noise estimate (that made
            # a host whose drift prior was wrong keep µs error bounds for tens of windows).
            side = 1 if innov[0] > 0 else -1
            if trust or old.rejected * side >= 1:  # (second in a row, same way) it changed
                self._restart(host, t_ns, theta, drift, r)
                return False
            self.states[host] = HostState(t_ns, th, dr, p, old.r, side)
            return False
        # Running noise estimates from the innovations the prediction does not explain.
        r_obs = np.maximum(innov**2 - np.diag(p), floor)
        r_new = (1 - ADAPT) * old.r + ADAPT * r_obs
        k = p @ np.linalg.inv(s)
        x = np.array([th, dr]) + k @ innov
        p_new = (np.eye(2) - k) @ p
        p_new = 0.5 * (p_new + p_new.T)
        self.states[host] = HostState(t_ns, float(x[0]), float(x[1]), p_new, r_new, 0)
        return False

    def _restart(self, host: str, t_ns: int, theta: float, drift: float, r: np.ndarray) -> None:
        self.states[host] = HostState(t_ns, theta, drift, np.diag(r), r.copy(), 0)

    def model(self, host: str, t_ns: int, synced: bool) -> ClockModel:
        """The published model at fleet time ``t_ns`` (coasting if not updated there)."""
        pred = self.predict(host, t_ns)
        if pred is None:
            return ClockModel.identity(host)
        th, dr, p = pred
        bound = 3.0 * float(np.sqrt(p[0, 0]))
        return ClockModel(host, int(t_ns + round(th)), float(th), float(dr), bound, synced)
