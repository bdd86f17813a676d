"""Real packets: agents in lab namespaces with injected clock offsets and drifts, a real
collector running HuygensSync, accuracy against the injected truth, idle and under load."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from lab_helpers import (
    Injection,
    Procs,
    Recorder,
    collector_on,
    errors,
    rx_packets,
    start_agents,
    start_flood,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: builds network namespaces (CI runs as root)"
)

IDLE_S, LOAD_S = 14.0, 14.0
CONVERGE_S = 5.0


@pytest.mark.known_flaky(
    reason="issue 6: in 1 of 3 full CI runs two hosts kept 5-7 µs error bounds and p99 was "
    "5.5 µs idle (98 ns when run alone); cause not yet found"
)
def test_lab_accuracy_idle_and_under_load_against_injected_clocks() -> None:
    from fleetlens.fixtures.lab.fabric import lab_fabric

    rng = np.random.default_rng(42)
    procs = Procs()
    tmp = Path(tempfile.mkdtemp(prefix="sy-lab-"))
    rec = Recorder()
    # 4 hosts × 2 NICs on 2 leaves: every host has 3+ NIC-pair edges, loops across leaves.
    with lab_fabric("sylab", hosts=4, nics=2, leaves=2, spines=1) as lab:
        truth = {
            h: Injection(float(rng.uniform(-5e6, 5e6)), float(rng.uniform(-50e3, 50e3)))
            for h in lab.topo.hosts
        }
        t0 = time.time_ns()
        try:
            with collector_on(lab, tmp, rec, port=18471) as url:
                start = time.monotonic()
                start_agents(lab, procs, tmp, url, truth, t0)
                spine = lab.ns("spine0")
                time.sleep(IDLE_S - 4)
                c0, t_c0 = rx_packets(spine), time.monotonic()
                time.sleep(4)
                idle_pps = (rx_packets(spine) - c0) / (time.monotonic() - t_c0)
                load_at = time.monotonic()
                # Background load crossing the fabric (leaf0 -> spine -> leaf1), both ways.
                hosts = lab.topo.hosts
                start_flood(lab, procs, tmp, hosts[0], f"{hosts[-1]}/eth1", LOAD_S + 5, 0.002)
                start_flood(lab, procs, tmp, hosts[-1], f"{hosts[0]}/eth0", LOAD_S + 5, 0.002)
                time.sleep(4)
                c0, t_c0 = rx_packets(spine), time.monotonic()
                time.sleep(LOAD_S - 4)
                load_pps = (rx_packets(spine) - c0) / (time.monotonic() - t_c0)
        finally:
            procs.stop_all()
    with rec.lock:
        samples = list(rec.samples)
    n_hosts = len(truth)
    full = [s for s in samples if len(s.est) == n_hosts]
    assert full, f"no window with every host synced; logs in {tmp}"
    first = min(s.mono_s for s in full) - start
    idle = [
        errors(s, truth, t0)
        for s in full
        if s.mono_s - start >= CONVERGE_S and s.mono_s < load_at + 1
    ]
    # Load windows: those that ended after the flood had been running for a full window.
    load = [errors(s, truth, t0) for s in full if s.mono_s >= load_at + 2.5]
    p_idle = float(np.percentile(np.concatenate(idle), 99)) if idle else np.inf
    p_load = float(np.percentile(np.concatenate(load), 99)) if load else np.inf
    print(
        f"\nlab: first all-synced model {first:.1f} s after the agents started; "
        f"p99 |offset error| idle {p_idle:.0f} ns ({len(idle)} windows), "
        f"under load {p_load:.0f} ns ({len(load)} windows); spine throughput idle "
        f"{idle_pps:.0f} pkt/s, loaded {load_pps:.0f} pkt/s; logs in {tmp}"
    )
    assert load_pps > 5 * idle_pps  # the load really crossed the fabric
    assert first <= CONVERGE_S
    assert p_idle <= 200.0
    assert p_load <= 500.0
    shutil.rmtree(tmp, ignore_errors=True)  # logs are kept only when something failed
