"""1024 simulated hosts, ±50 ms offsets, ±100 ppm drifts with wander: accuracy vs truth."""

from __future__ import annotations

import numpy as np
from sync_helpers import centered_errors, p99, run_sync

from fleetlens.topology import from_spec

# One NIC per host, 32 leaves × 4 spines, 8 peers: 4096 NIC-pair edges, 3 windows of 1 s.
FLEET = "leafspine:hosts=1024,nics=1,leaves=32,spines=4"


def _host_p99(run) -> list[float]:
    return [
        float(np.percentile(centered_errors(e, t), 99))
        for e, t in zip(run.est, run.truth, strict=True)
    ]


def test_software_stamps_p99_within_100ns_and_network_effect_helps() -> None:
    run = run_sync(from_spec(FLEET), 3, seed=11, peers=8)
    per_window = _host_p99(run)
    pw, net = p99(run.pairwise), p99(run.network)
    print(f"\nsoftware: host p99 |offset error| per window {np.round(per_window, 1)} ns")
    print(f"software: edge p99 pairwise-only {pw:.1f} ns, after network effect {net:.1f} ns")
    assert all(s.all() for s in run.synced)  # every host measured and synced
    assert max(per_window) <= 100.0
    assert net < 0.8 * pw
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


def test_hardware_stamps_p99_within_10ns() -> None:
    # Drift wander as a random walk (20 ppb/√s); the simulator's optional temperature steps
    # (300 ppb jumps) are off here: a jump inside a window bends the clock and no single line
    # per window fits it to 10 ns (figures with them: bench/sync_sim.py, see the report).
    run = run_sync(from_spec(FLEET), 3, seed=12, peers=8, ts_source="hardware", temp_step_rate=0)
    per_window = _host_p99(run)
    pw, net = p99(run.pairwise), p99(run.network)
    print(f"\nhardware: host p99 per window {np.round(per_window, 2)} ns")
    print(f"hardware: edge p99 pairwise-only {pw:.2f} ns, after network effect {net:.2f} ns")
    assert all(s.all() for s in run.synced)
    assert max(per_window) <= 10.0
    assert net < pw
