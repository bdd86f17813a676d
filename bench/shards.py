"""The fleet tier's CPU per window, against one collector fed the same windows, and a
projection for 16,384 hosts x 8 NICs (issue 27).

    flock /work/BENCH.lock nice -n 10 .venv/bin/python bench/shards.py              # 1024, 4096
    .venv/bin/python bench/shards.py --hosts 64 --windows 3                          # quick

Per fleet size (leaf-spine, 8 NICs a host, 32 hosts a leaf, rail wiring as the reference
fleet's), ``--windows`` simulated windows, each run through, in this process, one after the
other:

- **shards' summaries**: every host batch summarized and encoded as a shard's
  ``SummaryPublisher`` does (``fleetlens.api.summaries``): CPU per batch;
- **fleet tier** (``FleetCollector``): every summary decoded, checked, committed (ids in
  DuckDB, rows held in memory), then both rounds (clock solve, triangulation): process CPU per
  window (every thread), NATS left out;
- **baseline, one collector** (``Collector``): the raw batches decoded and checked as HTTP
  ingest does, committed to DuckDB, then the same rounds: CPU per window.

The first window is left out of the averages (the engines' one-off set-up). The projection
scales the per-window figures linearly in hosts (rows, flows and hull pairs all are) to
16,384 hosts x 8 NICs at one window a second; the shards' storing of rows is not measured
here (``fleetlens collector --shard``'s rows/s are ``nats27``'s part of this bench).
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import pyarrow.compute as pc
from fleetlens.api import summaries
from fleetlens.api.config import Settings
from fleetlens.api.fleet import FleetCollector
from fleetlens.api.service import Collector
from fleetlens.api.writer import Backpressure
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator

from fleetlens.batch import CT_ARROW, Batch, decode_batch, encode_batch
from fleetlens.records import WINDOW_SCHEMA, nic_hosts
from fleetlens.topology import from_spec

TARGET_HOSTS = 16_384
SEC = 1_000_000_000


def spec(hosts: int) -> str:
    leaves = max(hosts // 32, 8)  # rail wiring: a multiple of the 8 NICs
    return f"leafspine:hosts={hosts},nics=8,leaves={leaves},spines=8"


def batches_of(window) -> list[Batch]:
    """One batch per host, as the agents send them."""
    hosts = nic_hosts(window["src_nic"])
    order = pc.sort_indices(hosts)
    window, hosts = window.take(order), hosts.take(order).to_numpy(zero_copy_only=False)
    cuts = [0, *(i for i in range(1, len(hosts)) if hosts[i] != hosts[i - 1]), len(hosts)]
    gen = window["start_ns"][0].as_py()
    return [
        Batch(f"b-{gen}-{hosts[a]}", str(hosts[a]), window.slice(a, b - a))
        for a, b in itertools.pairwise(cuts)
    ]


def _all_in(submit: Callable[[bytes], Future[bool]], bodies: list[bytes]) -> list[bool]:
    """Every body submitted and committed; on a full writer queue, wait for the oldest."""
    futs: list[Future[bool]] = []
    done = 0
    for body in bodies:
        while True:
            try:
                futs.append(submit(body))
                break
            except Backpressure:
                futs[done].result(timeout=600)
                done += 1
    return [f.result(timeout=600) for f in futs]


def _ingested(c: Collector, body: bytes, now_ns: int) -> Batch:
    """A raw batch as HTTP ingest takes it in: decoded, checked."""
    batch = decode_batch(body, CT_ARROW)
    c.check_context(batch, now_ns)
    return batch


def run(hosts: int, n_windows: int, tmp: Path) -> dict[str, float]:
    topo = from_spec(spec(hosts))
    inventory = tmp / f"topo-{hosts}.json"
    topo.save(inventory)
    epoch = (time.time_ns() // SEC - 600) * SEC
    sim = Simulator(topo, SimConfig(paths_known=True, epoch_ns=epoch), seed=1)
    settings = {"inventory": str(inventory), "insecure_no_auth": True}
    fleet = FleetCollector(Settings(db_path=tmp / f"fleet-{hosts}.duckdb", **settings))
    one = Collector(Settings(db_path=tmp / f"one-{hosts}.duckdb", **settings))
    fleet.start(loops=False)
    one.start(loops=False)
    cpu = dict.fromkeys(("summarize", "fleet_in", "fleet_rounds", "one_in", "one_rounds"), 0.0)
    n_batches = rows = 0
    try:
        for w in sim.stream(n_windows):
            window = w.windows.select(WINDOW_SCHEMA.names)
            batches = batches_of(window)
            end = pc.max(window["start_ns"]).as_py() + SEC
            t0 = time.process_time()
            bodies = [summaries.encode(summaries.of_batch("p", b)) for b in batches]
            t_sum = time.process_time() - t0
            raw = [encode_batch(b.host_id, b.windows, b.batch_id)[0] for b in batches]
            t0 = time.process_time()
            assert all(_all_in(lambda body, end=end: fleet.take(body, "0/1", end), bodies))
            t1 = time.process_time()
            fleet.run_round(end + 6 * SEC)
            t2 = time.process_time()
            assert all(_all_in(lambda body, end=end: one.submit(_ingested(one, body, end)), raw))
            t3 = time.process_time()
            one.run_round(end + 6 * SEC)
            t4 = time.process_time()
            t_fleet, t_one = (t1 - t0, t2 - t1), (t3 - t2, t4 - t3)
            print(f"  {hosts} hosts, window {w.index}: {window.num_rows} rows, CPU s: summarize "
                  f"{t_sum:.2f}; fleet tier in {t_fleet[0]:.2f} rounds {t_fleet[1]:.2f}; one "
                  f"collector in {t_one[0]:.2f} rounds {t_one[1]:.2f}", flush=True)  # fmt: skip
            if w.index == 0:
                continue
            cpu["summarize"] += t_sum
            for key, t in zip(("fleet_in", "fleet_rounds", "one_in", "one_rounds"),
                              (*t_fleet, *t_one), strict=True):  # fmt: skip
                cpu[key] += t
            n_batches += len(batches)
            rows += window.num_rows
    finally:
        fleet.stop()
        one.stop()
    n = max(n_windows - 1, 1)
    return {
        "rows": rows / n, "batches": n_batches / n,
        "summarize_ms_per_batch": cpu["summarize"] / max(n_batches, 1) * 1e3,
        **{k: cpu[k] / n for k in ("fleet_in", "fleet_rounds", "one_in", "one_rounds")},
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hosts", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--windows", type=int, default=3, help="simulated windows (first left out)")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        res = {h: run(h, a.windows, Path(d)) for h in a.hosts}
    print("\nCPU s per window   rows     summarize  fleet in  fleet rounds  one in  "
          "one rounds  fleet/one")  # fmt: skip
    for h, r in res.items():
        fleet, one = r["fleet_in"] + r["fleet_rounds"], r["one_in"] + r["one_rounds"]
        summarize = r["summarize_ms_per_batch"] * r["batches"] / 1e3
        print(f"{h:5d} hosts  {r['rows']:11.0f}  {summarize:9.2f}"
              f"  {r['fleet_in']:8.2f}  {r['fleet_rounds']:12.2f}  {r['one_in']:6.2f}  "
              f"{r['one_rounds']:10.2f}  {fleet / one:9.2f}")  # fmt: skip
    big = max(res)
    r, scale = res[big], TARGET_HOSTS / big
    print(f"\nprojection, {TARGET_HOSTS} hosts x 8 NICs, a window a second, linear from {big} "
          f"hosts: {r['rows'] * scale / 1e6:.1f} M rows/s; shards' summaries "
          f"{r['summarize_ms_per_batch'] * 1e-3 * TARGET_HOSTS:.1f} cores in all; fleet tier "
          f"intake {r['fleet_in'] * scale:.1f} cores, rounds {r['fleet_rounds'] * scale:.1f} "
          "CPU s a window on two loop threads")  # fmt: skip


if __name__ == "__main__":
    main()
