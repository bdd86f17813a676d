"""Real time end to end (issue 29, point 3): simulator windows replayed into a real collector at
the agents' real rate, and how far its outputs trail the fabric.

    .venv/bin/python bench/realtime.py --hosts 1024 --minutes 5
    .venv/bin/python bench/realtime.py --hosts 4096 --minutes 5 --windows 8

The fleet is the reference fabric (``leafspine:hosts=N,nics=8,leaves=N/32,spines=8``; at least
8 leaves, for the rail wiring), 16 peers per NIC, paths known. ``--windows`` distinct simulator
windows are generated once (in a child process, so the simulator's memory is not the
replayer's) and cached under ``build/realtime/``: one file per window holding every host's
encoded batch (Arrow IPC from ``fleetlens.batch.encode_batch``: what an agent posts). The
simulated clocks have fixed offsets (±50 ms) and no drift, so window ``k`` of the replay can
reuse cached window ``k mod W`` with its times shifted: the shift is added in place to the two
time buffers of the encoded body (``start_ns`` and the hulls' ``hull_t_ns``), and the batch id
gets the replay second, so the replayer does no Arrow work per batch.

A real collector process (``start_collector``, a DuckDB file, the fabric as its inventory)
gets every host registered, then one window per wall second: host ``h`` posts its batch of
the window that ended at second ``s`` at ``s + offset_h`` (a fixed draw in [0, 1) s: agents
are not in phase), over its own keep-alive connection, strictly oldest first (a slow answer
delays that host's next batch, as it delays an agent's). ``--clients`` processes share the
hosts, each an asyncio loop.

Printed per minute of the replay:

- ingest lag: from a batch's due time to its 200 (p50/p99/max over the batches due in that
  minute; a batch still unanswered at the minute's end counts with its lag so far, so a
  backlog longer than the minute shows as ~60 s), batches stored against batches due by the
  minute's end, and how long ago the oldest unanswered batch was due (the backlog);
- verdict age: ``fleetlens_triangulated_window_age_seconds`` (now − the newest judged
  window's end), sampled every ``--sample-s`` from ``/metrics`` (p50/max of the samples);
- clock-model age: now − the newest served clock model's reference time (``t0 − offset``,
  the fleet time of the window generation the solve ended on; ``GET /v1/clocks``, first
  page), sampled alike;
- the collector's CPU (cores, every thread of every process it runs, ``/proc/PID/stat``)
  and RSS (now and peak), the wall seconds its clock and triangulation loops ran
  (``fleetlens_loop_duration_seconds``), the mean batches per writer transaction
  (``fleetlens_writer_commit_group_batches``: a commit's fixed cost is paid per group), and the
  replayer's own CPU (cores of its client processes: near one core each, it limits);
- where the writer process's memory goes at the minute's end (``fleetlens_memory_bytes``,
  ``api/memory.py``): its RSS, DuckDB's buffer pool, Arrow's pool, the look-back held for the
  loops, the ingest bodies held, glibc's heap in use and freed but kept.

The baseline in the same command is the same replay into an ingest-only collector
(``--ingest-only``: no clock solve, no triangulation, no retention) for ``--baseline-minutes``,
so the CPU the loops add is the difference. The last line says pass or fail against the
issue's bound: every lag (ingest p99, verdict and clock-model age p50) <= 3 s in every minute
after the first (start-up), and not growing (last minute <= first judged minute + 1 s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import mmap
import multiprocessing as mp
import os
import queue
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
from fleetlens.fixtures.collector import (
    CollectorProcess,
    start_collector,
    tree_cpu_s,
    tree_rss_mib,
)
from fleetlens.fixtures.sim import SimConfig, Simulator
from fleetlens.fixtures.sim.stream import CollectorStream, split_by_host

from fleetlens.batch import CT_ARROW, encode_batch
from fleetlens.topology import from_spec

NICS, PEERS, SPINES = 8, 16, 8
SEC = 1_000_000_000
EPOCH_NS = 1_767_225_600 * SEC  # the cached windows' time base (shifted on replay)
BOUND_S = 3.0  # the bound on every lag
GROWTH_S = 1.0  # "not growing": the last judged minute may exceed the first by this much
ID_DIGITS = 9  # the replay second, patched into the batch id
REPO = Path(__file__).resolve().parent.parent
# Per body in a window's index: where it is in the window file and what to patch in it.
INDEX = ("offset", "length", "id_at", "start_at", "start_n", "hull_at", "hull_n")


def fleet_spec(hosts: int) -> str:
    return f"leafspine:hosts={hosts},nics={NICS},leaves={max(NICS, hosts // 32)},spines={SPINES}"


# ---- the cache of encoded windows ------------------------------------------------------------
def cache_dir(root: Path, hosts: int, windows: int, seed: int) -> Path:
    return root / f"h{hosts}-n{NICS}-p{PEERS}-w{windows}-s{seed}"


def batch_id(w: int, h: int, second: int = 0) -> str:
    """Window ``w``'s batch of host ``h``; the replay second is patched into the last digits."""
    return f"rt-w{w:03d}-h{h:05d}-s{second:0{ID_DIGITS}d}"


