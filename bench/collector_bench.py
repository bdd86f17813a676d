"""Collector benchmarks: ingest rows/s through the writer alone and through HTTP, and API latency
(p50/p99) for /v1/links and a one-hour pair history over a store of --rows window rows.

    .venv/bin/python bench/collector_bench.py                 # full: 10^8 stored rows
    .venv/bin/python bench/collector_bench.py --rows 10000000 # smaller store, same figures
    .venv/bin/python bench/collector_bench.py --shape agents --hosts 1024 --skip-api

The writer-alone run is the baseline of the HTTP run (same batches, same DuckDB thread count);
the ratio HTTP / writer says what the HTTP path (decode, validation, uvicorn) costs.

``--shape agents``: the agents' real shape (issue 29): every host posts one ~910-row batch per
window second (8 NICs x 16 peers x ~7 source ports), ``--clients`` agents (default 256) post at
once over keep-alive loopback connections from a lean asyncio client (so the load generator
costs little of the shared cores), and the collector runs ingest only (``--ingest-only``: the
clock solve and triangulation, measured elsewhere, would compete for the same cores). It prints
the collector's CPU per batch (its process, all threads) against the writer-alone process's,
and the collector's peak RSS. ``--ingest-workers N`` runs it again with N ingest worker
processes (``api/ingestworker.py``) in the same command and prints the ratio of the two;
``--stages`` first prints the CPU per batch of each in-process stage of a batch's path.
``--against REV`` runs the collector of that git revision on the same batches too (``--repeat
N``: N runs of each, alternated) and prints the ratio of this tree's ingest to it.
``--hull-points`` sets the hulls' mean points a row (4: every flow's whole hull; ~0.81: rows
cut to their pair's hull, as agents send them, ``fleetlens.summary``), and
``--against-hull-points`` the revision's (then the ratio is the collector's and the hulls'
together, not the collector's alone).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pyarrow as pa
from fleetlens.api.store import Store
from fleetlens.api.writer import Writer
from fleetlens.fixtures.collector import (
    CollectorProcess,
    start_collector,
    tree_cpu_s,
    tree_rss_mib,
)

from fleetlens.batch import Batch, encode_batch
from fleetlens.client import CollectorClient
from fleetlens.plan import peer_pairs
from fleetlens.records import WINDOW_SCHEMA
from fleetlens.topology import from_spec

ROOT = Path(__file__).resolve().parent.parent
HOSTS, NICS = 1000, 8
AGENT_BATCH_ROWS = 910  # the agents' shape: 8 NICs x 16 peers x ~7 source ports a window


def fleet_spec(hosts: int) -> str:
    return f"leafspine:hosts={hosts},nics={NICS},leaves=32,spines=8"


T0 = (time.time_ns() // 10**9 - 4 * 3600) * 10**9  # the big store's windows: the last 4 h
# Ingested windows are current (the last minute), as agents send them: older ones would be
# "late" for the collector's per-minute rollup and take its (slower) merge path.
T_INGEST = (time.time_ns() // 10**9 - 60) * 10**9


class Fleet:
    """The benchmark fleet's probe plan (fleetlens.plan): who each host's NICs probe."""

    def __init__(self, hosts: int) -> None:
        self.hosts = hosts
        topo = from_spec(fleet_spec(hosts))
        self.names = list(topo.hosts)
        src, dst = peer_pairs(topo, peers=16, seed=0)
        self.nic_ids = np.array([n.id for n in topo.nics])
        self.leaf = np.array([n.leaf for n in topo.nics])
        host_of = np.array([topo.hosts.index(n.host) for n in topo.nics])
        order = np.argsort(host_of[src], kind="stable")
        self.src, self.dst = src[order], dst[order]
        self.first = np.searchsorted(host_of[self.src], np.arange(hosts + 1))
        self.spines = int(topo.params["spines"])


def batch_table(
    fleet: Fleet, host: int, rows: int, second: int, rng: np.random.Generator,
    hull_points: float = 4.0,
) -> pa.Table:  # fmt: skip
    """One agent's batch for one window: its planned (src, dst) pairs, rotating source ports,
    hulls of ``hull_points`` points a row on average (the rows' counts its floor or ceiling)
    and the 4-hop leaf-spine path (real link ids of the inventory)."""
    lo, hi = fleet.first[host], fleet.first[host + 1]
    j = np.arange(rows)
    pair = lo + j % (hi - lo)
    sport = 33000 + (j // (hi - lo)) % 64
    s_nic, d_nic = fleet.nic_ids[fleet.src[pair]], fleet.nic_ids[fleet.dst[pair]]
    s_leaf, d_leaf = fleet.leaf[fleet.src[pair]], fleet.leaf[fleet.dst[pair]]
    spine = np.char.add("spine", (sport % fleet.spines).astype(str))
    base = rng.uniform(2_000, 9_000, rows)
    start = np.full(rows, T_INGEST + second * 10**9, np.int64)
    lo_n = int(hull_points)
    n = np.full(rows, lo_n) + (rng.random(rows) < hull_points - lo_n if hull_points > lo_n else 0)
    at = np.r_[0, np.cumsum(n)].astype(np.int32)
    k = np.arange(at[-1]) - np.repeat(at[:-1], n)  # a point's place in its row
    hull = pa.ListArray.from_arrays(at, pa.array(np.repeat(start, n) + k * 250_000_000))
    hull_y = pa.ListArray.from_arrays(at, pa.array(np.repeat(base.astype(np.int64), n) + k))
    four = np.arange(0, 4 * rows + 1, 4, dtype=np.int32)
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
        "acks_lost": pa.array(np.zeros(rows, np.int32)),
    }  # fmt: skip
    return pa.table(cols).cast(WINDOW_SCHEMA)


def make_batches(
    n_rows: int, batch_rows: int, seed: int, per_second: int, fleet: Fleet,
    hull_points: float = 4.0,
) -> list[tuple[int, pa.Table]]:  # fmt: skip
    """Batches in time order, ``per_second`` of them per window second, as a fleet posts them
    (the collector's loops read the newest two seconds, so this sets their load too)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(max(1, n_rows // batch_rows)):
        host = i % fleet.hosts
        second = i // per_second
        out.append((host, batch_table(fleet, host, batch_rows, second, rng, hull_points)))
    return out


# ---- writer alone ---------------------------------------------------------------------------
@dataclass
class WriterRun:
    rows_per_s: float  # wall
    rows_per_cpu_s: float  # of the writer thread inside transactions
    cpu_per_batch_s: float  # of the whole process (every thread), per batch


def bench_writer(work: Path, fleet: Fleet, batches: list[tuple[int, pa.Table]], threads: int,
                 group: int | None = None, label: str = "writer alone") -> WriterRun:  # fmt: skip
    """``group``: batches per commit (default: as many as the writer's row bound allows)."""
    store = Store(work / f"writer-{next(_RUNS)}.duckdb", threads=threads)
    sizes = {} if group is None else {"group_rows": group * batches[0][1].num_rows}
    writer = Writer(store, max_batches=len(batches) + 1, max_rows=1 << 62, **sizes)
    writer.start()
    items = [Batch(f"w{i}", fleet.names[h], t) for i, (h, t) in enumerate(batches)]
    t0, p0 = time.perf_counter(), time.process_time()
    futures = [writer.submit_batch(b) for b in items]
    for f in futures:
        f.result()
    dt = time.perf_counter() - t0
    cpu = writer.busy_cpu_s
    writer.stop()
    # Closing checkpoints: rows a commit left in the WAL are compressed into the file only
    # then (as the collector does every CHECKPOINT_THRESHOLD of WAL), and that CPU is theirs.
    store.close()
    proc_cpu = time.process_time() - p0
    rows = sum(b.rows for b in items)
    grouped = f"groups of {group}" if group else "groups as large as the writer makes them"
    print(f"{label}: {rows:>11,} rows in {dt:6.2f} s = {rows / dt:>12,.0f} rows/s wall, "
          f"{rows / cpu:>12,.0f} rows per writer CPU-second, {rows / proc_cpu:,.0f} rows per "
          f"process CPU-second (all threads, the closing checkpoint included), "
          f"{proc_cpu / len(items) * 1e3:.2f} ms process CPU per batch (DuckDB "
          f"threads={threads}, {len(items)} batches of {items[0].rows}, {grouped})")  # fmt: skip
    return WriterRun(rows / dt, rows / cpu, proc_cpu / len(items))


def writer_of_revision(work: Path, rev: str, argv: list[str], group: int) -> WriterRun:
    """The writer alone of git revision ``rev`` (its Store and Writer) on the same batches:
    this script run again under that revision's tree (``--writer-only``)."""
    env = {**os.environ, **revision_env(rev, work)}
    out = subprocess.run([sys.executable, __file__, *argv, "--writer-only", "--writer-group",
                          str(group), "--label", f"writer of {rev}"],
                         env=env, check=True, capture_output=True, text=True).stdout  # fmt: skip
    print(out.splitlines()[-2])
    return WriterRun(*map(float, out.splitlines()[-1].split()[1:]))


# ---- HTTP path ------------------------------------------------------------------------------
def start_bench_collector(
    db: Path, spec: str, threads: int | None, log: Path, extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> CollectorProcess:  # fmt: skip
    args = ["--insecure-no-auth", "--public-metrics", "--queue-rows", "8000000", *extra]
    if threads:
        args += ["--duckdb-threads", str(threads)]
    return start_collector(db, spec, args, log=log, env=env, timeout_s=60)


_RUNS = itertools.count()


@functools.cache
def revision_env(rev: str, work: Path) -> dict[str, str]:
    """The environment that runs the collector of git revision ``rev`` (``--against``): its
    tree exported and laid out as installed (that revision's ``scripts/package_tree.py``, with
    this tree's compiled extensions: their sources are not what is compared), first on
    PYTHONPATH, ahead of this checkout's editable install."""
    src, tree = work / f"rev-{rev}", work / f"rev-{rev}-installed"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True,
                             check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    subprocess.run([sys.executable, str(src / "scripts" / "package_tree.py"), str(tree)],
                   check=True, capture_output=True)  # fmt: skip
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package, mapped in config["package-dir"].items():
        for ext in (ROOT / mapped).glob("*.so"):
            shutil.copy2(ext, tree.joinpath(*package.split("."), ext.name))
    path = [str(tree)]
    if "httptools" not in (src / "pyproject.toml").read_text():
        # That revision's install has neither uvicorn's C parser nor uvloop: hide this venv's.
        for name in ("httptools", "uvloop"):
            (work / "no-extras" / name).mkdir(parents=True, exist_ok=True)
            (work / "no-extras" / name / "__init__.py").write_text(
                f"raise ImportError('{name}: not installed at {rev}')\n"
            )
        path.append(str(work / "no-extras"))
    # PYTHONSAFEPATH: `python -m` must not put the working directory (this tree) first
    return {"PYTHONPATH": os.pathsep.join([*path, os.environ.get("PYTHONPATH", "")]),
            "PYTHONSAFEPATH": "1"}  # fmt: skip


def _metric(text: str, name: str) -> float:
    return next(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name + " "))


def writer_busy_cpu(col: CollectorProcess) -> float:
    with col.client(timeout_s=120) as c:
        return _metric(c.metrics_text(), "fleetlens_writer_busy_cpu_seconds_total")


def commit_group_mean(col: CollectorProcess) -> float:
    """Batches per commit, on average (the writer's group commit under this load)."""
    with col.client(timeout_s=120) as c:
        text = c.metrics_text()
    name = "fleetlens_writer_commit_group_batches"
    return _metric(text, f"{name}_sum") / max(_metric(text, f"{name}_count"), 1.0)


def bench_http(
    work: Path, fleet: Fleet, batches: list[tuple[int, pa.Table]], threads: int, clients: int
) -> float:
    bodies = [encode_batch(fleet.names[h], t, f"h{i}") for i, (h, t) in enumerate(batches)]
    rows = sum(t.num_rows for _, t in batches)
    spec = fleet_spec(fleet.hosts)
    col = start_bench_collector(work / "http.duckdb", spec, threads, work / "http.log")
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
        cpu = writer_busy_cpu(col)
    finally:
        col.stop(timeout_s=60)
    if errors:
        raise RuntimeError(f"{len(errors)} batches failed, first: {errors[0][:300]}")
    print(f"HTTP ingest  : {rows:>11,} rows in {dt:6.2f} s = {rows / dt:>12,.0f} rows/s wall, "
          f"{rows / cpu:>12,.0f} rows per writer CPU-second "
          f"({clients} clients, Arrow IPC bodies, DuckDB threads={threads})")  # fmt: skip
    return rows / dt


# ---- HTTP path at the agents' shape ----------------------------------------------------------
def _request(body: bytes, ctype: str) -> bytes:
    head = (f"POST /v1/ingest HTTP/1.1\r\nHost: collector\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")  # fmt: skip
    return head.encode() + body


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in head[1:] if ln)}
    return status, headers, await reader.readexactly(int(headers.get("content-length", "0")))


