"""The agents' clock model: 'truth', 'identity' and per-window ClockModels, against truth."""

from __future__ import annotations

import numpy as np
import pytest
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator
from sim_helpers import column

from fleetlens.records import ClockModel


def _by_flow(t) -> dict[tuple, float]:
    keys = zip(
        *(t.column(c).to_pylist() for c in ("window", "src_nic", "dst_nic", "sport")), strict=True
    )
    return dict(zip(keys, t.column("owd_p50_ns").to_pylist(), strict=True))


def test_clock_truth_is_in_range_and_wanders_slowly(small_topo) -> None:
    res = Simulator(small_topo, SimConfig(), seed=2).run(4)
    c = res.truth_clocks
    off, drift = column(c, "offset_ns"), column(c, "drift_ppb")
    assert np.abs(off).max() <= 50e6 + 4 * 100e3  # ±50 ms plus drift over the run
    assert np.abs(drift).max() <= 100_000
    assert np.ptp(off) > 10e6 and np.ptp(drift) > 10_000  # hosts really differ
    # Offsets integrate the drift: window to window change ≈ drift × 1 s.
    rows = {(r["window"], r["host_id"]): r for r in c.to_pylist()}
    for (w, h), r in rows.items():
        if w:
            prev = rows[(w - 1, h)]
            assert r["offset_ns"] - prev["offset_ns"] == pytest.approx(prev["drift_ppb"], abs=50)


def test_truth_mode_owd_is_the_true_delay_and_identity_carries_offsets(small_topo) -> None:
    truth = Simulator(small_topo, SimConfig(clock="truth", load=0.0), seed=3)
    ident = Simulator(small_topo, SimConfig(clock="identity", load=0.0), seed=3)
    a, b = truth.run(2), ident.run(2)
    # Clock mode changes only the fleet-time mapping, never the physics.
    assert a.truth_clocks.equals(b.truth_clocks)
    assert column(a.windows, "pure").tolist() == column(b.windows, "pure").tolist()
    assert a.windows.column("hull_owd_ns").equals(b.windows.column("hull_owd_ns"))
    # 'truth': OWD min is the fixed path delay plus software stamp noise (>= 0, < 2 µs).
    lo = column(a.windows, "owd_min_ns")
    assert (lo > 500).all() and (lo < 10_000).all()
    assert (column(a.windows, "start_ns") % 1_000_000_000 == 0).all()
    # 'identity': fleet = raw, so OWD carries offset differences of up to ±100 ms.
    assert np.abs(column(b.windows, "owd_min_ns")).max() > 1e6


def test_supplied_clock_models_are_applied_per_window(small_topo) -> None:
    """Closed loop: models built from the true clocks make fleet OWD ≈ the 'truth' mode's."""
    ref = Simulator(small_topo, SimConfig(clock="truth"), seed=5).run(3)
    truth = {(r["window"], r["host_id"]): r for r in ref.truth_clocks.to_pylist()}

    def models(w: int) -> dict[str, ClockModel]:
        out = {}
        for h in small_topo.hosts[:-1]:  # the last host gets no model: identity
            r = truth[(w, h)]
            t0 = r["start_ns"] + round(r["offset_ns"])  # raw reading at the window start
            out[h] = ClockModel(h, t0, r["offset_ns"], r["drift_ppb"], synced=True)
        return out

    sim = Simulator(small_topo, SimConfig(clock="models"), seed=5)
    got = sim.run(3, clock_models=models)
    want, have = _by_flow(ref.windows), _by_flow(got.windows)
    last = small_topo.hosts[-1] + "/"
    near = [abs(have[k] - v) for k, v in want.items() if last not in k[1] + k[2]]
    far = [abs(have[k] - v) for k, v in want.items() if last in k[1] + k[2]]
    # Drift wander inside a window keeps the model within tens of ns of the truth.
    assert np.max(near) < 200
    assert np.min(far) > 1_000  # the host without a model keeps its raw offset
    # Window starts: the window's place on the fleet-time grid, as agents stamp it, for every
    # sender, the one without a model too (one start per window generation).
    starts: dict[int, set[int]] = {}
    for r in got.windows.select(["window", "start_ns"]).to_pylist():
        starts.setdefault(r["window"], set()).add(r["start_ns"])
    assert starts == {w: {1_767_225_600 * 10**9 + w * 10**9} for w in range(3)}
    # set_clock_models() between windows does the same as the callable.
    sim2 = Simulator(small_topo, SimConfig(clock="models"), seed=5)
    rows = []
    stream = sim2.stream(3)
    for w in range(3):
        sim2.set_clock_models(models(w))
        rows.append(next(stream).windows)
    assert all(x.equals(y.slice(0)) for x, y in zip(rows, _split(got.windows), strict=True))


def _split(t):
    w = column(t, "window")
    return [t.filter(w == i) for i in range(3)]


def test_pure_fraction_falls_with_load(small_topo) -> None:
    frac = []
    for load in (0.02, 0.2, 0.5):
        t = Simulator(small_topo, SimConfig(load=load), seed=6).run(2).windows
        frac.append(column(t, "pure").sum() / (column(t, "sent").sum() / 2))
    assert frac[0] > frac[1] > frac[2]
    assert frac[0] > 0.8 and frac[2] < 0.6


def test_hardware_stamps_are_ns_accurate(small_topo) -> None:
    sim = Simulator(small_topo, SimConfig(ts_source="hardware", load=0.0), seed=7)
    t = sim.run(1).windows
    assert set(t.column("ts_source").to_pylist()) == {"hardware"}
    fab = sim.fabric
    idx = {
        (fab.nic_ids[s], fab.nic_ids[d], int(p)): i
        for i, (s, d, p) in enumerate(zip(sim.flow_src, sim.flow_dst, sim.flow_sport, strict=True))
    }
    keys = zip(*(t.column(c).to_pylist() for c in ("src_nic", "dst_nic", "sport")), strict=True)
    base = sim.flow_base[[idx[k] for k in keys]]
    err = column(t, "owd_min_ns") - base
    assert (np.abs(err) <= 20).all()
    assert column(t, "pure").sum() / (column(t, "sent").sum() / 2) > 0.99
