"""Issue 27's figures: rows/s the collector shards store for K = 1, 2, 3, and the fleet tier's
CPU per window against one collector fed the same windows; a projection for 16,384 hosts x 8
NICs from the per-core figures.

    flock /work/BENCH.lock nice -n 10 .venv/bin/python bench/shards.py store     # K = 1, 2, 3
    flock /work/BENCH.lock nice -n 10 .venv/bin/python bench/shards.py tier      # 1024, 4096
    .venv/bin/python bench/shards.py store --windows 2 --shards 1 2 \\
        --topology leafspine:hosts=32,nics=8,leaves=4,spines=2,wiring=host        # quick
    .venv/bin/python bench/shards.py tier --hosts 64 --windows 3                  # quick

**store**: ``--windows`` simulated windows of a fabric (``--topology``, default 256 hosts x 8
NICs host-wired on 16 leaves: 16 partitions of 16 hosts, placed by load over the K shards),
per K on a fresh 3-node cluster (R3 stream): every shard is announced alive (so none leases
another's partitions while they start), K ``fleetlens collector --nats --shard I/K`` processes
start at once and lease their preferred partitions; then the windows are published as agents
publish them (``fleetlens sim --nats``'s publisher, 4 threads, as fast as it goes) and the
bench waits until every batch is stored (``fleetlens_shard_batches_stored_total``: committed,
its summary for the fleet tier published, Parquet minutes written as they close). Figures,
from the first publish: rows/s stored (wall, the publisher on the same cores), CPU us per row
of the shard processes and of the 3 nats-servers, the ratio of rows/s to K = 1's in the same
command, and the largest shard's share of the batches.

**tier**: per fleet size (leaf-spine, 8 NICs a host, 32 hosts a leaf, rail wiring as the
reference fleet's), ``--windows`` simulated windows, each run through, in this process, one
after the other:

- **shards' summaries**: every host batch summarized and encoded as a shard's
  ``SummaryPublisher`` does (``fleetlens.api.summaries``: a commit group of 64 at a time,
  several to a message): CPU per batch;
- **fleet tier** (``FleetCollector``): every summary decoded, checked, committed (ids in
  DuckDB, rows held in memory), then both rounds (clock solve, triangulation): process CPU per
  window (every thread), NATS left out;
- **baseline, one collector** (``Collector``): the raw batches decoded and checked as HTTP
  ingest does, committed to DuckDB, then the same rounds: CPU per window.

The first window is left out of the averages (the engines' one-off set-up). The projection
scales the per-window figures linearly in hosts (rows, flows and hull pairs all are) to
16,384 hosts x 8 NICs at one window a second.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pyarrow.compute as pc
from fleetlens.api import summaries
from fleetlens.api.config import Settings
from fleetlens.api.fleet import FleetCollector
from fleetlens.api.service import Collector
from fleetlens.api.shard import LEASES, ShardConfig
from fleetlens.api.writer import Backpressure
from fleetlens.fixtures.collector import CollectorProcess, tree_cpu_s
from fleetlens.fixtures.nats import NatsCluster, start_shard
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator, SimWindow
from fleetlens.fixtures.sim.stream import NatsStream

from fleetlens.batch import CT_ARROW, Batch, decode_batch, encode_batch
from fleetlens.records import WINDOW_SCHEMA, nic_hosts
from fleetlens.stream import Partitions
from fleetlens.topology import Topology, from_spec

TARGET_HOSTS = 16_384
SEC = 1_000_000_000
STORE_SPEC = "leafspine:hosts=256,nics=8,leaves=16,spines=8,wiring=host"
LEASE_TTL_S = 10.0  # the shards' default
STORED = "fleetlens_shard_batches_stored_total{"
T = TypeVar("T")


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


def _all_in(submit: Callable[[T], Future[bool]], bodies: list[T]) -> list[bool]:
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


def _summary_messages(batches: list[Batch]) -> list[bytes]:
    """The batches' summaries as shards publish them: per commit group (a fetch of
    messages), several to a message."""
    n = ShardConfig.fetch
    groups = [summaries.of_batches("p", batches[k : k + n]) for k in range(0, len(batches), n)]
    return [body for g in groups for _, body in summaries.encode(g)]


def _ingested(c: Collector, body: bytes, now_ns: int) -> Batch:
    """A raw batch as HTTP ingest takes it in: decoded, checked."""
    batch = decode_batch(body, CT_ARROW)
    c.check_context(batch, now_ns)
    return batch


def tier_run(hosts: int, n_windows: int, tmp: Path) -> dict[str, float]:
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
            bodies = _summary_messages(batches)
            t_sum = time.process_time() - t0
            raw = [encode_batch(b.host_id, b.windows, b.batch_id)[0] for b in batches]
            t0 = time.process_time()
            got = [s for body in bodies for s in summaries.decode(body)]
            assert all(_all_in(lambda s, end=end: fleet.take(s, "0/1", end), got))
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


def tier_main(a: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as d:
        res = {h: tier_run(h, a.windows, Path(d)) for h in a.hosts}
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


# ---- store: K collector shards on a backlog -----------------------------------------------------
def _announce_alive(urls: str, shards: int) -> None:
    """Every shard's ``alive.<I>`` in the leases bucket (made as a shard makes it): shards that
    start at once then lease only their preferred partitions, as in a running cluster; else
    the first one up takes the others' partitions until its next lease round."""

    async def go() -> None:
        import nats
        from nats.js.api import KeyValueConfig

        nc = await nats.connect(urls.split(","))
        try:
            js = nc.jetstream(timeout=10)
            cfg = KeyValueConfig(bucket=LEASES, ttl=LEASE_TTL_S, replicas=3)
            deadline = time.monotonic() + 30
            while True:  # a bucket just made answers once its leader is elected
                try:
                    kv = await js.create_key_value(cfg)
                    for i in range(shards):
                        await kv.put(f"alive.{i}", b"1")
                    return
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
        finally:
            await nc.close()

    asyncio.run(go())