async def _agent(url: str, requests: list[bytes], errors: list[str]) -> None:
    """One agent's keep-alive connection posting its batches in turn (429: wait, re-send)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        for req in requests:
            while True:
                writer.write(req)
                status, headers, body = await _answer(reader)
                if status != 429:
                    break
                await asyncio.sleep(float(headers.get("retry-after", "1")))
            if status != 200:
                errors.append(f"{status} {body[:300]!r}")
    finally:
        writer.close()


def bench_agents(
    work: Path, fleet: Fleet, batches: list[tuple[int, pa.Table]], threads: int, clients: int,
    writer: WriterRun, workers: int = 0, rev: str | None = None,
) -> float:  # fmt: skip
    """``rev``: the collector of that git revision (``--against``), else this tree's."""
    requests = [_request(*encode_batch(fleet.names[h], t, f"a{i}"))
                for i, (h, t) in enumerate(batches)]  # fmt: skip
    rows = sum(t.num_rows for _, t in batches)
    spec = fleet_spec(fleet.hosts)
    name = f"agents-w{workers}-{rev or 'this'}-{next(_RUNS)}"  # a fresh file each run
    env = revision_env(rev, work) if rev else None
    args = ("--ingest-only", "--ingest-workers", str(workers))
    col = start_bench_collector(work / f"{name}.duckdb", spec, threads, work / f"{name}.log",
                                args, env)  # fmt: skip
    errors: list[str] = []

    async def run() -> None:
        await asyncio.gather(*(_agent(col.url, requests[i::clients], errors)
                               for i in range(clients)))  # fmt: skip

    try:
        cpu0, own0, main0 = tree_cpu_s(col.pid), time.process_time(), process_cpu_s(col.pid)
        t0 = time.perf_counter()
        asyncio.run(run())
        dt = time.perf_counter() - t0
        cpu, own = tree_cpu_s(col.pid) - cpu0, time.process_time() - own0
        main_cpu = process_cpu_s(col.pid) - main0
        rss, peak = tree_rss_mib(col.pid)
        busy, group = writer_busy_cpu(col), commit_group_mean(col)
    finally:
        col.stop(timeout_s=60)
    if errors:
        raise RuntimeError(f"{len(errors)} batches failed, first: {errors[0]}")
    n = len(batches)
    per_batch = cpu / n
    how = f"{workers} ingest worker processes" if workers else "in one process"
    print(f"HTTP agents ({rev or 'this tree'}): {rows:,} rows in {dt:6.2f} s = "
          f"{rows / dt:>12,.0f} rows/s wall "
          f"({n / dt:,.0f} batches/s; {clients} agents posting at once, {fleet.hosts} hosts, "
          f"Arrow IPC, DuckDB threads={threads}, ingest only, {how})")  # fmt: skip
    print(f"  collector CPU: {cpu:.1f} s = {cpu / dt:.2f} cores, {per_batch * 1e3:.2f} ms per "
          f"batch (writer alone {writer.cpu_per_batch_s * 1e3:.2f} ms: the HTTP path adds "
          f"{(per_batch - writer.cpu_per_batch_s) * 1e3:.2f} ms per batch); writer thread in "
          f"transactions {busy:.1f} s, {group:.0f} batches per commit on average; load "
          f"generator {own:.1f} s")  # fmt: skip
    if workers:
        print(f"  the writer process alone: {main_cpu / dt:.2f} cores, "
              f"{main_cpu / n * 1e3:.2f} ms per batch")  # fmt: skip
    print(f"  collector RSS: {rss:,.0f} MiB at the end, peak {peak:,.0f} MiB (all its processes)")
    return rows / dt


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (every thread), without its children."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---- one batch's path, stage by stage ----------------------------------------------------------
def bench_stages(work: Path, fleet: Fleet, batches: list[tuple[int, pa.Table]], group: int
                 ) -> dict[str, float]:  # fmt: skip
    """CPU microseconds per batch of each in-process stage a batch goes through after HTTP:
    decode (with the context-free checks), the collector's checks, queueing (submit to the
    writer, the future resolved), the storage layout, DuckDB (insert and commit of groups of
    ``group`` batches) and the commit hook (metrics, arrivals). HTTP parsing, body reading and
    the answer are what the HTTP run's CPU per batch has beyond their sum."""
    from fleetlens.api.codec import Dicts, to_storage
    from fleetlens.api.config import Settings
    from fleetlens.api.service import Collector

    from fleetlens.batch import decode_batch

    c = Collector(Settings(db_path=work / "stages.duckdb", inventory=fleet_spec(fleet.hosts),
                           duckdb_threads=1, queue_max_batches=len(batches) + 1))  # fmt: skip
    bodies = [encode_batch(fleet.names[h], t, f"s{i}") for i, (h, t) in enumerate(batches)]
    stages: dict[str, float] = {}

    def timed(name: str, fn, items: list) -> list:  # type: ignore[no-untyped-def]
        t0 = time.process_time()
        out = [fn(x) for x in items]
        stages[name] = (time.process_time() - t0) / len(batches) * 1e6
        return out

    decoded = timed("decode + context-free checks", lambda b: decode_batch(*b), bodies)
    now = time.time_ns()
    timed("collector checks (own host, known NICs, future)",
          lambda b: c.check_context(b, now), decoded)  # fmt: skip
    groups = [decoded[i : i + group] for i in range(0, len(decoded), group)]
    layout = "storage layout (codec.to_storage)"
    dicts = Dicts()  # the store's own stay as the writer left them
    timed(layout, lambda g: to_storage([b.windows for b in g], dicts), groups)
    spent = {"insert": 0.0, "hook": 0.0}
    for g in groups:  # the hook right after its group's insert, as the writer calls it
        t0 = time.process_time()
        c.store.insert_batches(g, time.time_ns())
        t1 = time.process_time()
        c.rounds.committed([(b, True) for b in g], 0.01)
        spent["insert"] += t1 - t0
        spent["hook"] += time.process_time() - t1
    us = {k: v / len(batches) * 1e6 for k, v in spent.items()}
    duckdb = "DuckDB insert + commit (insert_batches less the layout)"
    stages[duckdb] = us["insert"] - stages[layout]
    hook = "commit hook (metrics, look-back, arrivals), once per group"
    stages[hook] = us["hook"]
    # The same hook called once per batch (as before issue 29's grouping): the ratio says
    # what grouping saves. Not a stage of the path: left out of the sum.
    t0 = time.process_time()
    for b in decoded:
        c.rounds.committed([(b, True)], 0.01)
    one = (time.process_time() - t0) / len(batches) * 1e6
    c.writer.start()
    again = [Batch(f"q{i}", b.host_id, b.windows.slice(0, 0)) for i, b in enumerate(decoded)]
    t0 = time.process_time()  # queued all at once, as under load: the writer groups them
    for f in [c.submit(b) for b in again]:
        f.result()
    stages["queueing (submit, group, future resolved; empty batches)"] = (
        (time.process_time() - t0) / len(batches) * 1e6
    )
    c.stop()
    total = sum(stages.values())
    for name, us in stages.items():
        print(f"  stage {name:<52} {us:8.1f} us per batch ({us / total:5.1%})")
    print(f"  stages in all{'':<46} {total:8.1f} us per batch (groups of {group})")
    print(
        f"  commit hook called per batch instead: {one:8.1f} us per batch, ratio per group / "
        f"per batch = {stages[hook] / one:.2f}"
    )
    return stages


