"""``fleetlens demo --sim`` (fleetlens.demo.sim): the demo's story on the simulator, no root.

A real collector subprocess (uvicorn on 127.0.0.1, DuckDB in a temporary directory) judges the
simulated fleet; every claim is checked against the simulator's injected truth. The full
reference fabric (1024 hosts) is too slow for CI on this machine; it runs the same function
(see the README figures), CI runs a 64-host fabric.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from fleetlens.fixtures.sim import SimConfig, Simulator

from fleetlens.demo import cli, collector, sim_agents
from fleetlens.demo import sim as demo_sim
from fleetlens.records import ClockModel
from fleetlens.topology import leaf_spine

SMALL = dict(hosts=64, nics=2, seed=3, fault_at_s=5, heal_at_s=8, max_seconds=18)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_story_on_64_hosts_against_truth(tmp_path: Path) -> None:
    pids: list[int] = []

    def note_pid(w: int, demo: demo_sim.SimFabric) -> None:
        assert demo.collector is not None and demo.collector.proc is not None
        pids.append(demo.collector.proc.pid)

    cfg = demo_sim.SimDemoConfig(**SMALL, work_parent=tmp_path)
    out = demo_sim.run_sim_demo(config=cfg, as_json=True, on_window=note_pid)
    json.dumps(out)  # the machine-readable summary is JSON as it is
    link = out["fault"]["link"]
    assert link.startswith("leaf") and "->spine" in link  # a leaf–spine link, drawn by seed
    assert out["checks"] == {
        "clocks synced": True,
        "fault localized, nothing else": True,
        "verdict cleared": True,
    }, (out["notes"], out["timeline"])
    assert out["passed"] is True
    # The localized link is the injected one, and nothing else was ever faulty.
    assert out["faulty_links"] == [link] and out["faulty_nics"] == []
    assert out["other_alarms"] == []
    assert 1 <= out["localized_s"] <= 3  # 5% loss: the triangulation issue's 3 s for >= 0.1%
    assert out["cleared_s"] is not None and out["cleared_s"] <= 10
    # Every host solved, clock error vs the simulator's truth within the sync issue's bound.
    assert out["hosts_synced"] == 64
    assert out["sync_p99_ns"] <= demo_sim.SYNC_BOUND_NS
    assert out["sync_p50_ns"] <= out["sync_p99_ns"] <= out["sync_max_ns"]
    assert len(out["clocks"]) == demo_sim.WORST_SHOWN  # the worst hosts, not all 64
    worst = [abs(r["error_ns"]) for r in out["clocks"]]
    assert worst == sorted(worst, reverse=True) and worst[0] == out["sync_max_ns"]
    assert "not applicable" in out["linkpass"]
    # Where each window's wall time went: simulating, posting, waiting for the collector.
    for row in out["timeline"]:
        parts = (row["sim_s"], row["post_s"], row["wait_s"])
        assert min(parts) >= 0 and row["post_s"] > 0 and sum(parts) <= row["wall_s"] + 0.05
    wall = out["wall_s"]
    assert wall["sim_per_window"] + wall["post_per_window"] + wall["wait_per_window"] <= (
        wall["per_window_mean"] + 0.05
    )
    # The collector is gone and its directory removed.
    assert pids and not _alive(pids[0])
    assert list(tmp_path.iterdir()) == []


def test_collector_death_is_a_clear_error_and_leaves_nothing(tmp_path: Path) -> None:
    pids: list[int] = []

    def kill_collector(w: int, demo: demo_sim.SimFabric) -> None:
        if w == 1:
            assert demo.collector is not None and demo.collector.proc is not None
            pids.append(demo.collector.proc.pid)
            os.kill(pids[0], signal.SIGKILL)  # the collector this test's run started

    cfg = demo_sim.SimDemoConfig(**{**SMALL, "hosts": 16, "nics": 1}, work_parent=tmp_path)
    with pytest.raises(collector.SimDemoError, match=r"collector (exited|unreachable)"):
        demo_sim.run_sim_demo(config=cfg, as_json=True, on_window=kill_collector)
    assert pids and not _alive(pids[0])
    assert list(tmp_path.iterdir()) == []


def test_bad_settings_fail_before_anything_starts(tmp_path: Path) -> None:
    bad = [
        demo_sim.SimDemoConfig(hosts=16, nics=1, fault_at_s=8, heal_at_s=5, work_parent=tmp_path),
        demo_sim.SimDemoConfig(hosts=16, nics=1, fault_loss_pct=0, work_parent=tmp_path),
        demo_sim.SimDemoConfig(hosts=16, nics=1, fault_link="leaf9->spine0", work_parent=tmp_path),
    ]
    for cfg in bad:
        with pytest.raises(ValueError):
            demo_sim.run_sim_demo(config=cfg, as_json=True)
    assert list(tmp_path.iterdir()) == []


def test_main_reports_an_error_exit(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.sim_main(["--hosts", "16", "--fault-at", "9", "--heal-at", "3"]) == 1
    assert "fault_at_s" in capsys.readouterr().err


# ---- the pieces, against hand-made truth ------------------------------------------------------
def _window(hosts: int = 8):
    topo = leaf_spine(hosts, 1, 2, 2)
    sim = Simulator(topo, SimConfig(clock="models", paths_known=True), seed=1)
    return topo, next(iter(sim.stream(1)))


def test_clock_errors_are_model_minus_truth_with_common_mode_removed() -> None:
    start = 1_767_225_600 * 10**9
    truth = pa.table({"host_id": ["a", "b", "c"], "start_ns": [start] * 3,
                      "offset_ns": [1e6, -2e6, 5e5]})  # fmt: skip
    common = 777.0  # fleet time is the fleet mean: every model shares an unknown constant
    errs = np.array([10.0, -30.0, 20.0])
    models = {}
    for h, off, e in zip(["a", "b", "c"], [1e6, -2e6, 5e5], errs, strict=True):
        t0 = start + 400_000_000
        drift = 5_000.0  # the model's offset at raw = start + offset must be off + e + common
        at = off + e + common - drift * 1e-9 * (start + round(off) - t0)
        models[h] = ClockModel(h, t0, at, drift, 10.0, True)
    got = sim_agents.clock_errors(models, truth, {"a", "b", "c"})
    np.testing.assert_allclose(got, errs - errs.mean(), atol=1e-3)
    # A host never solved is not scored, and does not move the common mode of the others.
    got = sim_agents.clock_errors(models, truth, {"a", "b"})
    assert np.isnan(got[2])
    np.testing.assert_allclose(got[:2], errs[:2] - errs[:2].mean(), atol=1e-3)


def test_withhold_unsynced_owd_nulls_exactly_rows_touching_unsynced_hosts() -> None:
    topo, win = _window()
    ready = set(topo.hosts[:5])
    out, n = sim_agents.withhold_unsynced_owd(win, ready)
    t = out.windows
    src = [s.split("/")[0] for s in t["src_nic"].to_pylist()]
    dst = [s.split("/")[0] for s in t["dst_nic"].to_pylist()]
    both = np.array([a in ready and b in ready for a, b in zip(src, dst, strict=True)])
    assert n == int((~both).sum()) > 0 and both.any()
    owd = np.array(t["owd_min_ns"].to_pylist(), dtype=object)
    assert all(v is None for v in owd[~both])
    assert (
        owd[both].tolist() == np.array(win.windows["owd_min_ns"].to_pylist(), object)[both].tolist()
    )
    assert t["received"].equals(win.windows["received"])  # loss counts untouched
    assert t["hull_t_ns"].equals(win.windows["hull_t_ns"])  # sync's input untouched
    assert sim_agents.withhold_unsynced_owd(win, set(topo.hosts))[1] == 0