def _stored(shard: CollectorProcess) -> int:
    """Batches the shard committed, every partition (its ``/metrics``)."""
    text = shard.client(timeout_s=10).metrics_text()
    return int(sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                   if ln.startswith(STORED)))  # fmt: skip


def _start_shards(root: Path, url: str, k: int, inventory: Path) -> list[CollectorProcess]:
    """K shards started at once, each healthy (any that started is stopped on a failure)."""
    args = ["--insecure-no-auth", "--lease-ttl-seconds", str(LEASE_TTL_S)]
    with ThreadPoolExecutor(k) as ex:
        futs = [ex.submit(start_shard, root, url, i, k, inventory, args) for i in range(k)]
    started = [f.result() for f in futs if f.exception() is None]
    if len(started) < k:
        for s in started:
            s.stop()
        raise next(e for f in futs if (e := f.exception()) is not None)
    return started


def _owned(shard: CollectorProcess) -> int:
    text = shard.client(timeout_s=10).metrics_text()
    return int(next(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                    if ln.startswith("fleetlens_shard_partitions_owned ")))  # fmt: skip


def store_run(
    topo: Topology, inventory: Path, windows: list[SimWindow], k: int, root: Path
) -> dict[str, float]:
    placed = Partitions(topo)
    parts = placed.all()
    expected = [sum(1 for p in parts if placed.preferred_shard(p, k) == i) for i in range(k)]
    with NatsCluster(root / "nats") as nc:
        _announce_alive(nc.url, k)
        shards = _start_shards(root, nc.url, k, inventory)
        servers = [p.pid for p in nc.procs if p is not None]
        try:
            deadline = time.monotonic() + 60
            while [_owned(s) for s in shards] != expected:  # each consumes its partitions
                if time.monotonic() > deadline:
                    raise RuntimeError(f"K={k}: partitions owned not {expected} after 60 s")
                time.sleep(0.25)
            t0 = time.monotonic()
            cpu0 = [tree_cpu_s(s.pid) for s in shards], sum(map(tree_cpu_s, servers))
            pub = NatsStream(nc.url, topo, workers=4)
            try:
                for w in windows:
                    pub.send_window(w, seed=1)
            finally:
                pub.close()
            total, rows, t_pub = pub.stats.batches, pub.stats.rows, time.monotonic() - t0
            while (done := [_stored(s) for s in shards]) and sum(done) < total:
                if time.monotonic() - t0 > 600:
                    raise RuntimeError(f"{sum(done)} of {total} batches stored after 600 s")
                time.sleep(0.25)
            wall = time.monotonic() - t0
            cpu1 = [tree_cpu_s(s.pid) for s in shards], sum(map(tree_cpu_s, servers))
        finally:
            for s in shards:
                s.stop()
    per_shard = [round(b - a, 1) for a, b in zip(cpu0[0], cpu1[0], strict=True)]
    print(f"  K={k}: {total} batches ({rows} rows) published in {t_pub:.1f} s, all stored after "
          f"{wall:.1f} s; shard CPU s {per_shard}, servers {cpu1[1] - cpu0[1]:.1f}; batches "
          f"per shard {done}", flush=True)  # fmt: skip
    return {
        "rows_s": rows / wall, "shard_us_row": sum(per_shard) / rows * 1e6,
        "server_us_row": (cpu1[1] - cpu0[1]) / rows * 1e6, "wall": wall,
        "largest_share": max(done) / total,
    }  # fmt: skip


