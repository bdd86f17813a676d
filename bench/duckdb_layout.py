"""DuckDB's CPU per stored agent batch for layouts of the windows table (issue 29 point 2).

    .venv/bin/python bench/duckdb_layout.py --hosts 1024 --seconds 2 --group 128

The collector_bench agents' batches (one ~910-row batch per host per window second) in the
store's layout (``codec.to_storage``), inserted into a bare table of a fresh file in commits of
``--group`` batches, one DuckDB thread, the closing checkpoint counted. Each variant prints its
CPU per batch, its file size and the ratio to the first (DuckDB's defaults):

- ``default``: the file opened directly (122,880-row row groups, checkpoint vacuum on), in
  the layout before the dictionaries: ``path`` a BLOB of packed link indices, NICs and
  ``ts_source`` strings;
- ``no_dicts``: that layout as ``api/store.py`` attaches the file (``ROW_GROUP_ROWS``, no
  vacuum);
- ``path_ids``: ``path`` an int32 id into ``path_dict``, NICs still strings;
- ``store``: the store's layout, ``src_nic``, ``dst_nic``, ``ts_source`` ids too.

The interning itself (``codec.to_storage``) is not timed here: ``collector_bench.py
--stages`` prints it as the storage layout stage.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow as pa
from collector_bench import AGENT_BATCH_ROWS, Fleet, make_batches
from fleetlens.api.codec import NAMED, Dicts, list_to_blob, to_storage
from fleetlens.api.store import ROW_GROUP_ROWS

_SQL = {pa.string(): "VARCHAR", pa.binary(): "BLOB", pa.int32(): "INTEGER",
        pa.int64(): "BIGINT", pa.float64(): "DOUBLE"}  # fmt: skip


def _with(t: pa.Table, cols: dict[str, pa.Array | pa.ChunkedArray]) -> pa.Table:
    for n, col in cols.items():
        t = t.set_column(t.schema.get_field_index(n), n, col)
    return t


def run(work: Path, groups: list[pa.Table], store_like: bool) -> tuple[float, float]:
    """(CPU seconds, file MiB) of inserting ``groups``, one commit each, and closing."""
    db = work / "x.duckdb"
    config = {"threads": 1, "checkpoint_threshold": "256MB"}
    if store_like:
        con = duckdb.connect(config={**config, "max_vacuum_tasks": 0})
        con.execute(f"ATTACH '{db}' AS f (ROW_GROUP_SIZE {ROW_GROUP_ROWS})")
        con.execute("USE f")
    else:
        con = duckdb.connect(str(db), config=config)
    cols = ", ".join(f"{f.name} {_SQL[f.type]}" for f in groups[0].schema)
    con.execute(f"CREATE TABLE w ({cols})")
    t0 = time.process_time()
    for g in groups:
        con.execute("BEGIN")
        con.register("_in", g)
        con.execute("INSERT INTO w SELECT * FROM _in")
        con.unregister("_in")
        con.execute("COMMIT")
    con.close()  # checkpoints: what a commit left in the WAL is compressed now
    cpu = time.process_time() - t0
    size = db.stat().st_size / 2**20
    shutil.rmtree(work)
    work.mkdir()
    return cpu, size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--hosts", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--group", type=int, default=128, help="batches per commit")
    a = ap.parse_args()
    fleet = Fleet(a.hosts)
    n = int(a.seconds * a.hosts)
    batches = make_batches(n * AGENT_BATCH_ROWS, AGENT_BATCH_ROWS, 1, a.hosts, fleet)
    windows = pa.concat_tables([t for _, t in batches])
    dicts = Dicts()
    stored = to_storage([windows], dicts)[0]
    names = {n: windows[n] for n in NAMED}
    blob = list_to_blob(dicts.links.encode(windows["path"])[0])
    no_dicts = _with(stored, {**names, "path": blob})
    variants = {
        "default": (no_dicts, False),
        "no_dicts": (no_dicts, True),
        "path_ids": (_with(stored, names), True),
        "store": (stored, True),
    }
    rows = a.group * AGENT_BATCH_ROWS
    base = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "w"
        work.mkdir()
        for name, (table, store_like) in variants.items():
            groups = [table.slice(i, rows).combine_chunks() for i in range(0, table.num_rows, rows)]
            cpu, size = run(work, groups, store_like)
            per = cpu / n * 1e6
            base = base or per
            print(f"{name:<16} {per:7.0f} us CPU per batch  file {size:6.1f} MiB  ratio to "
                  f"default {per / base:.2f}  ({n} batches, commits of {a.group})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