def patch_points(body: bytes, bid: str) -> tuple[int, int, int, int, int]:
    """Byte offsets in an encoded batch of: the batch id's second digits, the ``start_ns``
    values (and their count), the hulls' ``hull_t_ns`` values (and their count)."""
    buf = pa.py_buffer(body)
    t = pa.ipc.open_stream(buf).read_all()  # zero-copy: the columns' buffers are in ``body``
    start, hull = t.column("start_ns"), t.column("hull_t_ns")
    assert start.num_chunks == 1 and hull.num_chunks == 1, "one record batch per body"
    s, h = start.chunk(0), hull.chunk(0)
    assert s.offset == 0 and h.offset == 0 and s.null_count == 0
    id_at = body.index(bid.encode()) + len(bid) - ID_DIGITS
    start_at = s.buffers()[1].address - buf.address
    hull_at = h.buffers()[3].address - buf.address
    return id_at, start_at, len(s), hull_at, int(h.offsets[-1].as_py()) if len(h) else 0


def shifted(body: bytes, row: np.ndarray, delta_ns: int, second: int) -> bytes:
    """``body`` with every window time moved by ``delta_ns`` and the batch id of ``second``."""
    out = bytearray(body)
    _, _, id_at, start_at, start_n, hull_at, hull_n = (int(x) for x in row)
    out[id_at : id_at + ID_DIGITS] = f"{second:0{ID_DIGITS}d}".encode()
    np.frombuffer(out, np.int64, start_n, start_at)[:] += delta_ns
    np.frombuffer(out, np.int64, hull_n, hull_at)[:] += delta_ns
    return bytes(out)


def sim_config() -> SimConfig:
    # Fixed clock offsets, no drift: cached windows replayed in a loop join without a jump.
    return SimConfig(peers=PEERS, paths_known=True, epoch_ns=EPOCH_NS, max_drift_ppb=0.0,
                     drift_walk_ppb=0.0, temp_step_rate=0.0)  # fmt: skip


def generate(out: Path, hosts: int, windows: int, seed: int) -> None:
    """Simulate ``windows`` windows and store every host's encoded batch of each."""
    topo = from_spec(fleet_spec(hosts))
    names = list(topo.hosts)
    sim = Simulator(topo, sim_config(), seed=seed)
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    rows = 0
    for win in sim.stream(windows):
        parts = dict(split_by_host(win.windows))
        index = np.zeros((hosts, len(INDEX)), np.int64)
        with open(tmp / f"w{win.index:03d}.bin", "wb") as f:
            for h, name in enumerate(names):
                part = parts.get(name, win.windows.schema.empty_table()).combine_chunks()
                bid = batch_id(win.index, h)
                body = encode_batch(name, part, bid)[0]
                index[h] = (f.tell(), len(body), *patch_points(body, bid))
                f.write(body)
                rows += part.num_rows
        np.save(tmp / f"w{win.index:03d}.npy", index)
    meta = {"hosts": hosts, "windows": windows, "seed": seed, "names": names, "rows": rows,
            "spec": fleet_spec(hosts)}  # fmt: skip
    (tmp / "meta.json").write_text(json.dumps(meta))
    tmp.rename(out)


