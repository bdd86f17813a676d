"""Triangulation cost per window on one core, with peak memory (issue 7 speed targets).

    .venv/bin/python bench/triangulate_speed.py                      # reference leaf-spine
    .venv/bin/python bench/triangulate_speed.py --topo fattree:k=32  # 8192 hosts
    .venv/bin/python bench/triangulate_speed.py --against 1dc2cf8    # also an older engine
    .venv/bin/python bench/triangulate_speed.py --shuffle            # rows in a new order

Simulates a few 1 s windows (paths known, one lossy fabric link), then times the engine on
each (CPU time of this process pinned to one core; the first window also builds the per-flow
state) and, on the same windows, two baselines:

- 007's vote on the same decoded flows (decode + vote over the lossy flows' entries: the
  cheapest thing that localizes anything);
- with ``--against REV``: the engine as it was at git revision REV (its ``triangulate/``
  files extracted into a temporary package), so a speed-up is measured in one command.

Windows hold a row per path (the agents' ``fleetlens.pathgroups``: 0.93 M rows on the
reference fabric); ``--per-port`` gives a row per source port instead (6.0 M rows), as agents
reported before path rows.

``--host-order`` hands them over with the source hosts' blocks in a fresh order every window,
as the collector reads its store (each host's upload is one block, hosts upload in their own
order): the NIC-id columns then differ from the last window's and are looked up row by row.
``--shuffle`` hands every window's rows over in a fresh random order (and other chunks), as a
collector reading its store may: the simulator itself sends each flow pair's rows together,
in the same pair order every window.

The process keeps freed memory in its heap, as the collector does (``fleetlens/heap.py``):
``--fresh-pages`` leaves glibc's defaults, where every window's big arrays are faulted in anew.

Time and memory are measured in separate calls: handing each window to the engine twice
would change its state, so instead every engine gets a twin (same class, same topology) that
sees the same windows under tracemalloc; the timed engine runs with no tracing at all
(tracemalloc hooks every allocation and slowed the engine by 30-40 %). Peak memory is the
twin's tracemalloc peak during its call (numpy buffers included, Arrow buffers not).
``--no-memory`` skips the twins.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).parent))
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator
from fleetlens.triangulate.engine import Triangulator
from fleetlens.triangulate.paths import PathModel
from triangulate_baselines import vote_007

from fleetlens.heap import keep_freed_memory
from fleetlens.records import WINDOW_SCHEMA
from fleetlens.topology import from_spec

REFERENCE = "leafspine:hosts=1024,nics=8,leaves=32,spines=8"
REPO = Path(__file__).resolve().parent.parent


def old_engine(rev: str, tmp: str):
    """``Triangulator`` class of ``triangulate/`` at git revision ``rev`` (a ``.pyx`` that
    differs from this checkout's is built, which needs Cython: ``pip install -e '.[bench]'``)."""
    pkg = Path(tmp) / "tri_at_rev"
    pkg.mkdir()
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:triangulate"], cwd=REPO,
                           check=True, capture_output=True, text=True).stdout.split()  # fmt: skip
    for name in (n for n in names if n.endswith((".py", ".pyx"))):
        src = subprocess.run(["git", "show", f"{rev}:triangulate/{name}"], cwd=REPO,
                             check=True, capture_output=True, text=True).stdout  # fmt: skip
        if name.endswith(".pyx") and src == (REPO / "triangulate" / name).read_text():
            built = Path(importlib.import_module(f"fleetlens.triangulate.{name[:-4]}").__file__)
            shutil.copy(built, pkg / built.name)  # the same source: this checkout's build
            continue
        (pkg / name).write_text(src)
        if name.endswith(".pyx"):
            _build(tmp, f"tri_at_rev.{name[:-4]}", f"tri_at_rev/{name}")
    sys.path.insert(0, tmp)
    return importlib.import_module("tri_at_rev.engine").Triangulator


def _build(cwd: str, module: str, pyx: str) -> None:
    """Cython-build one module in place, with the flags of ``setup.py``."""
    code = (
        "import numpy; from setuptools import Extension, setup; "
        "from Cython.Build import cythonize; "
        f"ext = Extension({module!r}, [{pyx!r}], include_dirs=[numpy.get_include()], "
        "extra_compile_args=['-O2']); "
        "setup(script_args=['build_ext', '--inplace', '-q'], "
        "ext_modules=cythonize([ext], language_level=3, quiet=True))"
    )
    print(f"building {module} ...", flush=True)
    subprocess.run([sys.executable, "-c", code], cwd=cwd, check=True, capture_output=True)


