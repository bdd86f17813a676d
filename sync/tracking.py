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

A host not measured in a window coasts on its prediction (its uncertainty grows) and is
reported unsynchronized until measured again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fleetlens.records import ClockModel

Q_DRIFT = 50.0**2  # ppb²/s
STEP_K = 8.0
STEP_FLOOR_NS = 500.0
MAX_P_THETA_NS2 = 1e14  # unknown offset (10 ms): state from an unsynced model


@dataclass
class HostState:
    t_ns: int  # fleet time of the state
    theta: float
    drift: float
    p: np.ndarray  # 2x2 covariance (ns², ns·ppb, ppb²)


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
        self, host: str, t_ns: int, theta: float, s_theta: float, drift: float, s_drift: float
    ) -> bool:
        """Fold in one measurement; returns True when a clock step was detected."""
        pred = self.predict(host, t_ns)
        r = np.diag([s_theta**2, s_drift**2])
        if pred is None or pred[2][0, 0] >= MAX_P_THETA_NS2:
            self.states[host] = HostState(t_ns, theta, drift, r)
            return False
        th, dr, p = pred
        s = p + r
        innov = np.array([theta - th, drift - dr])
        if abs(innov[0]) > STEP_K * np.sqrt(s[0, 0]) + STEP_FLOOR_NS:
            self.states[host] = HostState(t_ns, theta, drift, r)
            return True
        k = p @ np.linalg.inv(s)
        x = np.array([th, dr]) + k @ innov
        p_new = (np.eye(2) - k) @ p
        self.states[host] = HostState(t_ns, float(x[0]), float(x[1]), 0.5 * (p_new + p_new.T))
        return False

    def model(self, host: str, t_ns: int, synced: bool) -> ClockModel:
        """The published model at fleet time ``t_ns`` (coasting if not updated there)."""
        pred = self.predict(host, t_ns)
        if pred is None:
            return ClockModel.identity(host)
        th, dr, p = pred
        bound = 3.0 * float(np.sqrt(p[0, 0]))
        return ClockModel(host, int(t_ns + round(th)), float(th), float(dr), bound, synced)
