"""Simulated fleets, ±50 ms offsets, ±100 ppm drifts with wander and drift steps: accuracy vs
truth on every window of the run, not a sample of windows."""

from __future__ import annotations

import numpy as np
from sync_helpers import centered_errors, drift_transients, p99, per_window_p99, run_sync

from fleetlens.topology import from_spec

# One NIC per host, 32 leaves × 4 spines, 8 peers: 4096 NIC-pair edges.
FLEET = "leafspine:hosts=1024,nics=1,leaves=32,spines=4"
# Long enough for the pooled spans to be scored and chosen (3 windows) and for ~150 drift
# steps (the simulator's 0.02 per host and second) to hit the fleet: the 124-149 ns windows of
# an earlier version came from window 4 on, after the first steps.
SECONDS = 8


def _host_p99(run) -> list[float]:
    return [
        float(np.percentile(centered_errors(e, t), 99))
        for e, t in zip(run.est, run.truth, strict=True)
    ]


def test_software_stamps_p99_within_100ns_every_window_and_network_effect_helps() -> None:
    run = run_sync(from_spec(FLEET), SECONDS, seed=11, peers=8)
    per_window = _host_p99(run)
    pw, net = per_window_p99(run.pairwise), per_window_p99(run.network)
    print(f"\nsoftware: host p99 |offset error| per window {np.round(per_window, 1)} ns")
    print(f"software: edge p99 pairwise-only per window {np.round(pw, 1)} ns")
    print(f"software: edge p99 network effect per window {np.round(net, 1)} ns")
    assert len(per_window) == SECONDS
    assert all(s.all() for s in run.synced)  # every host measured and synced, every window
    assert max(per_window) <= 100.0  # every window, the first included
    assert p99(run.network) < 0.8 * p99(run.pairwise)
    assert all(n < p for n, p in zip(net, pw, strict=True))
    # Published error bounds cover the truth for nearly every host.
    cover = [
        np.mean(centered_errors(e, t) <= b)
        for e, t, b in zip(run.est, run.truth, run.bounds, strict=True)
    ]
    print(f"software: error-bound coverage per window {np.round(cover, 3)}")
    assert min(cover) >= 0.95
    # Real-time mode: window w-1's model extrapolated to window w's start.
    ahead = [
        np.percentile(centered_errors(a, t), 99)
        for a, t in zip(run.ahead, run.truth[1:], strict=True)
    ]
    print(f"software: extrapolated one window ahead p99 {np.round(ahead, 1)} ns")
    assert max(ahead) <= 200.0


def test_hardware_stamps_p99_within_10ns_with_a_one_window_transient_at_drift_steps() -> None:
    # Drift wander (20 ppb/√s) and temperature-like drift steps (0.02 per host and second,
    # σ 300 ppb). A step inside a window bends that host's clock there and no single line per
    # window follows a bend: those host-windows are the transient, scored apart and bounded.
    run = run_sync(from_spec(FLEET), SECONDS + 1, seed=12, peers=8, ts_source="hardware")
    bent = drift_transients(run)
    steady, hit = [], []
    for w in range(1, bent.shape[0]):  # window 0: first measurement, no drift history yet
        err = run.est[w] - run.truth[w]
        err = np.abs(err - np.mean(err[~bent[w]]))
        steady.append(float(np.percentile(err[~bent[w]], 99)))
        hit.append(err[bent[w]])
    worst = np.concatenate(hit)
    pw, net = per_window_p99(run.pairwise), per_window_p99(run.network)
    print(f"\nhardware: host p99 per window (steady hosts) {np.round(steady, 2)} ns")
    print(f"hardware: edge p99 pairwise-only per window {np.round(pw, 1)} ns")
    print(f"hardware: edge p99 network effect per window {np.round(net, 1)} ns")
    print(f"hardware: transient host-windows {worst.size}, max |error| {worst.max():.1f} ns")
    assert all(s.all() for s in run.synced)
    assert max(steady) <= 10.0
    # The transient is rare: ~2 % of hosts step per second, each marking up to 2 windows.
    assert bent[1:].sum(axis=1).max() <= 0.06 * bent.shape[1]
    assert worst.max() <= 200.0  # and bounded
    # It lasts only while the drift changes: the window after, those hosts are scored with
    # the steady ones again (p99 above) and none is far off.
    after = []
    for w in range(1, bent.shape[0] - 1):
        err = run.est[w + 1] - run.truth[w + 1]
        err = np.abs(err - np.mean(err[~bent[w + 1]]))
        after.append(err[bent[w] & ~bent[w + 1]])
    after = np.concatenate(after)
    print(f"hardware: the window after: {after.size} hosts, max |error| {after.max():.1f} ns")
    assert after.max() <= 30.0
    assert p99(run.network) < p99(run.pairwise)
