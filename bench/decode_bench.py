"""Ingest decoding (``fleetlens.batch.decode_batch``: the Arrow read and the context-free
checks), this tree against a git revision's, side by side in one process (issue 29 point 2).

    .venv/bin/python bench/decode_bench.py --against main --hosts 256,128

The revision's ``fleetlens/batch.py`` is loaded from git under another module name (it needs
only ``fleetlens.records``, the same here), so both decoders run on the same bodies in the
same interpreter, alternated ``--repeat`` times: CPU microseconds per batch of each (the
median of the rounds) and their ratio. The bodies are the cached agent batches of
``bench/realtime.py`` (``--cache``; one ~910-row Arrow IPC batch per host of a window).

Before timing, both decoders, each followed by its revision's collector checks
(``api/checks.py``: own host, known NICs, not from the future), get the same inputs and must
agree on every one (printed: identical / different): every cached batch, and hostile variants
of them (a bad value in two random rows of each column, in Arrow, msgpack and JSON, among
them every bad value of the batch and ingest tests; two faults at once; truncated bodies;
random bits flipped). Agreeing means the same batch and host ids, equal tables (schema and
values) and the same distinct NIC ids, or the same error (type, field, message, reason).
A body whose variable-size column has offsets that do not ascend is only given to this tree's
decoder: the revision's (``main`` before this change) reads through them and crashes the
process (``--crash-demo`` shows it in a child process).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import msgpack
import numpy as np
import pyarrow as pa
from fleetlens.api import checks

from fleetlens import batch as this
from fleetlens.batch import CT_ARROW, CT_JSON, CT_MSGPACK, META_BATCH_ID, META_HOST_ID
from fleetlens.records import WINDOW_SCHEMA

ROOT = Path(__file__).resolve().parent.parent
Decode = Callable[[bytes, str], object]


def revision_module(rev: str, path: str, name: str) -> types.ModuleType:
    """The file ``path`` as it is at ``rev``, imported as ``name``."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up
    exec(compile(src, f"{rev}:{path}", "exec"), mod.__dict__)
    return mod


def revision_batch(rev: str) -> types.ModuleType:
    return revision_module(rev, "fleetlens/batch.py", "batch_at_rev")


def cached_bodies(cache: Path, hosts: int, window: int) -> list[bytes]:
    d = next(cache.glob(f"h{hosts}-n*"))
    index = np.load(d / f"w{window:03d}.npy")
    raw = (d / f"w{window:03d}.bin").read_bytes()
    return [raw[o : o + n] for o, n, *_ in index]


# ---- what both decoders must agree on ----------------------------------------------------
Check = Callable[[object], None]


def outcome(decode: Decode, check: Check, body: bytes, ctype: str) -> tuple:
    """What decoding and the collector's checks gave: the batch (ids, table, NIC ids) or the
    error."""
    try:
        b = decode(body, ctype)
        check(b)
    except Exception as e:  # any error is an outcome to compare
        return ("error", type(e).__name__, getattr(e, "field", None), str(e),
                getattr(e, "reason", None))  # fmt: skip
    t = b.windows  # type: ignore[attr-defined]
    nics = b.nics  # type: ignore[attr-defined]
    return ("ok", b.batch_id, b.host_id, t.schema, t, nics and tuple(map(tuple, nics)))  # type: ignore[attr-defined]


def checks_of(module: types.ModuleType, known: frozenset[str]) -> Check:
    """The collector's checks (``api/checks.py``'s ``check_batch``) against ``known`` NICs,
    now, with the default 5 s of allowed clock skew."""
    now = time.time_ns()
    return lambda b: module.check_batch(b, known, now, 5 * 10**9)


def same(a: tuple, b: tuple) -> bool:
    if a[0] != b[0] or a[0] == "error":
        return a == b
    return a[1:4] == b[1:4] and a[4].equals(b[4]) and a[5] == b[5]


# A bad value for a column (None: null), and the formats that can carry it.
BAD: dict[str, list[object]] = {
    "src_nic": [None, "h01", "not a nic", "h999/eth0", "\u00e9/eth0"],
    "dst_nic": [None, "h01/eth0\n", "h01/eth0/x", "h01/" + "e" * 33, "h999/eth0", "@same"],
    "sport": [None, 0, 70000, -1, 1.5, True],
    "start_ns": [None, -5, 2**70, "soon", "@future"],
    "duration_ns": [None, 0, -1],
    "sent": [None, -1, "many", 0],
    "received": [None, -1, 10**6],
    "pure": [None, -3],
    "acks_lost": [None, -1, 10**6],
    "owd_min_ns": [None, math.nan, math.inf, 1e12],
    "owd_p50_ns": [None, math.nan, -math.inf, 0.0],
    "owd_p99_ns": [None, math.nan, 0.0],
    "owd_max_ns": [None, math.inf, 0.0],
    "hull_t_ns": [None, [], [1, None], [1]],
    "hull_owd_ns": [None, [], [None], [1, 2, 3, 4, 5]],
    "ts_source": [None, "sundial", "hardware", ""],
    "path": [None, [], [None], "leaf0->spine0", ["a->b"]],
}


