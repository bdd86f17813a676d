"""What a shard publishes to the fleet tier per window, against the raw window rows.

    .venv/bin/python bench/summary_size.py                      # 1024 hosts x 8 NICs
    .venv/bin/python bench/summary_size.py --topology leafspine:hosts=64,nics=2,leaves=4,spines=2

One simulated window (the second: the first is partial), one batch per host as the agents
send it. Baseline: the raw batches, Arrow IPC as agents send them (``fleetlens.batch
.encode_batch``); against it: the summaries as shards publish them (a commit group of 64 at
a time, several to a message: ``fleetlens.api.summaries.encode``, zstd buffers), and their
Arrow buffers alone; and the raw batches with zstd buffers too (what compression alone
gives). Printed: rows, bytes per window, bytes per row, the ratio, and the CPU a shard
spends summarizing and encoding a window.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fleetlens.api import summaries
from fleetlens.api.shard import ShardConfig
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator

from fleetlens.batch import Batch, encode_batch
from fleetlens.records import WINDOW_SCHEMA, nic_hosts
from fleetlens.topology import from_spec

FLEET = "leafspine:hosts=1024,nics=8,leaves=32,spines=8"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--topology", default=FLEET)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    topo = from_spec(a.topology)
    sim = Simulator(topo, SimConfig(paths_known=True), seed=a.seed)
    window = list(sim.stream(2))[-1].windows.select(WINDOW_SCHEMA.names)
    hosts = nic_hosts(window["src_nic"])
    order = pc.sort_indices(hosts)
    window, hosts = window.take(order), hosts.take(order)
    raw_b = raw_z = sum_b = sum_arrow = 0
    cpu = 0.0
    names = np.asarray(hosts.to_numpy(zero_copy_only=False), str)
    ends = np.r_[np.flatnonzero(names[1:] != names[:-1]) + 1, names.size]
    start = 0
    batches = []
    for end in ends:
        rows = window.slice(start, int(end) - start)
        host = hosts[start].as_py()
        start = int(end)
        raw_b += len(encode_batch(host, rows, f"b-{host}")[0])
        raw_z += len(_zstd(host, rows))
        batches.append(Batch(f"b-{host}", host, rows))
    for k in range(0, len(batches), ShardConfig.fetch):  # a shard's commit groups
        t0 = time.process_time()
        made = summaries.of_batches("p", batches[k : k + ShardConfig.fetch])
        messages = summaries.encode(made)
        cpu += time.process_time() - t0
        sum_b += sum(len(body) for _, body in messages)
        sum_arrow += sum(s.windows.nbytes for s in made)
    n = window.num_rows
    print(f"topology {a.topology}: {len(ends)} batches, {n} rows in one window")
    print(f"raw batches (baseline): {raw_b / 1e6:8.2f} MB/window  {raw_b / n:6.1f} B/row")
    print(f"raw batches, zstd     : {raw_z / 1e6:8.2f} MB/window  {raw_z / n:6.1f} B/row")
    print(f"summaries (zstd)      : {sum_b / 1e6:8.2f} MB/window  {sum_b / n:6.1f} B/row  "
          f"(Arrow buffers {sum_arrow / 1e6:.2f} MB)")  # fmt: skip
    print(f"ratio summaries/raw   : {sum_b / raw_b:.3f} (raw zstd: {sum_b / raw_z:.3f})")
    print(f"summarize+encode CPU  : {cpu:.2f} s/window ({cpu / len(ends) * 1e3:.2f} ms/batch)")


def _zstd(host: str, rows: pa.Table) -> bytes:
    """The raw batch as the summaries are written (zstd buffers): what compression alone gives."""
    sink = pa.BufferOutputStream()
    table = rows.select(WINDOW_SCHEMA.names).cast(WINDOW_SCHEMA)
    with pa.ipc.new_stream(
        sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")
    ) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


if __name__ == "__main__":
    main()
