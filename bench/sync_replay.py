"""Replay a clock-sync bench run through today's solver, and set its error against the path.

``bench/sync_vs_ptp_chrony.py`` keeps every FleetLens run's collector store
(``fleetlens-*/fl.duckdb``, with ``topology.json`` one level up). Its scored hosts h00 and h01
share the machine's clock, so every offset FleetLens reports between them is error, and every
stored one-way delay is a true one-way delay. Per run this prints:

- the error replayed through the solver as it is now (``HuygensSync``, window generation by
  window generation, as the collector's loop feeds it): a change to ``sync/`` is measured in
  seconds on recorded windows instead of a 5-minute lab run (the replay of an unchanged solver
  reproduces the run's printed figures);
- the half difference of the two directions' one-way delay floors between h00 and h01, from
  the raw hull points (the 5th percentile of their per-window minima, robust to one lucky
  packet; the absolute minimum beside it). Two-way sync — Huygens, PTP, NTP — assumes
  equal floors both ways, so this asymmetry shows up as a bias no such method can see;
- the error with that asymmetry removed.

    .venv/bin/python bench/sync_replay.py /tmp/sy-bench-*/fleetlens-*
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
from fleetlens.api.config import Settings
from fleetlens.api.store import Store
from fleetlens.sync import HuygensSync, SyncConfig
from fleetlens.sync.replay import replay
from sync_vs_ptp_chrony import min_edges, pair_error

from fleetlens.topology import Topology

SETTLE_WINDOWS = 20  # the bench scores from 20 s on


def errors(store: Store, topo: Topology) -> np.ndarray:
    """h01 − h00 offset error (ns) per solved window after the settling ones."""
    gens = store.window_starts()
    sync = HuygensSync(SyncConfig(min_edges=min_edges(len(topo.hosts))))

    def read(lo: int, hi: int):
        return store.windows_between(lo, hi)

    errs = []
    for models in replay(read, gens, sync, topo, Settings.loop_lookback_ns):
        err = pair_error(models, sync.report.t_ref_ns)
        if err is not None:
            errs.append(err)
    return np.array(errs[SETTLE_WINDOWS:])


def half_asymmetry(store: Store) -> tuple[float, float]:
    """(robust, absolute) half difference h00->h01 minus h01->h00 of the one-way floors.

    Read from the hull points, which are raw (receive stamp minus send stamp, each host's own
    clock: here the one real clock), not from ``owd_min_ns``, which agents report in fleet
    time, i.e. through the clock models under test: a floor taken from it carries
    FleetLens's own error with the opposite sign."""
    first = store.oldest_window_start()
    if first is None:
        return float("nan"), float("nan")
    t = store.windows_since(first + SETTLE_WINDOWS * 1_000_000_000, without=("path",))
    src = pc.list_element(pc.split_pattern(t["src_nic"], "/"), 0).to_numpy(zero_copy_only=False)
    dst = pc.list_element(pc.split_pattern(t["dst_nic"], "/"), 0).to_numpy(zero_copy_only=False)
    row = pc.list_parent_indices(t["hull_owd_ns"]).to_numpy()
    owd = pc.list_flatten(t["hull_owd_ns"]).to_numpy(zero_copy_only=False).astype(np.float64)
    start = t["start_ns"].to_numpy()
    floor = {}
    for s, d in (("h00", "h01"), ("h01", "h00")):
        at = (src[row] == s) & (dst[row] == d)
        if not at.any():
            return float("nan"), float("nan")
        gen, inv = np.unique(start[row[at]], return_inverse=True)
        per_window = np.full(gen.size, np.inf)
        np.minimum.at(per_window, inv, owd[at])
        floor[s] = (np.percentile(per_window, 5), per_window.min())
    return tuple((floor["h00"][i] - floor["h01"][i]) / 2 for i in (0, 1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="fleetlens-* directories of bench runs")
    a = ap.parse_args(argv)
    print(f"{'run':28s} {'n':>4s} {'bias':>6s} {'std':>5s} {'p99|e|':>7s} {'asym/2':>7s} "
          f"{'(min)':>6s} {'bias-a':>7s} {'p99-a':>6s}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for run in a.runs:
            db = Path(tmp) / f"{run.name}.duckdb"
            shutil.copy(run / "fl.duckdb", db)  # the store opens read-write: leave the run as is
            store = Store(db)
            try:
                e = errors(store, Topology.load(run.parent / "topology.json"))
                half, half_min = half_asymmetry(store)
            finally:
                store.close()
            if e.size == 0:
                print(f"{str(run)[-28:]:28s} no synced window")
                continue
            r = e + half  # the error measures b - a, the asymmetry a->b - b->a
            print(f"{str(run)[-28:]:28s} {e.size:4d} {e.mean():6.0f} {e.std():5.0f} "
                  f"{np.percentile(np.abs(e), 99):7.0f} {half:7.0f} {half_min:6.0f} "
                  f"{r.mean():7.0f} {np.percentile(np.abs(r), 99):6.0f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
