"""Clock-sync cost per collector round at fleet scale, and how it grows with the rounds.

Drives one ``HuygensSync`` the way the collector's clock round does (``api/rounds.py``): one
call per window generation, handed the windows of the look-back (``loop_lookback_ns``, the
newest generation and the ones before it) and the models of the last call. The windows are
the simulator's on ``leafspine:hosts=N,nics=8,leaves=N/32,spines=8`` with 16 peers per NIC and
paths known (one row per distinct path, the agents' real shape: ~910 rows per host).

Simulating a 1024-host window takes ~12 s, so a few windows are simulated once per size
(cached under ``--cache``) and replayed with shifted times: clocks are linear in the bench's
fabric (no drift wander, no drift steps), so shifting a window by ``Δ`` of true time moves
each sender's raw stamps by ``Δ·(1 + drift)`` and each one-way delay by ``(drift_dst −
drift_src)·Δ``, exactly what the next windows would show.

The look-back is kept and handed over as the collector keeps it (``--arrival commit``, the
default): each window's rows arrive as one batch per host (its senders' rows), hosts in a new
order each window, through ``api/feed.py``'s ``RecentWindows`` in commit groups of
``--commit-group`` batches (``add_all``, on the collector's writer thread), and the round
reads its look-back with ``between`` (as ``api/rounds.py`` does); that upkeep's CPU is counted
per window beside the round's, with the ``RecentWindows`` of the same revision as the engine.
``--arrival sorted`` hands each window as one chunk with its rows sorted by NIC pair, as the
simulator writes them, and counts no upkeep (the bench's shape before issue 29's last
session: an engine that needs its rows grouped by pair looks cheaper there than in the
collector).

Each engine runs in a process set up as the collector's (``keep_freed_memory``, as
``fleetlens collector`` calls it: freed arrays stay in the heap for the next round instead of
being faulted in again; ``--heap default`` leaves glibc's thresholds). ``--arrow-pool
system`` takes Arrow's allocations (the look-back's batches, the rows' tests) from that heap
instead of Arrow's default pool (mimalloc), which hands freed memory back to the system.

Prints per size: CPU seconds (all threads) of each round's solve, the look-back's upkeep per
window and their sum (the sync's CPU per window), the growth from round 5 to the last round
(and of the last 5 rounds' mean over rounds 5-9's), the worker's RSS before the first round
and its peak; with ``--against REV`` the same for the ``sync/`` engine and ``api/feed.py`` of
git revision REV (exported into a temp dir and imported under other names, in its own
process; up to ``--against-max-hosts``) and the ratios old/new of the means of rounds
5-last, per window and of the round alone. The windows' rows carry the hulls agents send
(each flow's points on its NIC pair's hull); ``--against-hulls flow`` gives REV the same
probes' whole flow hulls instead, as agents sent them before that cut: the ratio is then
the engine's and the cut's together, not the engine's alone.
``--profile`` prints a cProfile of the current engine's rounds instead; ``--engine REV`` takes
the current engine from a git revision too (exported the same way) instead of the tree.

    nice -n 10 .venv/bin/python bench/sync_scale.py --hosts 256,1024,4096 --rounds 20 \\
        [--against REV] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import json
import os
import pstats
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parents[1]
BASE_WINDOWS = 4  # simulated windows per size, replayed with shifted times
LOOKBACK_NS = 2_000_000_000  # fleetlens.api.config.Settings.loop_lookback_ns
RECENT_SPARE_NS = 1_000_000_000  # fleetlens.api.feed.RECENT_SPARE_NS
COLUMNS = ["src_nic", "dst_nic", "start_ns", "duration_ns", "pure", "hull_t_ns",
           "hull_owd_ns", "ts_source"]  # fmt: skip


def spec(hosts: int) -> str:
    return f"leafspine:hosts={hosts},nics=8,leaves={max(hosts // 32, 1)},spines=8"


# ---- windows ----------------------------------------------------------------------------
def simulate(hosts: int, cache: Path, pair_hulls: bool = True) -> Path:
    """The size's base windows and per-host drifts, simulated once (Arrow IPC file); each
    row's hull cut to its pair's as agents send it, or (``pair_hulls`` False) the flow's
    whole hull as agents sent it before (the same probes)."""
    name = f"sync-scale-{hosts}-{BASE_WINDOWS}{'' if pair_hulls else '-flowhulls'}.arrow"
    path = cache / name
    if path.exists():
        return path
    from fleetlens.fixtures.sim.config import SimConfig
    from fleetlens.fixtures.sim.engine import Simulator

    from fleetlens.topology import from_spec

    cfg = SimConfig(clock="identity", paths_known=True, drift_walk_ppb=0.0, temp_step_rate=0.0,
                    pair_hulls=pair_hulls)  # fmt: skip
    sim = Simulator(from_spec(spec(hosts)), cfg, seed=1)
    parts, drift = [], None
    t0 = time.time()
    for sw in sim.stream(float(BASE_WINDOWS)):
        parts.append(sw.windows.select([*COLUMNS, "window"]))
        if drift is None:
            drift = sw.truth_clocks.select(["host_id", "drift_ppb"])
    print(f"  simulated {BASE_WINDOWS} windows of {hosts} hosts in {time.time() - t0:.0f} s",
          flush=True)  # fmt: skip
    table = pa.concat_tables(parts)
    meta = {b"drift": json.dumps(dict(zip(*drift.to_pydict().values(), strict=True))).encode()}
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with pa.OSFile(str(tmp), "wb") as f, pa.ipc.new_file(f, table.schema.with_metadata(meta)) as w:
        w.write_table(table)
    tmp.rename(path)
    return path


class Windows:
    """Window generation ``r`` of the replay: base window ``r mod W``, shifted in time."""

    def __init__(self, path: Path, arrival: str = "commit") -> None:
        with pa.memory_map(str(path)) as f:
            reader = pa.ipc.open_file(f)
            table = reader.read_all()
            drift = json.loads(reader.schema.metadata[b"drift"])
        w = table["window"].to_numpy()
        self.base = [table.filter(pa.array(w == i)).drop(["window"]) for i in range(w.max() + 1)]
        self.period_ns = int(self.base[0]["duration_ns"][0].as_py()) * len(self.base)
        self.drift = {h: float(d) * 1e-9 for h, d in drift.items()}
        self.arrival = arrival

    def __call__(self, r: int) -> pa.Table:
        """Window ``r`` as one table (the sorted shape)."""
        return self._shifted(r)

    def batches(self, r: int) -> list[pa.Table]:
        """Window ``r`` as the hosts' batches (a sender's rows are together; ``WINDOW_SCHEMA``,
        the columns the bench does not carry null), hosts in a new order each window."""
        from fleetlens.records import WINDOW_SCHEMA

        t = self._shifted(r)
        t = pa.Table.from_arrays(
            [t[f.name] if f.name in t.schema.names else pa.nulls(t.num_rows, f.type)
             for f in WINDOW_SCHEMA], schema=WINDOW_SCHEMA,
        )  # fmt: skip
        host = pc.split_pattern(t["src_nic"], "/", max_splits=1)
        names = pc.list_element(host, 0).combine_chunks().dictionary_encode().indices.to_numpy()
        starts = np.flatnonzero(np.r_[True, names[1:] != names[:-1]])
        ends = np.r_[starts[1:], names.size]
        order = np.random.default_rng(r).permutation(starts.size)
        return [t.slice(int(starts[i]), int(ends[i] - starts[i])) for i in order]

    def _shifted(self, r: int) -> pa.Table:
        t = self.base[r % len(self.base)]
        shift = (r // len(self.base)) * self.period_ns
        if not shift:
            return t
        d_src = self._host_drift(t["src_nic"])
        d_dst = self._host_drift(t["dst_nic"])
        t = t.set_column(t.schema.get_field_index("start_ns"), "start_ns",
                         pc.add(t["start_ns"], shift))  # fmt: skip
        move_t = np.rint(shift * (1.0 + d_src)).astype(np.int64)
        move_y = np.rint(shift * (d_dst - d_src)).astype(np.int64)
        for name, move in (("hull_t_ns", move_t), ("hull_owd_ns", move_y)):
            col = t[name].combine_chunks()
            lens = pc.list_value_length(col).to_numpy(zero_copy_only=False)
            vals = col.values.to_numpy() + np.repeat(move, lens)
            new = pa.ListArray.from_arrays(col.offsets, pa.array(vals, pa.int64()))
            t = t.set_column(t.schema.get_field_index(name), name, new)
        return t

    def _host_drift(self, nics: pa.ChunkedArray) -> np.ndarray:
        names = nics.combine_chunks().dictionary_encode()
        per = np.array([self.drift[n.partition("/")[0]] for n in names.dictionary.to_pylist()])
        return per[names.indices.to_numpy()]


# ---- one engine, in its own process -----------------------------------------------------
def engine_class(engine_dir: str | None) -> Callable[[], Callable]:
    """``HuygensSync`` of this tree, or of a revision's ``sync/`` exported to ``engine_dir``
    (a package ``fleetlens_sync_rev`` there)."""
    if engine_dir is None:
        from fleetlens.sync import HuygensSync

        return HuygensSync
    sys.path.insert(0, engine_dir)
    import fleetlens_sync_rev  # type: ignore[import-not-found]

    return fleetlens_sync_rev.HuygensSync


def recent_class(engine_dir: str | None) -> Callable[[int | None, int], Any]:
    """``RecentWindows`` of this tree, or of a revision's ``api/feed.py`` exported to
    ``engine_dir`` (its imports are this tree's)."""
    if engine_dir is None:
        from fleetlens.api.feed import RecentWindows

        return RecentWindows
    spec_ = importlib.util.spec_from_file_location("fleetlens_feed_rev", f"{engine_dir}/feed.py")
    assert spec_ is not None and spec_.loader is not None
    mod = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(mod)
    return mod.RecentWindows


def worker(args: argparse.Namespace) -> None:
    from fleetlens.heap import keep_freed_memory
    from fleetlens.topology import from_spec

    if args.heap == "collector":
        keep_freed_memory()  # as the collector's process (api/cli.py)
    if args.arrow_pool == "system":
        pa.set_memory_pool(pa.system_memory_pool())

    windows = Windows(Path(args.data), args.arrival)
    topo = from_spec(spec(args.n_hosts))
    sync = engine_class(args.engine_dir)()
    back = LOOKBACK_NS // (windows.period_ns // len(windows.base))
    recent: deque[pa.Table] = deque(maxlen=back + 1)
    held = recent_class(args.engine_dir)(None, LOOKBACK_NS + RECENT_SPARE_NS)
    models: dict = {}
    cpu, upkeep, rss = [], [], []
    rss0 = _rss_mb()
    # process time, as the rounds are measured: other work on the box does not count
    prof = cProfile.Profile(time.process_time) if args.profile else None
    for r in range(args.rounds):
        if args.arrival == "sorted":
            recent.append(windows(r))
            table, upkeep_s = pa.concat_tables(list(recent)), 0.0
        else:
            table, upkeep_s = _held_lookback(held, windows.batches(r), args.commit_group)
        upkeep.append(upkeep_s)
        t0 = time.process_time()
        if prof:
            prof.enable()
        out = sync(table, topo, models)
        if prof:
            prof.disable()
        cpu.append(time.process_time() - t0)
        models = {m.host_id: m for m in out}
        rss.append(_rss_mb())
        synced = sum(m.synced for m in out)
        print(f"    round {r + 1:3d}: {cpu[-1]:7.3f} s  upkeep {upkeep[-1]:6.3f} s  synced "
              f"{synced}/{len(out)}", file=sys.stderr, flush=True)  # fmt: skip
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if prof:
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
    print(json.dumps({"cpu": cpu, "upkeep": upkeep, "rss0": rss0, "rss": rss, "peak": peak}))


def _held_lookback(held: Any, batches: list[pa.Table], group: int) -> tuple[pa.Table, float]:
    """The window's batches added to the held look-back in commit groups (the writer
    thread's part), then the clock round's look-back read from it (``api/rounds.py``:
    ``between`` over the look-back up to the newest start, paths left out); their CPU."""
    hi = max(int(b["start_ns"][0].as_py()) for b in batches)
    t0 = time.process_time()
    for i in range(0, len(batches), group):
        held.add_all(batches[i : i + group])
    table = held.between(hi - LOOKBACK_NS, hi, ("path",))
    spent = time.process_time() - t0
    if table is None:
        raise RuntimeError("the held look-back does not cover the round's")
    return table, spent


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_worker(
    hosts: int, data: Path, args: argparse.Namespace, engine_dir: str | None, profile: bool
) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--n-hosts", str(hosts), "--data", str(data),
           "--rounds", str(args.rounds), "--arrival", args.arrival,
           "--heap", args.heap, "--arrow-pool", args.arrow_pool,
           "--commit-group", str(args.commit_group)]  # fmt: skip
    if engine_dir:
        cmd += ["--engine-dir", engine_dir]
    if profile:
        cmd += ["--profile"]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def export(rev: str, into: Path) -> str:
    """``sync/`` of ``rev`` as the package ``fleetlens_sync_rev`` under ``into`` (its relative
    imports stay inside it; the vocabulary, ``fleetlens.*``, is this tree's)."""
    arch = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "sync"], check=True,
                          stdout=subprocess.PIPE).stdout  # fmt: skip
    tar = into / "sync.tar"
    tar.write_bytes(arch)
    with tarfile.open(tar) as tf:
        tf.extractall(into, filter="data")
    (into / "sync").rename(into / "fleetlens_sync_rev")
    feed = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:api/feed.py"], check=True,
                          stdout=subprocess.PIPE).stdout  # fmt: skip
    (into / "feed.py").write_bytes(feed)  # its RecentWindows: the look-back's upkeep
    pyx = [str(p) for p in (into / "fleetlens_sync_rev").glob("*.pyx")]
    if pyx:  # its Cython kernels, built in place (needs the 'bench' extra's Cython), with the
        # vocabulary's declarations they cimport (fleetlens/*.pxd) found in the build's cwd
        _export_pxd(rev, into)
        subprocess.run([sys.executable, "-m", "Cython.Build.Cythonize", "-i", "-3", "-q", *pyx],
                       check=True, stdout=subprocess.DEVNULL, cwd=into)  # fmt: skip
    return str(into)


