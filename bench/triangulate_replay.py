"""Replay stored lab runs through the engine: lost-ack evidence on against off, side by side.

Each lab run leaves its collector's DuckDB file with every window's rows (``acks_lost``
included). Each is fed window by window (``Store.window_at``) to two fresh ``Triangulator``s
with the collector's configuration (``background_loss`` 1e-3, ``LAB_BACKGROUND_LOSS``): one
with ``ack_evidence`` off (the baseline) and one with it on (the candidate). Printed
per run: windows, link-hours (windows x topology links), windows where the candidate has a
link ``faulty`` that the baseline does not report ``faulty`` in that window (a NIC named
where the baseline names its access link is not counted: the sweep accepts either), the
subjects involved, and the same for ``suspect``. ``--trace`` prints each window's reported
subjects (``?``: suspect) of both.

    .venv/bin/python bench/triangulate_replay.py [--run DB:NICS,LEAVES,SPINES,WIRING ...] [--trace]

The default runs are the stored lab runs of sessions 33-35 on this box (``/tmp/sweep28-*``,
``/tmp/tri34/runs``, ``/tmp/tri35/runs``); missing files are skipped and said so.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

from fleetlens.api.store import Store
from fleetlens.triangulate import TriangulateConfig, Triangulator

from fleetlens.records import Verdict
from fleetlens.topology import leaf_spine

RUNS = (
    "/tmp/sweep28-E/tri-lab0/fleetlens.duckdb:2,4,2,rail",
    "/tmp/tri34/runs/sweepci-ackon/fleetlens.duckdb:2,4,2,rail",
    "/tmp/sweep28-C/sweep0/rail42/fleetlens.duckdb:2,4,2,rail",
    "/tmp/sweep28-D/sweep0/rail22/fleetlens.duckdb:2,2,2,rail",
    "/tmp/tri34/runs/rail22-s34/fleetlens.duckdb:2,2,2,rail",
    "/tmp/sweep28-D/sweep0/host44/fleetlens.duckdb:2,4,4,host",
    "/tmp/sweep28-A/sweep0/host33/fleetlens.duckdb:2,3,3,host",
    "/tmp/sweep28-A/sweep0/rail34/fleetlens.duckdb:1,3,4,rail",
    "/tmp/sweep28-B/sweep0/host23/fleetlens.duckdb:2,2,3,host",
    "/tmp/tri35/runs/sweepci-s35/fleetlens.duckdb:2,4,2,rail",
    "/tmp/tri35/runs/rail22-s35/fleetlens.duckdb:2,2,2,rail",
    "/tmp/tri35/runs/host33-s35/fleetlens.duckdb:2,3,3,host",
    "/tmp/tri35/runs/rail34-s35/fleetlens.duckdb:1,3,4,rail",
    "/tmp/tri35/runs/host23-s35/fleetlens.duckdb:2,2,3,host",
)
LAB_BACKGROUND_LOSS = 1e-3  # fixtures/lab/defaults.py (not imported: bench stays below apps)


@dataclass
class Tally:
    windows: int = 0
    link_hours: float = 0.0
    faulty_windows: int = 0
    episodes: int = 0  # runs of consecutive windows with an extra faulty subject
    faulty: frozenset[str] = frozenset()
    suspect_windows: int = 0
    suspect: frozenset[str] = frozenset()


def _bad(verdicts: list[Verdict]) -> dict[str, str]:
    return {v.subject: v.state for v in verdicts if v.state != "healthy"}


def _extra(cand: dict[str, str], base: dict[str, str], state: str) -> set[str]:
    """Subjects ``state`` in the candidate and not so in the baseline (a NIC whose access link
    the baseline names counts as the same finding)."""
    named = {s for s, st in base.items() if state == "suspect" or st == "faulty"}
    out = set()
    for s, st in cand.items():
        if st != state or s in named or any(o.startswith(s + "->") for o in named):
            continue
        out.add(s)
    return out


def replay(db: str, shape: str, trace: bool) -> Tally:
    nics, leaves, spines, wiring = shape.split(",")
    topo = leaf_spine(hosts=8, nics=int(nics), leaves=int(leaves), spines=int(spines),
                      wiring=wiring)  # fmt: skip
    lab = TriangulateConfig(background_loss=LAB_BACKGROUND_LOSS, ack_evidence=True)
    base = Triangulator(topo, TriangulateConfig(background_loss=LAB_BACKGROUND_LOSS,
                                                ack_evidence=False))  # fmt: skip
    cand = Triangulator(topo, lab)
    st = Store(db, read_only=True)
    starts = st.window_starts()
    t = Tally(len(starts), len(starts) * len(topo.links) / 3600.0)
    prev_b: dict[str, Verdict] = {}
    prev_c: dict[str, Verdict] = {}
    faulty: set[str] = set()
    suspect: set[str] = set()
    was = False
    for s in starts:
        w = st.window_at(s)
        vb, vc = base(w, topo, prev_b), cand(w, topo, prev_c)
        prev_b, prev_c = {v.subject: v for v in vb}, {v.subject: v for v in vc}
        bb, bc = _bad(vb), _bad(vc)
        xf, xs = _extra(bc, bb, "faulty"), _extra(bc, bb, "suspect")
        t.episodes += bool(xf) and not was
        was = bool(xf)
        t.faulty_windows += bool(xf)
        t.suspect_windows += bool(xs)
        faulty |= xf
        suspect |= xs
        if trace:

            def show(b: dict[str, str]) -> str:
                return " ".join(sorted(k + ("" if v == "faulty" else "?") for k, v in b.items()))

            print(f"  {(s - starts[0]) / 1e9:6.1f} off: {show(bb)} | on: {show(bc)}")
    st.close()
    t.faulty, t.suspect = frozenset(faulty), frozenset(suspect)
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", action="append", help="DB:NICS,LEAVES,SPINES,WIRING (repeatable)")
    ap.add_argument("--trace", action="store_true", help="each window's subjects, both engines")
    args = ap.parse_args()
    cfg = TriangulateConfig()
    print("| run | windows | link-hours | faulty extra (episodes) | subjects | suspect extra "
          "| subjects |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    total = Tally()
    t0 = time.process_time()
    for spec in args.run or RUNS:
        db, shape = spec.rsplit(":", 1)
        if not Path(db).exists():
            print(f"| {db} | missing, skipped | | | | | |")
            continue
        t = replay(db, shape, args.trace)
        name = "/".join(Path(db).parts[-3:-1])
        print(f"| {name} | {t.windows} | {t.link_hours:.1f} | {t.faulty_windows} ({t.episodes}) | "
              f"{' '.join(sorted(t.faulty)) or '-'} | {t.suspect_windows} | "
              f"{' '.join(sorted(t.suspect)) or '-'} |", flush=True)  # fmt: skip
        total.windows += t.windows
        total.link_hours += t.link_hours
        total.faulty_windows += t.faulty_windows
        total.episodes += t.episodes
        total.suspect_windows += t.suspect_windows
    print(
        f"all: {total.windows} windows, {total.link_hours:.1f} link-hours, "
        f"{total.faulty_windows} with an extra faulty subject in {total.episodes} episodes "
        f"({total.episodes / max(total.link_hours, 1e-9):.3f} per link-hour against the "
        f"stated {cfg.false_alarms_per_link_hour:g}), {total.suspect_windows} with an extra "
        f"suspect; {time.process_time() - t0:.0f} CPU-s"
    )


if __name__ == "__main__":
    main()
