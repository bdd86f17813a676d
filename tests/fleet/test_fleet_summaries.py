"""Summaries, in process: the simulator's windows (256 hosts, a loss and a delay fault) split
into partitions as shards see them, summarized per batch, merged, and handed to the engines
give the same verdicts and decisions as the raw windows, and the same clock models: the solve
reads each directed pair's hull, its reference time included (``HuygensSync._prior``), which
is what a summary carries (0.01 ns apart: the order of floating-point sums; the bound, 0.1
ns, is far below the 5 ns a reference time over every flow's hull points moved them)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from fleet_helpers import DELAY, LOSS, Run, host_batches, partition_of, same_clocks, simulate
from fleetlens.api import summaries
from fleetlens.sync import HuygensSync
from fleetlens.sync.config import SyncConfig
from fleetlens.sync.pooling import HullPool
from fleetlens.sync.purity import hull_points
from fleetlens.triangulate import Triangulator, decisions

from fleetlens.batch import META_BATCH_ID, META_HOST_ID, Batch, BatchError
from fleetlens.records import WINDOW_SCHEMA, Verdict

SHARDS = 3


@pytest.fixture(scope="module")
def run() -> Run:
    return simulate()


def shard_summaries(run: Run, window: pa.Table) -> list[pa.Table]:
    """Each of 3 shards' summaries of one window: one per batch of the hosts it owns."""
    leaves = sorted(set(partition_of(run.topo).values()))
    owner = {leaf: i % SHARDS for i, leaf in enumerate(leaves)}
    part = partition_of(run.topo)
    per: list[list[pa.Table]] = [[] for _ in range(SHARDS)]
    for i, (host, rows) in enumerate(host_batches(window)):
        s = summaries.of_batch(part[host], Batch(f"b{i}", host, rows))
        [(msg_id, body)] = summaries.encode([s])  # through the wire format
        [back] = summaries.decode(body)
        assert msg_id == back.summary_id == f"b{i}" and back.partition == part[host]
        per[owner[part[host]]].append(back.windows)
    return [summaries.merge(p) for p in per]


def pair_hulls(t: pa.Table) -> dict[tuple[str, str], list[tuple[int, int]]]:
    pts = hull_points(t)
    red = HullPool(SyncConfig()).window_hulls(pts)
    out: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for a, b, x, y in zip(red.src, red.dst, red.t_raw, red.owd_raw, strict=True):
        out.setdefault((pts.nics[a], pts.nics[b]), []).append((int(x), int(y)))
    return out


def test_merge_is_exact_for_hulls_and_flows(run: Run) -> None:
    window = run.windows[2]
    merged = summaries.merge(shard_summaries(run, window))
    assert merged.num_rows == window.num_rows
    assert pair_hulls(merged) == pair_hulls(window)
    order = [(k, "ascending") for k in ("src_nic", "dst_nic", "sport")]
    cols = list(summaries.TRIANGULATION_COLUMNS)
    assert merged.select(cols).sort_by(order).equals(window.select(cols).sort_by(order))
    # merging merged summaries changes nothing (the hull of hulls)
    again = summaries.merge([merged.slice(0, 1000), merged.slice(1000)])
    assert pair_hulls(again) == pair_hulls(window)


