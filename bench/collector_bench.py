"""Collector benchmarks: ingest rows/s through the writer alone and through HTTP, and API latency
(p50/p99) for /v1/links and a one-hour pair history over a store of --rows window rows.

    .venv/bin/python bench/collector_bench.py                 # full: 10^8 stored rows
    .venv/bin/python bench/collector_bench.py --rows 10000000 # smaller store, same figures

The writer-alone run is the baseline of the HTTP run (same batches, same DuckDB thread count);
the ratio HTTP / writer says what the HTTP path (decode, validation, uvicorn) costs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pyarrow as pa
from fleetlens.api.store import Store
from fleetlens.api.writer import Writer
from fleetlens.fixtures.collector import CollectorProcess, start_collector

from fleetlens.batch import Batch, encode_batch
from fleetlens.client import CollectorClient
from fleetlens.plan import peer_pairs
from fleetlens.records import WINDOW_SCHEMA
from fleetlens.topology import from_spec

HOSTS, NICS = 1000, 8
SPEC = f"leafspine:hosts={HOSTS},nics={NICS},leaves=32,spines=8"
T0 = (time.time_ns() // 10**9 - 4 * 3600) * 10**9  # the big store's windows: the last 4 h
# Ingested windows are current (the last minute), as agents send them: older ones would be
# "late" for the collector's per-minute rollup and take its (slower) merge path.
T_INGEST = (time.time_ns() // 10**9 - 60) * 10**9


class Fleet:
    """The benchmark fleet's probe plan (fleetlens.plan): who each host's NICs probe."""

    def __init__(self) -> None:
        topo = from_spec(SPEC)
        src, dst = peer_pairs(topo, peers=16, seed=0)
        self.nic_ids = np.array([n.id for n in topo.nics])
        self.leaf = np.array([n.leaf for n in topo.nics])
        host_of = np.array([topo.hosts.index(n.host) for n in topo.nics])
        order = np.argsort(host_of[src], kind="stable")
        self.src, self.dst = src[order], dst[order]
        self.first = np.searchsorted(host_of[self.src], np.arange(HOSTS + 1))
        self.spines = int(topo.params["spines"])


def batch_table(
    fleet: Fleet, host: int, rows: int, second: int, rng: np.random.Generator
) -> pa.Table:
    """One agent's batch for one window: its planned (src, dst) pairs, rotating source ports,
    a 4-point hull and the 4-hop leaf-spine path (real link ids of the inventory)."""
    lo, hi = fleet.first[host], fleet.first[host + 1]
    j = np.arange(rows)
    pair = lo + j % (hi - lo)
    sport = 33000 + (j // (hi - lo)) % 64
    s_nic, d_nic = fleet.nic_ids[fleet.src[pair]], fleet.nic_ids[fleet.dst[pair]]
    s_leaf, d_leaf = fleet.leaf[fleet.src[pair]], fleet.leaf[fleet.dst[pair]]
    spine = np.char.add("spine", (sport % fleet.spines).astype(str))
    base = rng.uniform(2_000, 9_000, rows)
    start = np.full(rows, T_INGEST + second * 10**9, np.int64)
    four = np.arange(0, 4 * rows + 1, 4, dtype=np.int32)
    hull = pa.ListArray.from_arrays(
        four, pa.array(np.repeat(start, 4) + np.tile(np.arange(4) * 250_000_000, rows))
    )
    hull_y = pa.ListArray.from_arrays(
        four, pa.array(np.repeat(base.astype(np.int64), 4) + np.tile(np.arange(4), rows))
    )
    arrow = lambda a, b: np.char.add(np.char.add(a, "->"), b)  # noqa: E731
    hops = np.stack([arrow(s_nic, s_leaf), arrow(s_leaf, spine), arrow(spine, d_leaf),
                     arrow(d_leaf, d_nic)], 1)  # fmt: skip
    sent = np.full(rows, 200, np.int32)
    cols = {
        "src_nic": pa.array(s_nic), "dst_nic": pa.array(d_nic),
        "sport": pa.array(sport.astype(np.int32)),
        "start_ns": pa.array(start), "duration_ns": pa.array(np.full(rows, 10**9, np.int64)),
        "sent": pa.array(sent), "received": pa.array(sent - (rng.random(rows) < 0.01)),
        "pure": pa.array(np.full(rows, 90, np.int32)),
        "owd_min_ns": pa.array(base), "owd_p50_ns": pa.array(base * 1.2),
        "owd_p99_ns": pa.array(base * 2), "owd_max_ns": pa.array(base * 3),
        "hull_t_ns": hull, "hull_owd_ns": hull_y,
        "ts_source": pa.array(np.full(rows, "software")),
        "path": pa.ListArray.from_arrays(four, pa.array(hops.ravel())),
    }  # fmt: skip
    return pa.table(cols).cast(WINDOW_SCHEMA)


def make_batches(
    n_rows: int, batch_rows: int, seed: int, per_second: int
) -> list[tuple[int, pa.Table]]:
    """Batches in time order, ``per_second`` of them per window second, as a fleet posts them
    (the collector's loops read the newest two seconds, so this sets their load too)."""
    rng = np.random.default_rng(seed)
    fleet = Fleet()
    out = []
    for i in range(max(1, n_rows // batch_rows)):
        host = i % HOSTS
        out.append((host, batch_table(fleet, host, batch_rows, i // per_second, rng)))
    return out


# ---- writer alone ---------------------------------------------------------------------------
def bench_writer(
    work: Path, batches: list[tuple[int, pa.Table]], threads: int
) -> tuple[float, float]:
    store = Store(work / "writer.duckdb", threads=threads)
    writer = Writer(store, max_batches=len(batches) + 1, max_rows=1 << 62)
    writer.start()
    items = [Batch(f"w{i}", f"h{h:03d}", t) for i, (h, t) in enumerate(batches)]
    t0, p0 = time.perf_counter(), time.process_time()
    futures = [writer.submit_batch(b) for b in items]
    for f in futures:
        f.result()
    dt, proc_cpu = time.perf_counter() - t0, time.process_time() - p0
    cpu = writer.busy_cpu_s
    writer.stop()
    store.close()
    rows = sum(b.rows for b in items)
    print(f"writer alone : {rows:>11,} rows in {dt:6.2f} s = {rows / dt:>12,.0f} rows/s wall, "
          f"{rows / cpu:>12,.0f} rows per writer CPU-second, {rows / proc_cpu:,.0f} rows per "
          f"process CPU-second (all threads) "
          f"(DuckDB threads={threads}, {len(items)} batches of {items[0].rows})")  # fmt: skip
    return rows / dt, rows / cpu


# ---- HTTP path ------------------------------------------------------------------------------
def start_bench_collector(db: Path, threads: int | None, log: Path) -> CollectorProcess:
    args = ["--insecure-no-auth", "--public-metrics", "--queue-rows", "8000000"]
    if threads:
        args += ["--duckdb-threads", str(threads)]
    return start_collector(db, SPEC, args, log=log, timeout_s=60)


def bench_http(
    work: Path, batches: list[tuple[int, pa.Table]], threads: int, clients: int
) -> float:
    bodies = [encode_batch(f"h{h:03d}", t, f"h{i}") for i, (h, t) in enumerate(batches)]
    rows = sum(t.num_rows for _, t in batches)
    col = start_bench_collector(work / "http.duckdb", threads, work / "http.log")
    errors: list[str] = []

    def send(part: list[tuple[bytes, str]]) -> None:
        with col.client(timeout_s=120) as c:
            for body, ctype in part:
                while True:
                    r = c.ingest(body, ctype)
                    if r.status_code != 429:
                        break
                    time.sleep(float(r.headers.get("Retry-After", "1")))
                if r.status_code != 200:
                    errors.append(r.text)

    workers = [threading.Thread(target=send, args=(bodies[i::clients],)) for i in range(clients)]
    try:
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        dt = time.perf_counter() - t0
        with col.client(timeout_s=120) as c:
            text = c.metrics_text()
        cpu = next(float(ln.split()[-1]) for ln in text.splitlines()
                   if ln.startswith("fleetlens_writer_busy_cpu_seconds_total"))  # fmt: skip
    finally:
        col.stop(timeout_s=60)
    if errors:
        raise RuntimeError(f"{len(errors)} batches failed, first: {errors[0][:300]}")
    print(f"HTTP ingest  : {rows:>11,} rows in {dt:6.2f} s = {rows / dt:>12,.0f} rows/s wall, "
          f"{rows / cpu:>12,.0f} rows per writer CPU-second "
          f"({clients} clients, Arrow IPC bodies, DuckDB threads={threads})")  # fmt: skip
    return rows / dt


# ---- API latency over a big store -----------------------------------------------------------
FLOWS = 10_000


def generate_store(db: Path, rows: int) -> tuple[str, str, int]:
    """``rows`` windows of FLOWS flows, one per flow per second, written with DuckDB SQL."""
    store = Store(db)
    t0 = time.perf_counter()
    flow = f"(i % {FLOWS})"
    # Storage layout of fleetlens.api.codec: hulls as packed int64 BLOBs, path as int32 indices
    # into link_dict. Hull bytes vary per row (hex of the values) so nothing compresses away.
    hops = ("a->leaf0", "leaf0->spine1", "spine1->leaf3", "leaf3->b")
    store.con.executemany("INSERT INTO link_dict VALUES (?, ?)", list(enumerate(hops)))
    start = f"({T0} + (i // {FLOWS}) * 1000000000)"
    store.con.execute(f"""
        INSERT INTO windows SELECT
          'h' || lpad(({flow} // 10 % {HOSTS})::VARCHAR, 3, '0') || '/eth' || ({flow} % 8),
          'h' || lpad((({flow} * 7919 + 1) % {HOSTS})::VARCHAR, 3, '0') || '/eth' || ({flow} % 8),
          33000 + ({flow} % 16)::INTEGER, {start}, 1000000000,
          200, 200 - (i % 3)::INTEGER, 90,
          2000.0 + (i % 97), 3000.0 + (i % 89), 6000.0 + (i % 83), 8000.0 + (i % 79),
          unhex(printf('%016x%016x', {start}, {start} + 500000000)),
          unhex(printf('%016x%016x', 2000 + i % 97, 2010 + i % 89)), 'software',
          from_hex('00000000010000000200000003000000')
        FROM range({rows}) t(i)""")  # fmt: skip
    store.con.execute("CHECKPOINT")
    t1 = time.perf_counter()
    # What the collector's retention loop does every minute: roll closed minutes up.
    store.retention_pass(time.time_ns(), 24 * 3600 * 10**9, 30 * 24 * 3600 * 10**9)
    rollup_s = time.perf_counter() - t1
    src, dst = "h000/eth0", f"h{1 % HOSTS:03d}/eth0"  # flow 0 of the rows generated above
    newest = store.newest_window_start()
    store.close()
    size = db.stat().st_size / 2**30
    print(f"store        : {rows:>11,} rows generated in {t1 - t0:6.1f} s, minute rollup "
          f"{rollup_s:.1f} s ({size:.1f} GiB, {FLOWS} flows, {rows // FLOWS} s of windows)"
          )  # fmt: skip
    return src, dst, newest


def latency(c: CollectorClient, path: str, params: dict, n: int) -> tuple[float, float]:
    """p50 and p99 in ms of ``GET path`` (the answer read, not decoded)."""
    times = []
    for i in range(n + 1):  # the first one warms up
        t0 = time.perf_counter()
        r = c.request("GET", path, **params)
        if i:
            times.append(time.perf_counter() - t0)
        if r.status_code != 200:
            raise RuntimeError(f"GET {path}: {r.status_code} {r.text[:300]}")
    return float(np.percentile(times, 50) * 1e3), float(np.percentile(times, 99) * 1e3)


def bench_api(work: Path, rows: int, n: int) -> None:
    db = work / "big.duckdb"
    src, dst, newest = generate_store(db, rows)
    col = start_bench_collector(db, None, work / "api.log")
    try:
        with col.client(timeout_s=120) as c:
            p50, p99 = latency(c, "/v1/links", {}, n)
            print(f"GET /v1/links (16.9k links, page 100) : p50 {p50:7.1f} ms   p99 {p99:7.1f} ms")
            path = f"/v1/pairs/{quote(src, safe='')}/{quote(dst, safe='')}/owd"
            minute = 60 * 10**9
            hour_ago = (newest - 3600 * 10**9) // minute * minute
            for label, params in (
                ("minute-aligned, step 60s (rollups)",
                 {"since": hour_ago, "until": newest + 1, "step": "60s"}),
                ("unaligned, step 10s (raw rows)",
                 {"since": hour_ago + 1, "until": newest + 1, "step": "10s"}),
            ):  # fmt: skip
                pts = c.pair_owd(src, dst, **params)["points"]
                p50, p99 = latency(c, path, params, n)
                print(f"GET one-hour pair history, {label}, {len(pts)} points, {rows:,} rows: "
                      f"p50 {p50:7.1f} ms   p99 {p99:7.1f} ms")  # fmt: skip
    finally:
        col.stop(timeout_s=60)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=float, default=1e8, help="stored rows for the latency part")
    ap.add_argument("--ingest-rows", type=float, default=2e6, help="rows for the ingest part")
    ap.add_argument("--batch-rows", type=int, default=1024,
                    help="rows per agent batch (8 NICs x 16 peers x 8 ports a window)")  # fmt: skip
    ap.add_argument(
        "--threads", type=int, default=1, help="DuckDB threads for ingest (1 = one core)"
    )
    ap.add_argument("--clients", type=int, default=8, help="concurrent posting agents")
    ap.add_argument("--batches-per-second", type=int, default=HOSTS,
                    help="batches stamped with the same window second (loop load)")  # fmt: skip
    ap.add_argument("--requests", type=int, default=200, help="requests per latency figure")
    ap.add_argument("--skip-api", action="store_true")
    ap.add_argument("--skip-ingest", action="store_true")
    ap.add_argument("--workdir", type=Path, help="default: a temporary directory")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.workdir) as tmp:
        work = Path(tmp)
        batches = (
            []
            if a.skip_ingest
            else make_batches(int(a.ingest_rows), a.batch_rows, 1, a.batches_per_second)
        )
        load = os.getloadavg()[0]
        print(f"machine      : {os.cpu_count()} cores, load average {load:.1f}; batches of "
              f"{a.batch_rows} rows, {a.batches_per_second} per window second")  # fmt: skip
        if not a.skip_ingest:
            w, w_cpu = bench_writer(work, batches, a.threads)
            h = bench_http(work, batches, a.threads, a.clients)
            print(f"ratio HTTP / writer-alone (wall rows/s) = {h / w:.2f}")
            print(f"target >= 1,000,000 rows/s through the writer on one core: "
                  f"{'met' if w_cpu >= 1e6 else 'NOT met'} per writer CPU-second "
                  f"({w_cpu:,.0f}), {'met' if w >= 1e6 else 'NOT met'} in wall time "
                  f"({w:,.0f})")  # fmt: skip
        if not a.skip_api:
            bench_api(work, int(a.rows), a.requests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