def store_main(a: argparse.Namespace) -> None:
    topo = from_spec(a.topology)
    parts = Partitions(topo)
    epoch = (time.time_ns() // SEC - 600) * SEC  # the recent past: not "from the future"
    sim = Simulator(topo, SimConfig(paths_known=True, epoch_ns=epoch), seed=1)
    t0 = time.monotonic()
    windows = list(sim.stream(a.windows))
    print(f"{a.topology}: {a.windows} windows simulated in {time.monotonic() - t0:.0f} s; "
          f"{len(set(parts.by_host.values()))} partitions", flush=True)  # fmt: skip
    res = {}
    with tempfile.TemporaryDirectory() as d:
        inventory = Path(d) / "topology.json"
        topo.save(inventory)
        for k in a.shards:
            hosts = [0] * k
            for h in topo.nics_by_host:
                hosts[parts.preferred_shard(parts.of(h), k)] += 1
            print(f"K={k}: hosts per shard by partition placement {hosts}", flush=True)
            res[k] = store_run(topo, inventory, windows, k, Path(d) / f"k{k}")
    base = res[min(res)]["rows_s"]
    print(f"\n K  rows/s stored  x K={min(res)}  shard CPU us/row  server CPU us/row  "
          "largest shard's share")  # fmt: skip
    for k, r in res.items():
        print(f"{k:2d}  {r['rows_s']:13,.0f}  {r['rows_s'] / base:7.2f}  {r['shard_us_row']:16.2f}"
              f"  {r['server_us_row']:17.2f}  {r['largest_share']:21.2f}")  # fmt: skip
    us = sum(r["shard_us_row"] for r in res.values()) / len(res)
    srv = sum(r["server_us_row"] for r in res.values()) / len(res)
    # this fabric's rows per host and window, at the target's hosts and a window a second
    target = sum(w.windows.num_rows for w in windows) / len(windows) / len(topo.hosts)
    target *= TARGET_HOSTS
    print(f"\nprojection, {TARGET_HOSTS} hosts x 8 NICs ({target / 1e6:.1f} M rows/s): "
          f"shards {target * us * 1e-6:.0f} cores ({us:.2f} us/row, mean over K), "
          f"nats-servers {target * srv * 1e-6:.0f} cores for R3 ({srv:.2f} us/row)")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="part", required=True)
    st = sub.add_parser("store", help="rows/s the shards store, K = 1, 2, 3")
    st.add_argument("--topology", default=STORE_SPEC)
    st.add_argument("--windows", type=int, default=8, help="simulated windows in the backlog")
    st.add_argument("--shards", type=int, nargs="+", default=[1, 2, 3])
    ti = sub.add_parser("tier", help="the fleet tier's CPU per window against one collector")
    ti.add_argument("--hosts", type=int, nargs="+", default=[1024, 4096])
    ti.add_argument("--windows", type=int, default=3, help="simulated windows (first left out)")
    a = p.parse_args()
    (tier_main if a.part == "tier" else store_main)(a)


if __name__ == "__main__":
    main()
