"""The hulls carry the clock truth: both directions of an edge give the true offset difference.

Huygens' idea in miniature: the lower hull of A->B raw OWDs sits at d_AB + (off_B - off_A), the
B->A hull at d_BA - (off_B - off_A); half their difference at one instant is the offset
difference up to half the path asymmetry (access links differ by a few hundred ns).
"""

from __future__ import annotations

import numpy as np
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator

from fleetlens.records import lower_hull


def _envelope(t: list[int], y: list[int], at: float) -> float:
    return float(np.interp(at, np.array(t, float), np.array(y, float)))


def test_hulls_recover_true_offsets(small_topo) -> None:
    sim = Simulator(small_topo, SimConfig(load=0.2), seed=8)
    win = next(sim.stream(1))
    truth = {r["host_id"]: r for r in win.truth_clocks.to_pylist()}
    points: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for r in win.windows.to_pylist():  # a flow's points on its NIC pair's hull
        pair = points.setdefault((r["src_nic"], r["dst_nic"]), [])
        pair += zip(r["hull_t_ns"], r["hull_owd_ns"], strict=True)
    hulls = {}  # per NIC pair: the lower hull of its flows' points
    for pair, pts in points.items():
        p = np.array(pts, np.int64).reshape(-1, 2)
        if len(p) >= 2:
            h = p[lower_hull(p[:, 0], p[:, 1])]
            hulls[pair] = (h[:, 0].tolist(), h[:, 1].tolist())
    at = win.start_ns + 500_000_000  # true mid-window

    def off(nic: str) -> float:
        c = truth[nic.split("/")[0]]
        return c["offset_ns"] + c["drift_ppb"] * 0.5

    def floor(nic_a: str, nic_b: str) -> float:
        """The pair's hull envelope at the sender's raw time of ``at``."""
        return _envelope(*hulls[(nic_a, nic_b)], at + off(nic_a))

    errors = []
    for a, b in hulls:
        if a < b and (b, a) in hulls:
            errors.append((floor(a, b) - floor(b, a)) / 2 - (off(b) - off(a)))
    errors = np.abs(errors)
    assert len(errors) > 50
    # Offsets are tens of ms; the hulls pin their differences to well under a microsecond.
    assert np.median(errors) < 400 and errors.max() < 2_000
