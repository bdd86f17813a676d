"""Prometheus metrics at fleet scale: `/metrics` render time, series and bytes, and the cost of
one ingest batch's metric update, for the metrics of this tree and of a git revision, in one
command.

    .venv/bin/python bench/metrics_scale.py --against 69a8165            # 1024, 8192, 32768 NICs
    .venv/bin/python bench/metrics_scale.py --nics 1024 --against main   # quick

Each fleet is ``leafspine:hosts=N/8,nics=8,leaves=max(8,N/256),spines=8`` (8,192 NICs: the reference
fabric, 32 leaves). The collector's metric objects are fed what a running collector gives them:
one batch per host (its NICs' planned peer pairs, ``fleetlens.plan``, 4 source ports each:
about 1,000 window rows, the agents' real shape), a clock model per host and a verdict per link
(20 faulty). Figures: mean milliseconds of one batch's metric update over one batch from every
host; median of 3 renders of the whole exposition (`Metrics.exposition`, what `/metrics`
returns); its series (sample lines) and megabytes. The old code is ``api/metrics.py`` of
``--against`` loaded from git beside this tree's (its per-NIC histograms had no topology).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa
from fleetlens.api import metrics as new_metrics

from fleetlens.plan import peer_pairs
from fleetlens.records import WINDOW_SCHEMA, ClockModel, Verdict
from fleetlens.topology import Topology, from_spec

ROOT = Path(__file__).resolve().parent.parent
SPORTS = 4
FAULTY = 20


def spec(nics: int) -> str:
    return f"leafspine:hosts={nics // 8},nics=8,leaves={max(8, nics // 256)},spines=8"


def old_module(rev: str, tmp: Path) -> ModuleType:
    """``api/metrics.py`` as it was at ``rev``, imported under another name."""
    src = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:api/metrics.py"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    path = tmp / "metrics_old.py"
    path.write_text(src)
    spec_ = importlib.util.spec_from_file_location("metrics_old", path)
    assert spec_ is not None and spec_.loader is not None
    mod = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(mod)
    return mod


def batches(topo: Topology, t0: int) -> list[pa.Table]:
    """One window batch per host: each of its NICs' planned peers, SPORTS ports each."""
    src, dst = peer_pairs(topo, peers=16, seed=0)
    nic_ids = np.array([n.id for n in topo.nics])
    host_of = np.array([topo.hosts.index(n.host) for n in topo.nics])
    rng = np.random.default_rng(0)
    out = []
    order = np.argsort(host_of[src], kind="stable")
    src, dst = src[order], dst[order]
    bounds = np.searchsorted(host_of[src], np.arange(len(topo.hosts) + 1))
    for h in range(len(topo.hosts)):
        s = np.repeat(src[bounds[h] : bounds[h + 1]], SPORTS)
        d = np.repeat(dst[bounds[h] : bounds[h + 1]], SPORTS)
        n = len(s)
        cols: dict[str, Any] = {f.name: pa.nulls(n, f.type) for f in WINDOW_SCHEMA}
        cols |= {
            "src_nic": pa.array(nic_ids[s]), "dst_nic": pa.array(nic_ids[d]),
            "sport": pa.array(np.tile(np.arange(SPORTS, dtype=np.int32) + 33000, n // SPORTS)),
            "start_ns": pa.array(np.full(n, t0)), "owd_p50_ns": pa.array(rng.uniform(2e3, 2e4, n)),
        }  # fmt: skip
        out.append(pa.table(cols, schema=WINDOW_SCHEMA))
    return out


def state(topo: Topology) -> tuple[list[Verdict], list[ClockModel]]:
    verdicts = [
        Verdict(lk.id, "link", "faulty" if i < FAULTY else "healthy", 0, 1e3, 0.1, 0.9)
        for i, lk in enumerate(topo.links)
    ]
    clocks = [ClockModel(h, 0, 1e3, 5.0, 200.0, True) for h in topo.hosts]
    return verdicts, clocks


def build(mod: ModuleType, topo: Topology, new: bool) -> Any:
    zero = lambda: 0.0  # noqa: E731
    m = mod.Metrics(zero, zero, zero, zero, *((topo, False) if new else ()))
    verdicts, clocks = state(topo)
    m.add_state(mod.StateCollector(lambda: verdicts, lambda: clocks, FAULTY))
    return m


def measure(mod: ModuleType, topo: Topology, feed: list[pa.Table], new: bool) -> dict[str, float]:
    m = build(mod, topo, new)
    t0 = time.perf_counter()
    for b in feed:
        m.owd.observe(b)
    update_ms = (time.perf_counter() - t0) / len(feed) * 1e3
    renders, text = [], b""
    for _ in range(3):
        t0 = time.perf_counter()
        text = m.exposition()
        renders.append(time.perf_counter() - t0)
    series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    return {
        "update_ms": update_ms, "render_ms": statistics.median(renders) * 1e3,
        "series": series, "mb": len(text) / 1e6,
    }  # fmt: skip


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nics", default="1024,8192,32768", help="fleet sizes (NICs, comma list)")
    ap.add_argument("--against", default="main", help="git revision of the old metrics")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        old = old_module(a.against, Path(tmp))
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", a.against],
                         capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    print(f"old: api/metrics.py at {rev}; new: this tree. Per batch: ~{SPORTS * 256} rows.")
    print(f"{'NICs':>6} {'code':>4} {'update ms/batch':>16} {'render ms':>10} "
          f"{'series':>9} {'MB':>7}")  # fmt: skip
    for n in (int(x) for x in a.nics.split(",")):
        topo = from_spec(spec(n))
        feed = batches(topo, time.time_ns())
        res = {
            "old": measure(old, topo, feed, False),
            "new": measure(new_metrics, topo, feed, True),
        }
        for code, r in res.items():
            print(f"{n:>6} {code:>4} {r['update_ms']:>16.3f} {r['render_ms']:>10.1f} "
                  f"{r['series']:>9} {r['mb']:>7.2f}")  # fmt: skip
        o, w = res["old"], res["new"]
        print(f"{n:>6}  old/new: update {o['update_ms'] / w['update_ms']:.1f}x, render "
              f"{o['render_ms'] / w['render_ms']:.1f}x, series {o['series'] / w['series']:.1f}x",
              flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