def _export_pxd(rev: str, into: Path) -> None:
    """``rev``'s ``fleetlens/*.pxd`` (e.g. the Arrow C interfaces) written into ``into``."""
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", rev,
                            "fleetlens/"], check=True, stdout=subprocess.PIPE,
                           text=True).stdout.split()  # fmt: skip
    for name in (n for n in names if n.endswith(".pxd")):
        body = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{name}"], check=True,
                              stdout=subprocess.PIPE).stdout  # fmt: skip
        (into / Path(name).name).write_bytes(body)


def _dir(parent: Path, name: str) -> Path:
    (parent / name).mkdir()
    return parent / name


# ---- report -----------------------------------------------------------------------------
def summary(label: str, res: dict) -> tuple[float, float]:
    """Print one engine's rounds; returns the means from round 5 on (all rounds if fewer) of
    the CPU per window (round and look-back upkeep) and of the round alone."""
    cpu = np.array(res["cpu"])
    up = np.array(res["upkeep"])
    first = 5 if cpu.size >= 5 else 1
    tail = cpu[first - 1 :]
    grow = cpu[-1] / cpu[first - 1] if cpu[first - 1] > 0 else float("nan")
    # single rounds scatter with the box's load: the last 5 rounds' mean over rounds 5-9's too
    late = cpu[-5:].mean() / cpu[first - 1 : first + 4].mean() if cpu.size >= 9 else grow
    print(f"  {label}: per round (CPU s) " + " ".join(f"{c:.3f}" for c in cpu))
    print(f"  {label}: mean rounds {first}-{cpu.size} {tail.mean():.3f} s, max {tail.max():.3f} "
          f"s, round {cpu.size}/round {first} {grow:.2f}x, last 5 rounds/rounds {first}-"
          f"{first + 4} {late:.2f}x; RSS {res['rss0']:.0f} MB before, "
          f"after round {first} {res['rss'][first - 1]:.0f} MB, after round {cpu.size} "
          f"{res['rss'][-1]:.0f} MB, peak {res['peak']:.0f} MB")  # fmt: skip
    per = (cpu + up)[first - 1 :]
    print(f"  {label}: look-back upkeep per window (CPU s) " + " ".join(f"{u:.3f}" for u in up))
    print(f"  {label}: per window, round + upkeep: mean rounds {first}-{cpu.size} "
          f"{per.mean():.3f} s (upkeep {up[first - 1 :].mean():.3f}), "
          f"max {per.max():.3f} s")  # fmt: skip
    return float(per.mean()), float(tail.mean())


