"""The hulls carry the clock truth: both directions of an edge give the true offset difference.

Huygens' idea in miniature: the lower hull of A->B raw OWDs sits at d_AB + (off_B - off_A), the
B->A hull at d_BA - (off_B - off_A); half their difference at one instant is the offset
difference up to half the path asymmetry (access links differ by a few hundred ns).
"""

from __future__ import annotations

import numpy as np
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator


def _envelope(t: list[int], y: list[int], at: float) -> float:
    return float(np.interp(at, np.array(t, float), np.array(y, float)))


def test_hulls_recover_true_offsets(small_topo) -> None:
    sim = Simulator(small_topo, SimConfig(load=0.2), seed=8)
    win = next(sim.stream(1))
    truth = {r["host_id"]: r for r in win.truth_clocks.to_pylist()}
    hulls: dict[tuple[str, str], list[tuple[list[int], list[int]]]] = {}
    for r in win.windows.to_pylist():  # every flow (source port) of a NIC pair: its own hull
        if len(r["hull_t_ns"]) >= 2:
            hulls.setdefault((r["src_nic"], r["dst_nic"]), []).append(
                (r["hull_t_ns"], r["hull_owd_ns"])
            )
    at = win.start_ns + 500_000_000  # true mid-window

    def off(nic: str) -> float:
        c = truth[nic.split("/")[0]]
        return c["offset_ns"] + c["drift_ppb"] * 0.5

    def floor(nic_a: str, nic_b: str) -> float:
        """Lowest hull envelope over the pair's flows at the sender's raw time of ``at``."""
        return min(_envelope(t, y, at + off(nic_a)) for t, y in hulls[(nic_a, nic_b)])

    errors = []
    for a, b in hulls:
        if a < b and (b, a) in hulls:
            errors.append((floor(a, b) - floor(b, a)) / 2 - (off(b) - off(a)))
    errors = np.abs(errors)
    assert len(errors) > 50
    # Offsets are tens of ms; the hulls pin their differences to well under a microsecond.
    assert np.median(errors) < 400 and errors.max() < 2_000