def ensure_cache(root: Path, hosts: int, windows: int, seed: int) -> tuple[Path, dict]:
    d = cache_dir(root, hosts, windows, seed)
    if not (d / "meta.json").exists():
        t0 = time.perf_counter()
        p = mp.get_context("spawn").Process(target=generate, args=(d, hosts, windows, seed))
        p.start()
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"generating the windows failed (exit {p.exitcode})")
        print(f"cache        : {windows} windows simulated and encoded in "
              f"{time.perf_counter() - t0:.0f} s -> {d}")  # fmt: skip
    meta = json.loads((d / "meta.json").read_text())
    size = sum(f.stat().st_size for f in d.glob("w*.bin")) / 2**20
    print(f"cache        : {d} ({meta['rows'] / windows:,.0f} rows per window, "
          f"{size / windows:,.0f} MiB of bodies per window)")  # fmt: skip
    return d, meta


# ---- the replaying clients -------------------------------------------------------------------
@dataclass(frozen=True)
class Replay:
    url: str
    cache: str
    hosts: int
    windows: int  # cached windows
    t0_ns: int  # start of replay window 0 (wall clock)
    seconds: int  # replay windows to send
    offsets_ns: tuple[int, ...]  # per host: its posting time after each window's end


# Per batch answered: replay second, host, due time, answer time (wall ns), HTTP status.
RECORD = np.dtype([("k", np.int32), ("h", np.int32), ("due", np.int64), ("done", np.int64),
                   ("status", np.int16)])  # fmt: skip


def client_main(r: Replay, part: int, parts: int, out: mp.Queue) -> None:
    """One client process: the hosts ``part::parts``, each posting its batches in turn."""
    cache = Path(r.cache)
    maps = []
    for w in range(r.windows):
        with open(cache / f"w{w:03d}.bin", "rb") as f:  # the map outlives the file object
            maps.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    index = [np.load(cache / f"w{w:03d}.npy") for w in range(r.windows)]
    done: list[tuple[int, int, int, int, int]] = []
    host, port = r.url.removeprefix("http://").split(":")

    def body(k: int, h: int) -> bytes:
        w = k % r.windows
        row = index[w][h]
        raw = maps[w][row[0] : row[0] + row[1]]
        return shifted(raw, row, r.t0_ns + k * SEC - (EPOCH_NS + w * SEC), k)

    async def agent(h: int) -> None:
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        for k in range(r.seconds):
            due = r.t0_ns + (k + 1) * SEC + r.offsets_ns[h]
            await asyncio.sleep(max(0.0, (due - time.time_ns()) / 1e9))
            req = _request(body(k, h))
            while True:
                try:
                    conn = conn or await asyncio.open_connection(host, int(port))
                    status, retry_s = await _post(conn, req)
                except (OSError, asyncio.IncompleteReadError):
                    conn, status, retry_s = None, 0, 0.5  # connection lost: as a 503
                if status not in (0, 429, 503):
                    break
                await asyncio.sleep(retry_s)
            done.append((k, h, due, time.time_ns(), status))
        if conn is not None:
            conn[1].close()

    async def report() -> None:
        while True:
            await asyncio.sleep(1.0)
            if done:
                out.put(np.array(done, RECORD))
                done.clear()

    async def main() -> None:
        reporter = asyncio.create_task(report())
        await asyncio.gather(*(agent(h) for h in range(part, r.hosts, parts)))
        reporter.cancel()
        out.put(np.array(done, RECORD))

    asyncio.run(main())


def _request(body: bytes) -> bytes:
    head = (f"POST /v1/ingest HTTP/1.1\r\nHost: collector\r\nContent-Type: {CT_ARROW}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")  # fmt: skip
    return head.encode() + body


async def _post(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], req: bytes
                ) -> tuple[int, float]:  # fmt: skip
    """Status and Retry-After (s) of one request on a keep-alive connection."""
    reader, writer = conn
    writer.write(req)
    await writer.drain()
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in head[1:] if ln)}
    await reader.readexactly(int(headers.get("content-length", "0")))
    return int(head[0].split()[1]), float(headers.get("retry-after", "1"))