def add_worker_args(ap: argparse.ArgumentParser) -> None:
    """The window cache, and what a worker process (one engine, its own heap) is told."""
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "fleetlens-bench")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--engine-dir", help=argparse.SUPPRESS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="256,1024,4096")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--against", metavar="REV", help="also run the sync/ of this git revision")
    ap.add_argument("--engine", metavar="REV",
                    help="the new engine from this git revision, not the working tree (a run "
                    "waiting for the bench lock measures the code it was started for)")  # fmt: skip
    ap.add_argument("--against-max-hosts", type=int, default=1024, metavar="N",
                    help="run REV only up to N hosts (the issue 26 engine peaks at 22 GB at "
                    "1024 hosts: more does not fit this VM)")  # fmt: skip
    ap.add_argument("--against-hulls", choices=("pair", "flow"), default="pair",
                    help="the windows REV is given: each row cut to its pair's hull as "
                    "agents send it (the engines on the same input), or every flow's whole "
                    "hull as agents sent it before (the engine and the cut together)")  # fmt: skip
    ap.add_argument("--profile", action="store_true", help="cProfile the current engine")
    ap.add_argument("--arrival", choices=("commit", "sorted"), default="commit",
                    help="the look-back's rows: per host batch in commit order (the "
                    "collector's), or each window sorted by pair in one chunk")  # fmt: skip
    ap.add_argument("--commit-group", type=int, default=32, metavar="N",
                    help="batches per commit group added to the held look-back")  # fmt: skip
    ap.add_argument("--heap", choices=("collector", "default"), default="collector",
                    help="the worker's heap set up as the collector's (keep_freed_memory) "
                    "or glibc's defaults")  # fmt: skip
    ap.add_argument("--arrow-pool", choices=("default", "system"), default="default",
                    help="Arrow's allocations from its default pool (mimalloc, as the "
                    "collector's) or the C heap (with --heap collector: kept freed)")  # fmt: skip
    ap.add_argument("--n-hosts", type=int, help=argparse.SUPPRESS)
    add_worker_args(ap)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        old = export(args.against, _dir(Path(tmp), "old")) if args.against else None
        cur = export(args.engine, _dir(Path(tmp), "new")) if args.engine else None
        for hosts in (int(h) for h in args.hosts.split(",")):
            print(f"{spec(hosts)}, 16 peers, {args.rounds} rounds, {args.arrival} order, "
                  f"{args.heap} heap, Arrow's {args.arrow_pool} pool", flush=True)  # fmt: skip
            data = simulate(hosts, args.cache)
            new = summary("new", run_worker(hosts, data, args, cur, args.profile))
            if old and hosts <= args.against_max_hosts:
                was_data = simulate(hosts, args.cache, args.against_hulls == "pair")
                was = summary(args.against, run_worker(hosts, was_data, args, old, False))
                first = 5 if args.rounds >= 5 else 1
                print(f"  ratio {args.against} ({args.against_hulls} hulls)/new "
                      f"(mean rounds {first}-{args.rounds}): "
                      f"per window {was[0] / new[0]:.1f}x, "
                      f"round alone {was[1] / new[1]:.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