# ---- API latency over a big store -----------------------------------------------------------
FLOWS = 10_000


def generate_store(db: Path, rows: int) -> tuple[str, str, int]:
    """``rows`` windows of FLOWS flows, one per flow per second, written with DuckDB SQL."""
    store = Store(db)
    t0 = time.perf_counter()
    flow = f"(i % {FLOWS})"
    # Storage layout of fleetlens.api.codec: hulls as packed int64 BLOBs, path as an id into
    # path_dict (lists of link_dict indices), NICs and ts_source as ids into nic_dict and
    # ts_source_dict (NIC h<i>/eth<j> is id 8 i + j). Hull bytes vary per row (hex of the
    # values) so nothing compresses away.
    hops = ("a->leaf0", "leaf0->spine1", "spine1->leaf3", "leaf3->b")
    store.con.executemany("INSERT INTO link_dict VALUES (?, ?)", list(enumerate(hops)))
    store.con.execute("INSERT INTO path_dict VALUES (0, [0, 1, 2, 3])")
    store.con.execute("INSERT INTO ts_source_dict VALUES (0, 'software')")
    store.con.execute(f"""
        INSERT INTO nic_dict SELECT i, 'h' || lpad((i // 8)::VARCHAR, 3, '0') || '/eth' || (i % 8),
                                    'h' || lpad((i // 8)::VARCHAR, 3, '0')
        FROM range({HOSTS * 8}) t(i)""")  # fmt: skip
    start = f"({T0} + (i // {FLOWS}) * 1000000000)"
    store.con.execute(f"""
        INSERT INTO windows SELECT
          ({flow} // 10 % {HOSTS}) * 8 + {flow} % 8,
          (({flow} * 7919 + 1) % {HOSTS}) * 8 + {flow} % 8,
          33000 + ({flow} % 16)::INTEGER, {start}, 1000000000,
          200, 200 - (i % 3)::INTEGER, 90,
          2000.0 + (i % 97), 3000.0 + (i % 89), 6000.0 + (i % 83), 8000.0 + (i % 79),
          unhex(printf('%016x%016x', {start}, {start} + 500000000)),
          unhex(printf('%016x%016x', 2000 + i % 97, 2010 + i % 89)), 0, 0, 0
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
    col = start_bench_collector(db, fleet_spec(HOSTS), None, work / "api.log")
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
    ap.add_argument("--shape", choices=("bench", "agents"), default="bench",
                    help="agents: one ~910-row batch per host per second from many agents at "
                         "once (issue 29); bench: --batch-rows batches from --clients threads"
                    )  # fmt: skip
    ap.add_argument("--hosts", type=int, help="fleet hosts (default 1000; agents: 1024)")
    ap.add_argument("--seconds", type=float, default=2.0,
                    help="agents: window seconds of the whole fleet to post")  # fmt: skip
    ap.add_argument("--ingest-rows", type=float, default=2e6, help="rows for the ingest part")
    ap.add_argument("--batch-rows", type=int, default=1024,
                    help="rows per agent batch (8 NICs x 16 peers x 8 ports a window)")  # fmt: skip
    ap.add_argument(
        "--threads", type=int, default=1, help="DuckDB threads for ingest (1 = one core)"
    )
    ap.add_argument("--clients", type=int,
                    help="concurrent posting agents (default 8; agents: 256)")  # fmt: skip
    ap.add_argument(
        "--batches-per-second",
        type=int,
        help="batches stamped with the same window second (default: one per host)",
    )
    ap.add_argument("--ingest-workers", type=int, default=0,
                    help="agents: also run the collector with this many ingest worker "
                         "processes, and print the ratio to the one-process run")  # fmt: skip
    ap.add_argument("--against", metavar="REV",
                    help="agents: also run the collector of this git revision (its ingest path "
                         "as it was), and print the ratio of this tree's to it")  # fmt: skip
    ap.add_argument("--hull-points", type=float, default=4.0,
                    help="hull points a row on average: 4 as every flow's whole hull, "
                         "~0.81 as agents cut rows to their pair's hull (1024 hosts)")  # fmt: skip
    ap.add_argument("--against-hull-points", type=float, metavar="N",
                    help="with --against: the revision's batches' (default --hull-points: "
                         "the same batches)")  # fmt: skip
    ap.add_argument("--repeat", type=int, default=1,
                    help="with --against: runs of each, alternated")  # fmt: skip
    ap.add_argument("--stages", action="store_true",
                    help="first, CPU per batch of each in-process stage of its path")  # fmt: skip
    ap.add_argument("--writer-groups", default="64,128,256",
                    help="agents: also run the writer alone committing groups of these many "
                         "batches (the collector's groups under load are ~100-250), against "
                         "--against's writer too")  # fmt: skip
    ap.add_argument("--stages-group", type=int, default=256,
                    help="--stages: batches per commit of the DuckDB stage")  # fmt: skip
    ap.add_argument("--writer-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--writer-group", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--label", default="writer alone", help=argparse.SUPPRESS)
    ap.add_argument("--requests", type=int, default=200, help="requests per latency figure")
    ap.add_argument("--skip-api", action="store_true")
    ap.add_argument("--skip-ingest", action="store_true")
    ap.add_argument("--workdir", type=Path, help="default: a temporary directory")
    a = ap.parse_args()
    agents = a.shape == "agents"
    hosts = a.hosts or (1024 if agents else HOSTS)
    clients = a.clients or (256 if agents else 8)
    batch_rows = AGENT_BATCH_ROWS if agents else a.batch_rows
    ingest_rows = int(a.seconds * hosts * batch_rows) if agents else int(a.ingest_rows)
    per_second = a.batches_per_second or hosts
    with tempfile.TemporaryDirectory(dir=a.workdir) as tmp:
        work = Path(tmp)
        fleet = Fleet(hosts)
        batches = (
            make_batches(ingest_rows, batch_rows, 1, per_second, fleet, a.hull_points)
            if a.stages or a.writer_only or not a.skip_ingest
            else []
        )
        rev_points = a.hull_points if a.against_hull_points is None else a.against_hull_points
        rev_batches = (
            make_batches(ingest_rows, batch_rows, 1, per_second, fleet, rev_points)
            if a.against and rev_points != a.hull_points and not a.skip_ingest
            else batches
        )
        if a.writer_only:  # a child of writer_of_revision: its last line is read back
            w = bench_writer(work, fleet, batches, a.threads, a.writer_group, a.label)
            print("WRITER", w.rows_per_s, w.rows_per_cpu_s, w.cpu_per_batch_s)
            return 0
        load = os.getloadavg()[0]
        print(f"machine      : {os.cpu_count()} cores, load average {load:.1f}; batches of "
              f"{batch_rows} rows, {per_second} per window second")  # fmt: skip
        if a.stages:
            print(f"one batch's path in one process ({len(batches)} batches):")
            bench_stages(work, fleet, batches, a.stages_group)
        if not a.skip_ingest:
            w = bench_writer(work, fleet, batches, a.threads)
            if agents:
                argv = ["--shape", "agents", "--hosts", str(hosts), "--seconds", str(a.seconds),
                        "--threads", str(a.threads), "--skip-api", "--hull-points",
                        str(rev_points)]  # fmt: skip
                for g in map(int, a.writer_groups.split(",") if a.writer_groups else ()):
                    mine = bench_writer(work, fleet, batches, a.threads, g)
                    if a.against:
                        old = writer_of_revision(work, a.against, argv, g)
                        print(f"  groups of {g}: process CPU per batch this tree / {a.against} "
                              f"= {mine.cpu_per_batch_s / old.cpu_per_batch_s:.2f}")  # fmt: skip
                h = bench_agents(work, fleet, batches, a.threads, clients, w)
                if a.against:
                    old = bench_agents(work, fleet, rev_batches, a.threads, clients, w,
                                       rev=a.against)  # fmt: skip
                    for _ in range(a.repeat - 1):  # alternated: the box's load drifts
                        h += bench_agents(work, fleet, batches, a.threads, clients, w)
                        old += bench_agents(work, fleet, rev_batches, a.threads, clients, w,
                                            rev=a.against)  # fmt: skip
                    h, old = h / a.repeat, old / a.repeat
                    print(f"ratio this tree / {a.against} (wall rows/s, mean of {a.repeat}) = "
                          f"{h / old:.2f}; {a.against} / writer-alone = "
                          f"{old / w.rows_per_s:.2f}")  # fmt: skip
                if a.ingest_workers:
                    hw = bench_agents(work, fleet, batches, a.threads, clients, w,
                                      a.ingest_workers)  # fmt: skip
                    if a.against:  # the revision's workers too, alternated as above
                        oldw = bench_agents(work, fleet, rev_batches, a.threads, clients, w,
                                            a.ingest_workers, rev=a.against)  # fmt: skip
                        for _ in range(a.repeat - 1):
                            hw += bench_agents(work, fleet, batches, a.threads, clients, w,
                                               a.ingest_workers)  # fmt: skip
                            oldw += bench_agents(work, fleet, rev_batches, a.threads, clients,
                                                 w, a.ingest_workers, rev=a.against)  # fmt: skip
                        hw, oldw = hw / a.repeat, oldw / a.repeat
                        print(
                            f"ratio with {a.ingest_workers} ingest workers this tree / "
                            f"{a.against} (wall rows/s, mean of {a.repeat}) = {hw / oldw:.2f}"
                        )
                    print(f"ratio {a.ingest_workers} ingest workers / in one process (wall "
                          f"rows/s) = {hw / h:.2f}; workers / writer-alone = "
                          f"{hw / w.rows_per_s:.2f}")  # fmt: skip
            else:
                h = bench_http(work, fleet, batches, a.threads, clients)
            print(f"ratio HTTP / writer-alone (wall rows/s) = {h / w.rows_per_s:.2f}")
            print(f"target >= 1,000,000 rows/s through the writer on one core: "
                  f"{'met' if w.rows_per_cpu_s >= 1e6 else 'NOT met'} per writer CPU-second "
                  f"({w.rows_per_cpu_s:,.0f}), {'met' if w.rows_per_s >= 1e6 else 'NOT met'} "
                  f"in wall time ({w.rows_per_s:,.0f})")  # fmt: skip
        if not a.skip_api:
            bench_api(work, int(a.rows), a.requests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