# ---- watching the collector ------------------------------------------------------------------
def _get(url: str, timeout_s: float = 30.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return bytes(resp.read())


def scrape(url: str) -> dict[str, float]:
    """The ``/metrics`` samples this bench reads, by name and loop label."""
    out: dict[str, float] = {}
    for ln in _get(url + "/metrics").decode().splitlines():
        if ln.startswith(("fleetlens_triangulated_window_age_seconds",
                          "fleetlens_loop_duration_seconds_sum",
                          "fleetlens_writer_commit_group_batches_",
                          "fleetlens_memory_bytes")):  # fmt: skip
            name, value = ln.rsplit(" ", 1)
            name = name.replace('{loop="', ":").replace('{part="', ":")
            out[name.rstrip('"}')] = float(value)
    return out


def clock_age_s(url: str) -> float:
    """Now − the newest served model's reference (fleet) time; NaN before the first solve."""
    models = json.loads(_get(url + "/v1/clocks?limit=100"))
    # t0 0: an identity model (no solve for that host yet), not a reference time
    refs = [m["t0_ns"] - round(m["offset_ns"]) for m in models if m["t0_ns"] > 0]
    return (time.time_ns() - max(refs)) / 1e9 if refs else float("nan")


@dataclass
class Minute:
    lag_p50: float
    lag_p99: float
    lag_max: float
    stored: int
    due: int
    backlog_s: float  # the oldest batch due and unanswered at the minute's end: due that long
    verdict_p50: float
    verdict_max: float
    clock_p50: float
    clock_max: float
    cores: float
    rss_mib: float
    peak_mib: float
    loops_s: dict[str, float]
    replayer_cores: float
    group_batches: float  # batches per writer transaction (mean)
    memory: dict[str, float]  # the collector's memory parts at the minute's end, MiB


@dataclass
class Watch:
    """What the main process gathers during a replay."""

    col: CollectorProcess
    r: Replay
    loops: bool
    records: list[np.ndarray] = field(default_factory=list)
    verdict: list[tuple[int, float]] = field(default_factory=list)
    clock: list[tuple[int, float]] = field(default_factory=list)

    def sample(self) -> None:
        now = time.time_ns()
        if not self.loops:
            return
        m = scrape(self.col.url)
        self.verdict.append((now, m.get("fleetlens_triangulated_window_age_seconds", np.nan)))
        self.clock.append((now, clock_age_s(self.col.url)))

    def minute(self, lo: int, hi: int, cpu_s: float, loops_s: dict[str, float],
               replayer_s: float, group: float, memory: dict[str, float]) -> Minute:  # fmt: skip
        rec = np.concatenate(self.records) if self.records else np.zeros(0, RECORD)
        r, now = self.r, time.time_ns()
        due = r.t0_ns + (np.arange(r.seconds)[:, None] + 1) * SEC + np.array(r.offsets_ns)
        answered = np.zeros(due.shape, bool)
        answered[rec["k"], rec["h"]] = True
        in_min = (rec["due"] >= lo) & (rec["due"] < hi)
        # Batches due in this minute and not answered yet count with their lag so far.
        waiting = ~answered & (due >= lo) & (due < min(hi, now))
        lags = np.concatenate([(rec["done"][in_min] - rec["due"][in_min]) / 1e9,
                               (min(hi, now) - due[waiting]) / 1e9])  # fmt: skip
        stored = int((rec["status"][rec["due"] < hi] == 200).sum())
        n_due = int((due < hi).sum())
        behind = due[~answered & (due < hi)]
        backlog = (hi - int(behind.min())) / 1e9 if behind.size else 0.0
        lag = lags if lags.size else np.array([np.nan])
        v = np.array([a for t, a in self.verdict if lo <= t < hi] or [np.nan])
        c = np.array([a for t, a in self.clock if lo <= t < hi] or [np.nan])
        rss, peak = tree_rss_mib(self.col.pid)
        span = (hi - lo) / 1e9
        return Minute(
            float(np.percentile(lag, 50)), float(np.percentile(lag, 99)), float(lag.max()),
            stored, n_due, backlog, _nanpct(v, 50), _nanmax(v), _nanpct(c, 50), _nanmax(c),
            cpu_s / span, rss, peak, loops_s, replayer_s / span, group, memory,
        )  # fmt: skip


def _nanpct(a: np.ndarray, q: float) -> float:
    return float(np.nanpercentile(a, q)) if np.isfinite(a).any() else float("nan")


def _nanmax(a: np.ndarray) -> float:
    return float(np.nanmax(a)) if np.isfinite(a).any() else float("nan")


def print_minute(i: int, m: Minute, loops: bool) -> None:
    ages = (f"verdict age p50 {m.verdict_p50:5.1f} max {m.verdict_max:5.1f} s; clock-model age "
            f"p50 {m.clock_p50:5.1f} max {m.clock_max:5.1f} s; " if loops else "")  # fmt: skip
    loop_s = ", ".join(f"{k} {v:.1f} s" for k, v in m.loops_s.items())
    print(f"  minute {i}: ingest lag p50 {m.lag_p50:5.2f} p99 {m.lag_p99:5.2f} max "
          f"{m.lag_max:5.2f} s, batches stored/due {m.stored}/{m.due} (oldest unanswered due "
          f"{m.backlog_s:.1f} s ago); {ages}collector "
          f"{m.cores:.2f} cores, RSS {m.rss_mib:,.0f} MiB (peak {m.peak_mib:,.0f}); "
          f"loops {loop_s or 'off'}; {m.group_batches:.1f} batches per commit; replayer "
          f"{m.replayer_cores:.2f} cores",
          flush=True)  # fmt: skip
    if m.memory:
        parts = ", ".join(f"{k} {v:,.0f}" for k, v in m.memory.items())
        print(f"    memory (MiB, writer's process): {parts}", flush=True)


def replay(work: Path, cache: Path, meta: dict, minutes: float, clients: int, loops: bool,
           sample_s: float, seed: int, more_args: list[str]) -> list[Minute]:  # fmt: skip
    """One replay into a fresh collector; the per-minute figures (also printed)."""
    hosts, label = meta["hosts"], "full collector" if loops else "ingest-only collector"
    args = ["--insecure-no-auth", "--public-metrics", *([] if loops else ["--ingest-only"])]
    args += more_args
    db = work / ("full.duckdb" if loops else "ingest.duckdb")
    col = start_collector(db, meta["spec"], args, log=db.with_suffix(".log"), timeout_s=120)
    try:
        t = time.perf_counter()
        stream = CollectorStream(col.url, None, workers=8)
        stream.register(from_spec(meta["spec"]), sim_config().ts_source)
        stream.close()
        print(f"{label}: pid {col.pid}, {hosts} hosts registered in "
              f"{time.perf_counter() - t:.1f} s; replaying {minutes:g} min",
              flush=True)  # fmt: skip
        offsets = np.random.default_rng(seed).integers(0, SEC, hosts)
        seconds = round(minutes * 60)
        t0 = (time.time_ns() // SEC + 1) * SEC
        r = Replay(col.url, str(cache), hosts, meta["windows"], t0, seconds,
                   tuple(int(o) for o in offsets))  # fmt: skip
        return _run(col, r, clients, loops, sample_s)
    finally:
        col.stop(timeout_s=60)


def _run(col: CollectorProcess, r: Replay, clients: int, loops: bool, sample_s: float
         ) -> list[Minute]:  # fmt: skip
    ctx = mp.get_context("fork")
    out: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=client_main, args=(r, i, clients, out)) for i in range(clients)]
    for p in procs:
        p.start()
    w = Watch(col, r, loops)
    minutes: list[Minute] = []
    try:
        end = r.t0_ns + (r.seconds + 1) * SEC  # the last window's end + the posting second
        lo = r.t0_ns + SEC  # the first batches are due from here
        while lo < end:
            hi = min(lo + 60 * SEC, end)
            cpu0, rep0 = tree_cpu_s(col.pid), sum(_cpu(p) for p in procs)
            loops0 = scrape(col.url)
            while time.time_ns() < hi:
                _drain(out, w.records, min(sample_s, (hi - time.time_ns()) / 1e9))
                col.check_alive("replaying")
                w.sample()
            loops1 = scrape(col.url)
            loop_s = {k.split(":")[1]: v - loops0.get(k, 0.0) for k, v in loops1.items()
                      if k.startswith("fleetlens_loop_duration")}  # fmt: skip
            g = "fleetlens_writer_commit_group_batches_"
            commits = loops1.get(g + "count", 0.0) - loops0.get(g + "count", 0.0)
            group = (loops1.get(g + "sum", 0.0) - loops0.get(g + "sum", 0.0)) / max(commits, 1)
            mem = {k.split(":")[1]: v / 2**20 for k, v in loops1.items()
                   if k.startswith("fleetlens_memory_bytes")}  # fmt: skip
            m = w.minute(lo, hi, tree_cpu_s(col.pid) - cpu0, loop_s,
                         sum(_cpu(p) for p in procs) - rep0, group, mem)  # fmt: skip
            minutes.append(m)
            print_minute(len(minutes), m, loops)
            lo = hi
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    return minutes