def test_a_groups_summaries_are_each_batchs_own(run: Run) -> None:
    """A shard summarizes a commit group in one pass (:func:`summaries.of_batches`): each
    batch's summary is exactly its own, also in a group of two windows, and so is each one
    read off the group's messages, whatever the messages' size limit splits them into."""
    batches = [
        Batch(f"b{w}-{i}", host, rows)
        for w in (1, 2)
        for i, (host, rows) in enumerate(host_batches(run.windows[w]))
    ]
    batches = batches[5:] + batches[:5]  # a group mixing the two generations
    own = [summaries.of_batch("p", b).windows for b in batches]
    made = summaries.of_batches("p", batches)
    assert [s.summary_id for s in made] == [b.batch_id for b in batches]
    assert all(s.windows.equals(o) for s, o in zip(made, own, strict=True))
    counts = []
    for limit in (summaries.MAX_MESSAGE, 60_000):
        messages = summaries.encode(made, limit)
        per = [summaries.decode(body) for _, body in messages]
        counts.append(len(messages))
        assert all(len(body) <= limit for _, body in messages if len(summaries.decode(body)) > 1)
        assert [i for i, _ in messages] == [
            g[0].summary_id if len(g) == 1 else i for (i, _), g in zip(messages, per, strict=True)
        ]
        wire = [s for g in per for s in g]
        assert [s.summary_id for s in wire] == [b.batch_id for b in batches]
        for s, b, o in zip(wire, batches, own, strict=True):
            assert s.host_id == b.host_id and s.windows.equals(o), b.batch_id
            assert s.nics is not None and sorted(s.nics[0]) == sorted(
                set(b.windows["src_nic"].to_pylist())
            )
            end = pc.max(pc.add(b.windows["start_ns"], b.windows["duration_ns"])).as_py()
            assert s.window_end == end
    # 16 summaries to a message at the server's default limit; split where it is smaller
    assert counts[0] == -(-len(batches) // summaries.PER_MESSAGE) < counts[1]


@pytest.mark.parametrize(
    "listed",
    [b"not json", b"{}", b"[]", b'[["a","h1",1]]', b'[["a","h1",-1],["b","h2",99999]]',
     b'[["a b","h1",0]]', b'[["a","h/1",0]]', b'[["a","h1",0],["a","h1",0]]',
     b'[["a","h1",true]]'],
)  # fmt: skip
def test_a_message_with_a_bad_list_of_summaries_is_refused(run: Run, listed: bytes) -> None:
    """The list a message gives of its summaries is checked: JSON ``[[id, host, rows], ...]``,
    well-formed ids and hosts, distinct ids, row counts adding up to the message's rows."""
    host, rows = next(host_batches(run.windows[1]))
    table = summaries.of_batch("p", Batch("a", host, rows)).windows
    meta = {META_BATCH_ID: b"g-1", META_HOST_ID: host.encode(),
            summaries.META_PARTITION: b"p", summaries.META_GROUP: listed}  # fmt: skip
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema.with_metadata(meta)) as w:
        w.write_table(table)
    with pytest.raises(BatchError) as e:
        summaries.decode(sink.getvalue().to_pybytes())
    assert e.value.field.startswith("batches")


def test_engines_agree_on_summaries(run: Run) -> None:
    raw_tri, sum_tri = Triangulator(run.topo), Triangulator(run.topo)
    raw_sync, sum_sync = HuygensSync(), HuygensSync()
    raw_v: dict[str, Verdict] = {}
    sum_v: dict[str, Verdict] = {}
    worst = 0.0
    looked: list[pa.Table] = []
    for i, window in enumerate(run.windows):
        merged = summaries.merge(shard_summaries(run, window))
        looked = [*looked[-1:], merged]
        raw_look = pa.concat_tables(run.windows[max(i - 1, 0) : i + 1])
        a, b = raw_sync(raw_look, run.topo, {}), sum_sync(pa.concat_tables(looked), run.topo, {})
        end = pc.max(window["start_ns"]).as_py()
        worst = max(worst, same_clocks(a, b, end, 0.1))
        va = raw_tri(window, run.topo, raw_v)
        vb = sum_tri(merged.select(WINDOW_SCHEMA.names), run.topo, sum_v)
        raw_v, sum_v = {v.subject: v for v in va}, {v.subject: v for v in vb}
        assert raw_v == sum_v
        assert decisions(va, run.topo, end) == decisions(vb, run.topo, end)
    assert sum(m.synced for m in b) >= 0.9 * len(b)  # the models compared are solved ones
    faulty = {s for s, v in raw_v.items() if v.state == "faulty" and v.kind == "link"}
    assert LOSS in faulty and DELAY in faulty, faulty  # and both found by the engine
    assert faulty <= run.faulty | {s for s, v in raw_v.items() if v.group_size > 1}
    print(f"clock models: largest difference {worst:.2f} ns")


def test_a_bad_frame_is_refused(run: Run) -> None:
    """A message's zstd frame is checked: the stream length it claims (bounded), and a frame
    that does not decompress to exactly that."""
    host, rows = next(host_batches(run.windows[1]))
    [(_, body)] = summaries.encode([summaries.of_batch("p", Batch("a", host, rows))])
    magic, size, frame = body[:4], int.from_bytes(body[4:12], "little"), body[12:]
    assert len(summaries.decode(body)) == 1
    for bad in (
        magic + (summaries.MAX_STREAM + 1).to_bytes(8, "little") + frame,
        magic + (size + 1).to_bytes(8, "little") + frame,
        magic + size.to_bytes(8, "little") + frame[:-9],
        magic + size.to_bytes(8, "little") + b"garbage",
        magic + b"\x01",
    ):
        with pytest.raises(BatchError) as e:
            summaries.decode(bad)
        assert e.value.field == "body"