def timed(fn, *args) -> tuple[object, float]:
    """(result, CPU seconds), no tracing."""
    c = time.process_time()
    out = fn(*args)
    return out, time.process_time() - c


def traced_peak(fn, *args) -> float:
    """tracemalloc peak MiB of one call (its CPU time is not used: tracing slows it)."""
    tracemalloc.start()
    fn(*args)
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return peak


def shuffled(t, rng: np.random.Generator):
    """The same rows in a random order, in 64 Ki-row chunks."""
    return _chunked(t.take(rng.permutation(t.num_rows)))


def host_blocks(t, rng: np.random.Generator):
    """The same rows with the source hosts' blocks in a random order, in 64 Ki-row chunks:
    what the collector reads from its store, where each host's upload is one block."""
    host = pc.replace_substring_regex(t["src_nic"], "/.*$", "")
    names, inv = np.unique(host.to_numpy(zero_copy_only=False), return_inverse=True)
    return _chunked(t.take(np.argsort(rng.permutation(names.size)[inv], kind="stable")))


def _chunked(t):
    return pa.Table.from_batches(t.to_batches(max_chunksize=1 << 16), t.schema)


def vote(pm: PathModel, t) -> set[int]:
    f = pm.frame(t)
    lossy = np.flatnonzero(f.lost > 0)
    row, link, w = f.inc.entries(lossy)
    return vote_007(row, link, w, f.sent[lossy], f.lost[lossy], pm.n_links)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topo", default=REFERENCE)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--against", default="", help="git revision of an engine to compare")
    ap.add_argument("--shuffle", action="store_true", help="rows in a random order per window")
    ap.add_argument(
        "--host-order", action="store_true",
        help="source hosts' blocks of rows in a random order per window (as the collector reads)",
    )  # fmt: skip
    ap.add_argument("--per-port", action="store_true", help="a row per source port, not per path")
    ap.add_argument("--no-memory", action="store_true", help="skip the traced twin engines")
    ap.add_argument(
        "--fresh-pages", action="store_true",
        help="leave glibc's default thresholds (big arrays are mmapped and faulted in anew)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    if not args.fresh_pages:
        keep_freed_memory()  # as the collector does
    topo = from_spec(args.topo)
    link = next(lk.id for lk in topo.links if lk.tier == "fabric")
    t0 = time.time()
    cfg = SimConfig(paths_known=True, merge_paths=not args.per_port, faults=(f"{link}:loss=0.01",))
    sim = Simulator(topo, cfg, seed=1)
    print(f"{args.topo}: {len(topo.nics)} NICs, {len(topo.links)} links, {sim.n_flows} flows "
          f"(simulator setup {time.time() - t0:.0f} s)")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        classes = {"engine": Triangulator}
        if args.against:
            classes[f"engine@{args.against}"] = old_engine(args.against, tmp)
        engines = {name: cls(topo) for name, cls in classes.items()}
        twins = {} if args.no_memory else {name: cls(topo) for name, cls in classes.items()}
        pm = PathModel(topo)
        cpu: dict[str, list[float]] = {name: [] for name in [*engines, "007"]}
        peak: dict[str, list[float]] = {name: [] for name in engines}
        for w in sim.stream(args.windows):
            t = w.windows.select(WINDOW_SCHEMA.names)
            if args.shuffle:
                t = shuffled(t, np.random.default_rng(w.index))
            elif args.host_order:
                t = host_blocks(t, np.random.default_rng(w.index))
            line = [f"window {w.index}: {t.num_rows} rows"]
            for name, tri in engines.items():
                verdicts, c = timed(tri, t, topo, {})
                cpu[name].append(c)
                p = traced_peak(twins[name], t, topo, {}) if twins else math.nan
                peak[name].append(p)
                bad = sorted(v.subject for v in verdicts if v.state != "healthy")
                line.append(f"{name} {c:.3f} s CPU, peak {p:.0f} MiB, reported {bad}")
            _, c = timed(vote, pm, t)
            cpu["007"].append(c)
            line.append(f"007 (decode + vote) {c:.2f} s")
            print("; ".join(line), flush=True)
    steady = {name: float(np.median(v[1:] or v)) for name, v in cpu.items()}
    ours = steady["engine"]
    p_steady = max(peak["engine"][1:] or [math.nan])
    print(f"engine per window (steady, one core, no tracing): {ours * 1e3:.0f} ms; first window "
          f"{cpu['engine'][0]:.2f} s; peak memory (traced twin) steady {p_steady:.0f} "
          f"MiB, first window {peak['engine'][0]:.0f} MiB")  # fmt: skip
    for name, s in steady.items():
        if name != "engine":
            print(f"  {name}: {s * 1e3:.0f} ms per window; engine / {name} = {ours / s:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