def _value(v: object, row: dict) -> object:
    if v == "@same":
        return row["src_nic"]
    return time.time_ns() + 3600 * 10**9 if v == "@future" else v


def variants(body: bytes, rng: np.random.Generator) -> Iterator[tuple[str, bytes, str]]:
    """Hostile variants of one agent body: (what, body, content type)."""
    rb = pa.ipc.open_stream(body).read_next_batch()
    meta = rb.schema.metadata or {}
    bid, host = meta[META_BATCH_ID].decode(), meta[META_HOST_ID].decode()
    rows = pa.Table.from_batches([rb]).to_pylist()
    for name, values in BAD.items():
        for v in values:
            changed = [dict(r) for r in rows]
            for _ in range(2):  # the same fault in two random rows
                r = changed[int(rng.integers(len(changed)))]
                r[name] = _value(v, r)
            yield from _encoded(f"{name}={v!r}", bid, host, changed)
    for _ in range(20):  # two faults at once: the first in the checks' order is reported
        changed = [dict(r) for r in rows]
        for name in rng.choice(list(BAD), 2, replace=False):
            r = changed[int(rng.integers(len(changed)))]
            r[name] = _value(BAD[name][int(rng.integers(len(BAD[name])))], r)
        yield from _encoded("two faults", bid, host, changed)
    for cut in (0, 7, len(body) // 3, len(body) // 2, len(body) - 40, len(body) - 1):
        yield f"truncated at {cut}", body[:cut], CT_ARROW
    for k in (1, 4, 32):
        for _ in range(10):
            b = bytearray(body)
            for at in rng.integers(len(b), size=k):
                b[at] ^= 1 << int(rng.integers(8))
            yield f"{k} bits flipped", bytes(b), CT_ARROW
    yield "garbage", bytes(rng.integers(256, size=512, dtype=np.uint8)), CT_ARROW


def _encoded(what: str, bid: str, host: str, rows: list[dict]) -> Iterator[tuple[str, bytes, str]]:
    doc = {"batch_id": bid, "host_id": host, "windows": rows}
    yield what + " (json)", json.dumps(doc).encode(), CT_JSON
    cols = {k: [r[k] for r in rows] for k in rows[0]}
    with contextlib.suppress(OverflowError):  # msgpack carries integers of 64 bits at most
        yield what + " (msgpack)", msgpack.packb({"batch_id": bid, "host_id": host,
                                                  "columns": cols}), CT_MSGPACK  # fmt: skip
    try:
        t = pa.Table.from_pylist(rows, WINDOW_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return  # a value Arrow's column type cannot carry
    t = t.replace_schema_metadata({META_BATCH_ID: bid, META_HOST_ID: host})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    yield what + " (arrow)", sink.getvalue().to_pybytes(), CT_ARROW


def _offsets_broken(body: bytes) -> bool:
    """Whether this tree refuses the body for offsets that do not ascend (the revision's
    decoder would read through them)."""
    try:
        this.decode_batch(body, CT_ARROW)
    except this.BatchError as e:
        return "offsets not ascending" in e.message
    return False


def agreement(old: tuple[Decode, Check], new: tuple[Decode, Check], bodies: list[bytes],
              seed: int) -> tuple[int, int, int, list[str]]:  # fmt: skip
    """(inputs, identical, skipped for broken offsets, the differences' descriptions)."""
    rng = np.random.default_rng(seed)
    cases = [("agent batch", b, CT_ARROW) for b in bodies]
    for b in bodies[:3]:
        cases += list(variants(b, rng))
    n = equal = skipped = 0
    diffs = []
    for what, body, ctype in cases:
        if ctype == CT_ARROW and _offsets_broken(body):
            skipped += 1
            continue
        n += 1
        a, b = outcome(*old, body, ctype), outcome(*new, body, ctype)
        if same(a, b):
            equal += 1
        else:
            diffs.append(f"{what}: {a[:4] if a[0] == 'error' else a[:3]} / "
                         f"{b[:4] if b[0] == 'error' else b[:3]}")  # fmt: skip
    return n, equal, skipped, diffs


# ---- cost ----------------------------------------------------------------------------------
def cost_us(decode: Decode, bodies: list[bytes]) -> float:
    """CPU per batch, each body decoded right after it was copied (untimed), as the collector
    decodes a body it has just joined from the socket's chunks: in the CPU's cache."""
    spent = 0.0
    for b in bodies:
        fresh = bytes(bytearray(b))
        t0 = time.process_time()
        decode(fresh, CT_ARROW)
        spent += time.process_time() - t0
    return spent / len(bodies) * 1e6


def wild_offset_body() -> bytes:
    """A small agent body whose ``src_nic`` column has one offset far past its data (Arrow's
    IPC reader checks only the first and the last)."""
    n = 8
    i32 = lambda v: pa.array([v] * n, pa.int32())  # noqa: E731
    t = pa.table({"src_nic": [f"h01/eth{i}" for i in range(n)], "dst_nic": ["h02/eth0"] * n,
                  "sport": i32(1), "start_ns": [0] * n, "duration_ns": [1] * n,
                  "sent": i32(1), "received": i32(1), "pure": i32(1)})  # fmt: skip
    t = t.replace_schema_metadata({META_BATCH_ID: "b", META_HOST_ID: "h01"})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    buf = sink.getvalue()
    col = pa.ipc.open_stream(buf).read_next_batch().column(0)  # zero-copy: views of buf
    body = bytearray(buf.to_pybytes())
    np.frombuffer(body, np.int32, n + 1, col.buffers()[1].address - buf.address)[3] = 10**8
    return bytes(body)


def crash_demo(rev: str) -> None:
    """The wild-offset body decoded by ``rev``'s decoder in a child process, then by this
    tree's."""
    script = (f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r})\n"
              "from decode_bench import revision_batch, wild_offset_body\n"
              f"revision_batch({rev!r}).decode_batch(wild_offset_body(), {CT_ARROW!r})\n"
              "print('accepted')")  # fmt: skip
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    print(f"wild offset  : {rev}: exit code {p.returncode} {p.stdout.strip()}"
          f"{p.stderr.strip()[-160:]}")  # fmt: skip
    try:
        this.decode_batch(wild_offset_body(), CT_ARROW)
        print("               this tree: accepted")
    except this.BatchError as e:
        print(f"               this tree: refused ({e.reason}): {e}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--against", default="main", help="git revision to compare with")
    ap.add_argument("--hosts", default="256,128",
                    help="cached fleets (256: agents before acks_lost, 128: with it)")  # fmt: skip
    ap.add_argument("--cache", type=Path, default=ROOT / "build" / "realtime")
    ap.add_argument("--window", type=int, default=0, help="cached window to read")
    ap.add_argument("--repeat", type=int, default=7, help="alternated rounds of each")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--crash-demo", action="store_true")
    a = ap.parse_args()
    old = revision_batch(a.against)
    old_checks = revision_module(a.against, "api/checks.py", "checks_at_rev")
    for hosts in map(int, a.hosts.split(",")):
        bodies = cached_bodies(a.cache, hosts, a.window)
        decoded = [this.decode_batch(b, CT_ARROW) for b in bodies]
        rows = sum(b.rows for b in decoded) / len(bodies)
        known = frozenset(n for b in decoded for n in b.windows["src_nic"].to_pylist())
        n, equal, skipped, diffs = agreement(
            (old.decode_batch, checks_of(old_checks, known)),
            (this.decode_batch, checks_of(checks, known)),
            bodies,
            a.seed,
        )
        acks = "acks_lost" in pa.ipc.open_stream(bodies[0]).schema.names
        print(f"h{hosts}: {len(bodies)} agent batches of {rows:.0f} rows on average "
              f"({'with' if acks else 'without'} acks_lost); {n} inputs with hostile variants: "
              f"{equal} identical, "
              f"{n - equal} different, {skipped} not given to {a.against} (offsets)")  # fmt: skip
        for d in diffs[:10]:
            print(f"  differs: {d}")
        mine, theirs = [], []
        for _ in range(a.repeat):  # alternated: the box's load drifts
            theirs.append(cost_us(old.decode_batch, bodies))
            mine.append(cost_us(this.decode_batch, bodies))
        m, t = statistics.median(mine), statistics.median(theirs)
        print(f"  decode + context-free checks, CPU per batch (median of {a.repeat}): "
              f"{a.against} {t:.1f} us, this tree {m:.1f} us; ratio this / {a.against} = "
              f"{m / t:.2f}")  # fmt: skip
    if a.crash_demo:
        crash_demo(a.against)
    return 0


if __name__ == "__main__":
    sys.exit(main())
