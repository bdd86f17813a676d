"""Real packets: agents in lab namespaces with injected clock offsets and drifts, a real
collector running HuygensSync, accuracy against the injected truth, idle and under load.

One lab run (module fixture) feeds two tests: accuracy (idle and loaded) and convergence time.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from lab_helpers import (
    Injection,
    Procs,
    Recorder,
    agent_stages,
    collector_on,
    errors,
    rx_packets,
    start_agents,
    start_flood,
)

pytestmark = [
    pytest.mark.root,  # deselected by -m "not root"
    pytest.mark.skipif(
        os.geteuid() != 0, reason="needs root: builds network namespaces (CI runs as root)"
    ),
]

IDLE_S, LOAD_S = 14.0, 14.0
CONVERGE_S = 5.0
SCORE_FROM_S = 5.0  # windows scored from here on (the convergence time)
# The flood is a Python sender; on a busy box it gets less CPU, so the spine's packet rate
# rose 3.6-7x over the probes' in runs here. 3x still means the load crossed the fabric.
LOAD_FACTOR = 3.0


@dataclass
class LabRun:
    first_s: float  # first window with every host synced, s after the agents were spawned
    p_idle: float
    p_load: float
    n_idle: int
    n_load: int
    idle_pps: float
    load_pps: float
    tmp: Path
    stages: dict[str, float]  # s after the agents were spawned (the slowest agent's)
    pure_share: float  # pure pairs over pairs that arrived, over the whole run


@pytest.fixture(scope="module")
def lab_run() -> Iterator[LabRun]:
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
                start, spawn_wall = time.monotonic(), time.time()
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
                load_end = time.monotonic()
                # Agents stop while the collector still answers: they hand over their last
                # windows and exit, instead of waiting out their 5 s flush for a collector
                # already gone (6 s of the setup's 39).
                procs.stop_all()
        finally:
            procs.stop_all()
    with rec.lock:
        samples = list(rec.samples)
    full = [s for s in samples if len(s.est) == len(truth)]
    first = min(s.mono_s for s in full) - start if full else np.inf
    idle = [
        errors(s, truth, t0)
        for s in full
        if s.mono_s - start >= SCORE_FROM_S and s.mono_s < load_at + 1
    ]
    # Load windows: those that ended after the flood had been running for a full window.
    # (Solves after the load ended, as the agents stopped, are not load windows.)
    load = [errors(s, truth, t0) for s in full if load_at + 2.5 <= s.mono_s <= load_end]
    stages = agent_stages(tmp, list(truth), spawn_wall)
    stages["first solve with windows"] = (rec.first_rows_s or np.inf) - start
    stages["first all-synced model"] = first
    run = LabRun(
        first, _p99(idle), _p99(load), len(idle), len(load), idle_pps, load_pps, tmp, stages,
        _pure_share(tmp / "fl.duckdb"),
    )  # fmt: skip
    print(
        f"\nlab: first all-synced model {run.first_s:.1f} s after the agents started; "
        f"p99 |offset error| idle {run.p_idle:.0f} ns ({run.n_idle} windows), "
        f"under load {run.p_load:.0f} ns ({run.n_load} windows); pure pairs "
        f"{run.pure_share:.0%}; spine throughput idle "
        f"{idle_pps:.0f} pkt/s, loaded {load_pps:.0f} pkt/s; logs in {tmp}\nstart-up stages, "
        "s after spawning the agents (slowest agent): "
        + ", ".join(f"{k} {v:.2f}" for k, v in stages.items())
    )
    yield run
    if _accurate(run):  # logs are kept only when accuracy failed (times are printed)
        shutil.rmtree(tmp, ignore_errors=True)


def _pure_share(db: Path) -> float:
    """Pure pairs over pairs whose two probes arrived (the collector has stopped)."""
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        pure, received = con.execute("SELECT sum(pure), sum(received) FROM windows").fetchone()
    return 2 * float(pure or 0) / max(float(received or 0), 1.0)


def _p99(errs: list[np.ndarray]) -> float:
    return float(np.percentile(np.concatenate(errs), 99)) if errs else np.inf


def _accurate(run: LabRun) -> bool:
    ok = run.load_pps > LOAD_FACTOR * run.idle_pps and run.n_idle >= 3 and run.n_load >= 3
    return ok and run.p_idle <= 200.0 and run.p_load <= 500.0


def test_lab_accuracy_idle_and_under_load_against_injected_clocks(lab_run: LabRun) -> None:
    assert lab_run.load_pps > LOAD_FACTOR * lab_run.idle_pps  # the load crossed the fabric
    assert lab_run.n_idle >= 3 and lab_run.n_load >= 3, f"too few synced windows: {lab_run}"
    assert lab_run.p_idle <= 200.0
    assert lab_run.p_load <= 500.0


def test_most_pairs_are_pure_with_software_timestamps(lab_run: LabRun) -> None:
    """The agents send a primer before each pair (``--primer auto``: software stamps). On this
    VM kind the first datagram through an idle veth chain took 4-22 µs against the second's
    1-3 µs (``probe/fastpath.pyx``). Here (several peers per NIC and round, so only a round's
    first pair meets the idle path) 91-93 % of pairs were pure in three runs, 52 % with
    ``--primer off``; two hosts probing only each other had 0.2-3 % without it."""
    assert lab_run.pure_share >= 0.75


def test_lab_first_synced_model_within_5_s_of_the_agents_starting(lab_run: LabRun) -> None:
    """Spawned agents probe within ~0.5-1 s (heavy imports come after the first probe), upload
    each window ms after it ends, and the collector solves as soon as every agent's upload is
    in: the first window all four agents probed in gives the first all-synced model."""
    assert lab_run.first_s <= CONVERGE_S, lab_run.stages
