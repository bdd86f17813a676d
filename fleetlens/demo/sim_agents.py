"""What the simulated agents do between the simulator and the collector, as real agents do:
window starts on the fleet-time boundary, no one-way delays before a synced clock model; and
their clock error against the simulator's truth."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetlens.fixtures.sim import SimWindow
from fleetlens.records import ClockModel, nic_hosts

WINDOW_NS = 1_000_000_000


def clock_errors(models: dict[str, ClockModel], truth: pa.Table, ready: set[str]) -> np.ndarray:
    """Per truth host: the served model's ``raw − fleet`` at the true window start minus the
    true offset, common mode removed (fleet time is the fleet mean, so every model carries the
    same unknown constant); NaN for hosts not in ``ready`` (never solved: identity models).

    Every solved host is scored, also one whose model coasts this window (``synced`` false):
    that is the model its agent stamps with. Same scoring as the clock-sync issue's simulator
    figures (tests/sync)."""
    hosts = truth["host_id"].to_pylist()
    start = truth["start_ns"].to_numpy().astype(np.int64)
    off = truth["offset_ns"].to_numpy().astype(np.float64)
    got = [models.get(h) if h in ready else None for h in hosts]
    m_off = np.array([m.offset_ns if m else np.nan for m in got])
    m_drift = np.array([m.drift_ppb if m else np.nan for m in got])
    m_t0 = np.array([m.t0_ns if m else 0 for m in got], np.int64)
    raw = start + np.rint(off).astype(np.int64)
    err = m_off + m_drift * 1e-9 * (raw - m_t0).astype(np.float64) - off
    ok = np.isfinite(err)
    return err - err[ok].mean() if ok.any() else err


def withhold_unsynced_owd(win: SimWindow, ready: AbstractSet[str]) -> tuple[SimWindow, int]:
    """Null the one-way-delay statistics of rows whose sender or receiver has never been
    served a synced clock model; the number of such rows.

    Before its first synced model an agent stamps with its raw clock (±50 ms here), so its
    fleet-time one-way delays are off by the clock offsets. Fed to triangulation, those
    become the per-flow delay baselines (running minima) and every later, correct window
    looks milliseconds late: persistent false NIC/host alarms. The collector's first solve
    often catches a window half-posted, so the simulated agents say "no delay measurement"
    until then; loss counts and hulls (what sync needs) are sent as always. The real agent
    does not do this yet."""
    t = win.windows
    host = {c: nic_hosts(t[c]) for c in ("src_nic", "dst_nic")}
    known = pa.array(sorted(ready), pa.string())
    good = pc.and_(pc.is_in(host["src_nic"], known), pc.is_in(host["dst_nic"], known))
    bad = t.num_rows - pc.sum(good).as_py() if t.num_rows else 0
    if not bad:
        return win, 0
    for c in ("owd_min_ns", "owd_p50_ns", "owd_p99_ns", "owd_max_ns"):
        i = t.schema.get_field_index(c)
        t = t.set_column(i, c, pc.if_else(good, t[c], pa.scalar(None, t.schema.field(c).type)))
    return replace(win, windows=t), int(bad)
