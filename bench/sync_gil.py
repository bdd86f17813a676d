"""How long a clock-sync round holds the GIL at fleet scale: the time other Python threads of
the collector (its HTTP ingest) wait for it.

Drives ``HuygensSync`` as ``bench/sync_scale.py``'s worker does (its cached simulator windows,
the look-back handed over in commit order through ``RecentWindows``, the collector's heap)
and samples it with py-spy (``pip install py-spy``, not a project dependency; run as root or
with ptrace allowed), attached after the first round (whose soft-margin LPs hold the GIL in
HiGHS): once every sample, once only those taken while the GIL is held (``--gil``). Prints
per engine the samples inside ``HuygensSync.__call__`` over rounds 2-N, the GIL-held seconds
a round (samples over the rate), their share of the round's samples, the round's CPU and
wall seconds, and the engine lines holding the GIL most (``--native``: the C functions
too); with ``--against REV`` the same for the ``sync/`` engine of git revision REV (exported
as ``bench/sync_scale.py`` does).

    nice -n 10 .venv/bin/python bench/sync_gil.py --hosts 1024 --rounds 10 --against main
"""

from __future__ import annotations

import argparse
import collections
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sync_scale as ss


def worker(args: argparse.Namespace) -> None:
    """The rounds, a pause after the first for py-spy to attach; their CPU and wall seconds."""
    from fleetlens.api.feed import RecentWindows

    from fleetlens.heap import keep_freed_memory
    from fleetlens.topology import from_spec

    keep_freed_memory()
    windows = ss.Windows(Path(args.data))
    topo = from_spec(ss.spec(args.hosts))
    sync = ss.engine_class(args.engine_dir)()
    held = RecentWindows(None, ss.LOOKBACK_NS + ss.RECENT_SPARE_NS)
    models: dict = {}
    cpu, wall = [], []
    for r in range(args.rounds):
        table, _ = ss._held_lookback(held, windows.batches(r), 32)
        t0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        models = {m.host_id: m for m in sync(table, topo, models)}
        t1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu.append(t1.ru_utime + t1.ru_stime - t0.ru_utime - t0.ru_stime)
        wall.append(time.perf_counter() - w0)
        if r == 0:
            print("attach", flush=True)
            time.sleep(2.0)
    print(json.dumps({"cpu": cpu[1:], "wall": wall[1:]}), flush=True)


def sampled(args: argparse.Namespace, engine_dir: str | None, gil: bool, out: Path) -> dict:
    """One worker run with py-spy attached after its first round; the worker's figures."""
    cmd = [sys.executable, __file__, "--worker", "--hosts", str(args.hosts), "--rounds",
           str(args.rounds), "--data", str(ss.simulate(args.hosts, args.cache))]  # fmt: skip
    if engine_dir:
        cmd += ["--engine-dir", engine_dir]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    while proc.stdout.readline().strip() != "attach":
        pass
    spy = [args.py_spy, "record", "-r", str(args.rate), "-f", "raw", "-o", str(out), "--pid",
           str(proc.pid), "--native" if args.native else "--nonblocking"]  # fmt: skip
    spy += ["--gil"] if gil else []
    subprocess.run(spy, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    res = json.loads(proc.stdout.read().strip().splitlines()[-1])
    proc.wait()
    return res


def in_round(raw: Path) -> tuple[int, collections.Counter[str]]:
    """Samples inside the engine's ``__call__`` and, per engine line, the samples whose
    deepest engine frame it is."""
    total, where = 0, collections.Counter[str]()
    for line in raw.read_text().splitlines():
        stack, n = line.rsplit(" ", 1)
        frames = stack.split(";")
        if not any(f.startswith("__call__ (") and "solver.py" in f for f in frames):
            continue
        total += int(n)
        own = [f for f in frames if "sync/" in f or "fleetlens_sync_rev/" in f]
        where[own[-1] if own else "?"] += int(n)
    return total, where


def report(label: str, args: argparse.Namespace, engine_dir: str | None, tmp: Path) -> float:
    runs = {g: sampled(args, engine_dir, g, tmp / f"{label}-{g}.txt") for g in (True, False)}
    (held, where), (every, _) = (in_round(tmp / f"{label}-{g}.txt") for g in (True, False))
    n = args.rounds - 1
    cpu = sum(runs[False]["cpu"]) / n
    wall = sum(runs[False]["wall"]) / n
    share = held / max(every, 1)
    print(f"  {label}: rounds 2-{args.rounds}: GIL held in {held} of the round's {every} samples"
          f" ({share:.0%}), {held / args.rate / n:.3f} s a round; round CPU {cpu:.3f} s, wall "
          f"{wall:.3f} s (sampled)")  # fmt: skip
    for frame, k in where.most_common(args.top):
        print(f"    {k:5d} {k / max(held, 1):5.1%} {frame}")
    return held / args.rate / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--against", metavar="REV", help="also sample the sync/ of this revision")
    ap.add_argument("--engine", metavar="REV", help="the new engine from this revision")
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples a second")
    ap.add_argument("--top", type=int, default=8, help="engine lines listed per engine")
    ap.add_argument("--py-spy", default="py-spy", help="the py-spy executable")
    ap.add_argument("--native", action="store_true",
                    help="native frames too (py-spy stops the process at each sample)")  # fmt: skip
    ss.add_worker_args(ap)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    print(f"{ss.spec(args.hosts)}, 16 peers, rounds 2-{args.rounds}, py-spy at {args.rate}/s")
    with tempfile.TemporaryDirectory() as tmp:
        cur = ss.export(args.engine, ss._dir(Path(tmp), "new")) if args.engine else None
        new = report("new", args, cur, Path(tmp))
        if args.against:
            old_dir = ss.export(args.against, ss._dir(Path(tmp), "old"))
            old = report(args.against, args, old_dir, Path(tmp))
            print(f"  GIL held a round {args.against}/new: {old / max(new, 1e-9):.1f}x")


if __name__ == "__main__":
    main()