def _cpu(p: mp.process.BaseProcess) -> float:
    assert p.pid is not None
    return tree_cpu_s(p.pid)


def _drain(q: mp.Queue, into: list[np.ndarray], wait_s: float) -> None:
    deadline = time.monotonic() + max(0.0, wait_s)
    while True:
        try:
            into.append(q.get(timeout=max(0.01, deadline - time.monotonic())))
        except queue.Empty:
            return
        if time.monotonic() >= deadline:
            return


# ---- the verdict -------------------------------------------------------------------------
def judge(minutes: list[Minute]) -> tuple[bool, str]:
    """Pass: every lag <= BOUND_S in every minute after the first (start-up), and none grew
    by more than GROWTH_S from the first judged minute to the last."""
    judged = minutes[1:] if len(minutes) > 1 else minutes
    lags = {
        "ingest lag p99": [m.lag_p99 for m in judged],
        "verdict age p50": [m.verdict_p50 for m in judged],
        "clock-model age p50": [m.clock_p50 for m in judged],
    }
    failed = []
    for name, v in lags.items():
        worst = max(v)
        if not all(np.isfinite(v)) or worst > BOUND_S:
            failed.append(f"{name} up to {worst:.1f} s")
        elif v[-1] > v[0] + GROWTH_S:
            failed.append(f"{name} growing ({v[0]:.1f} -> {v[-1]:.1f} s)")
    return not failed, "; ".join(failed)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--hosts", type=int, default=1024)
    ap.add_argument("--minutes", type=float, default=5.0, help="replay length (full collector)")
    ap.add_argument("--baseline-minutes", type=float, default=1.0,
                    help="replay length into the ingest-only collector (0: none)")  # fmt: skip
    ap.add_argument("--windows", type=int, default=20, help="distinct cached windows")
    ap.add_argument("--clients", type=int, default=2, help="replaying client processes")
    ap.add_argument("--sample-s", type=float, default=5.0, help="age and CPU sampling period")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cache", type=Path, default=REPO / "build" / "realtime")
    ap.add_argument("--workdir", type=Path, help="default: a temporary directory")
    workers_help = "the collector's --ingest-workers (CPU and RSS: its processes summed)"
    ap.add_argument("--ingest-workers", type=int, default=0, help=workers_help)
    ap.add_argument("--duckdb-threads", type=int, help="the collector's (default: its own)")
    a = ap.parse_args()
    cache, meta = ensure_cache(a.cache, a.hosts, a.windows, a.seed)
    print(f"machine      : {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; fleet {meta['spec']}, {PEERS} "
          f"peers, {a.clients} client processes")  # fmt: skip
    more = ["--ingest-workers", str(a.ingest_workers)] if a.ingest_workers else []
    more += ["--duckdb-threads", str(a.duckdb_threads)] if a.duckdb_threads else []
    with tempfile.TemporaryDirectory(dir=a.workdir) as tmp:
        work = Path(tmp)
        base = []
        if a.baseline_minutes > 0:
            base = replay(work, cache, meta, a.baseline_minutes, a.clients, False, a.sample_s,
                          a.seed, more)  # fmt: skip
        full = replay(work, cache, meta, a.minutes, a.clients, True, a.sample_s, a.seed,
                      more)  # fmt: skip
    cores = float(np.mean([m.cores for m in full[1:] or full]))
    if base:
        b = float(np.mean([m.cores for m in base]))
        print(f"CPU split    : full collector {cores:.2f} cores, ingest-only {b:.2f} cores: the "
              f"loops add {cores - b:.2f} cores (ratio {cores / b:.2f})")  # fmt: skip
    peak = max(m.peak_mib for m in full)
    print(f"collector RSS: peak {peak:,.0f} MiB at {a.hosts} hosts "
          f"(steady state, last minute {full[-1].rss_mib:,.0f} MiB)")  # fmt: skip
    ok, why = judge(full)
    print(
        f"{'PASS' if ok else 'FAIL'}: lags <= {BOUND_S:.0f} s and not growing"
        + ("" if ok else f" -- {why}")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
