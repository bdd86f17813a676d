"""The per-window summary a collector shard publishes to the fleet tier, and its merging.

A summary is a ``WINDOW_SCHEMA`` table holding what the two engines read of the windows, and
nothing else:

- **Clock sync** reads, per window generation, each directed NIC pair's lower hull of the
  ``(t, owd_raw)`` points of all its flows (``fleetlens.sync``: ``hull_points(..., reduce=True)``
  reduces the flows' hulls to that before any fit). A summary carries that pair hull once, on
  the pair's first row (its ``pure`` is the pair's total, the other rows' hulls are empty and
  their ``pure`` 0, so the solve drops them as having no pure pair). The hull of a union is
  the hull of the parts' hulls, so summarizing a union of summaries (:func:`merge`) gives the
  hulls of the union of the raw windows: merging shards is exact.
- **Triangulation** keeps per-flow state (``fleetlens.triangulate.Triangulator``: per-flow
  delay baselines, decayed per-flow loss counts, remembered paths, NIC sending rates counted
  in flow rows, flow labels as evidence), so per-link sums of the clean flows would change its
  answers: a summary keeps every flow row, narrowed to the columns it reads
  (:data:`TRIANGULATION_COLUMNS`). The OWD statistics other than the minimum (the shards'
  OWD histograms) are null.

``ts_source`` stays on every row: the solve reads the window's kinds of stamps from all rows.

The solve's reference time is the median of the pair hulls' points (``HuygensSync._prior``),
and every fit, the soft-margin fits of overlapping edges included, reads only the pair hulls,
so a summary gives the models of the raw windows (256 simulated hosts, 10 windows: 0.01 ns
apart, the order of floating-point sums). Triangulation is exact.

On the wire (NATS, ``fleet*.py``) there is one summary per committed batch (one host's
window), whose id is the batch's, and a message carries several of one partition
(:func:`encode`, :func:`decode`): an Arrow IPC stream of their rows one after the other, the
partition and the list of ``[id, host, rows]`` in the schema metadata (a message of one
summary has its id and host there instead), in one zstd frame. The tier's cost is per
message as much as per row (reading the stream, the context-free checks), so a commit group
goes in a few messages, not one per batch. A message's id is its summary's, or a hash of
its summaries' ids; a shard that commits a batch again after a restart may group it
differently, so the fleet tier's store of batch ids is what drops a summary stored before
(JetStream's duplicate window drops a message published again as it was).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fleetlens.sync.purity import hull_points

from fleetlens.batch import (
    CT_ARROW,
    META_BATCH_ID,
    META_HOST_ID,
    Batch,
    BatchError,
    check_host,
    check_id,
    decode_batch,
)
from fleetlens.records import HULLS, WINDOW_SCHEMA

# What triangulation reads of a flow row (triangulate/paths.py, api/clockgate.py, settling.py).
TRIANGULATION_COLUMNS = (
    "src_nic", "dst_nic", "sport", "start_ns", "duration_ns", "sent", "received",
    "owd_min_ns", "path", "acks_lost",
)  # fmt: skip
# What clock sync reads besides (purity.py, solver._ts_kind); the hulls once per pair.
CLOCK_COLUMNS = ("pure", "ts_source", *HULLS)
DROPPED = tuple(n for n in WINDOW_SCHEMA.names if n not in TRIANGULATION_COLUMNS + CLOCK_COLUMNS)
META_PARTITION = b"fleetlens.partition"
META_GROUP = b"fleetlens.batches"  # a message of several summaries: [[id, host, rows], ...]
# Summaries a message carries: a shard's commit group in a few messages, each under the NATS
# server's default max_payload (1 MiB) at the reference shape; halved where one is not.
PER_MESSAGE = 16
MAX_MESSAGE = 1 << 20
# NIC ids, paths and their link ids repeat row after row and summary after summary: a message
# is its IPC stream in one zstd frame (level 1), behind a magic and the stream's length. One
# frame compresses across buffers and summaries in one codec call, where Arrow's compressed
# IPC makes one per buffer (figures: docs/figures.md, bench/summary_size.py).
_FRAME = b"FLZ\x01"
_ZSTD = pa.Codec("zstd", compression_level=1)
MAX_STREAM = 64 << 20  # the largest stream a frame may claim (a message is <= max_payload)
_PARTITION_RE = re.compile(r"[A-Za-z0-9._\-]{1,64}")  # a NATS subject token


def summarize(windows: pa.Table) -> pa.Table:
    """The summary of windows (``WINDOW_SCHEMA`` rows of any generations, raw or summaries),
    row for row in their order."""
    rows = windows.select(WINDOW_SCHEMA.names).cast(WINDOW_SCHEMA)
    if not rows.num_rows:
        return rows
    start = pc.dictionary_encode(rows["start_ns"], null_encoding="encode").combine_chunks()
    gen = start.indices.to_numpy()
    if not gen.any():
        return _one_generation(rows)
    at = [np.flatnonzero(gen == g) for g in range(int(gen.max()) + 1)]
    parts = pa.concat_tables([_one_generation(rows.take(i)) for i in at])
    return parts.take(np.argsort(np.concatenate(at), kind="stable"))


def of_batches(partition: str, batches: Sequence[Batch]) -> list[Summary]:
    """Each batch's summary, made in one pass over them all (a shard's commit group): one
    pass costs a fraction of one per batch, whose fixed cost dominates at ~1,000 rows.

    A directed pair's flows are all its sender's, so with one batch per host and window (as
    agents send) a pair's rows lie in one batch, and the summary of the batches together, cut
    at their bounds, is each one's :func:`of_batch` (tested). Where two batches hold rows of
    one pair and generation, its hull rides on its first row only: their union summarizes
    the same, which is all the fleet tier reads (:func:`merge`)."""
    if not batches:
        return []
    whole = summarize(pa.concat_tables([b.windows for b in batches]))
    bounds = np.cumsum([0, *(b.windows.num_rows for b in batches)])
    return [
        Summary(b.batch_id, partition, b.host_id, whole.slice(a, n - a))
        for b, a, n in zip(batches, bounds[:-1], bounds[1:], strict=True)
    ]


def merge(parts: list[pa.Table]) -> pa.Table:
    """Summaries (of disjoint batches, e.g. from several shards) merged into one."""
    return summarize(pa.concat_tables([p.select(WINDOW_SCHEMA.names) for p in parts]))


def _one_generation(rows: pa.Table) -> pa.Table:
    """One window generation's rows: each directed pair's hull on its first row."""
    pts = hull_points(rows, reduce=True)  # the solve's own reduction, pairs in code order
    n = max(len(pts.nics), 1)
    code, t, y = pts.src * n + pts.dst, pts.t_raw, pts.owd_raw
    pairs, first, sizes = np.unique(code, return_index=True, return_counts=True)
    row_code = _row_codes(rows, pts.nics, n)
    # Each pair's carrier: its first row (rows of a pair the solve drops carry nothing).
    seen, carrier = np.unique(row_code, return_index=True)
    on = seen >= 0
    seen, carrier = seen[on], carrier[on]
    pair_of = np.searchsorted(pairs, seen)
    has = (pair_of < pairs.size) & (pairs[np.minimum(pair_of, pairs.size - 1)] == seen)
    carrier, pair_of = carrier[has], pair_of[has]
    size = np.zeros(rows.num_rows, np.int64)
    size[carrier] = sizes[pair_of]
    by_row = np.argsort(carrier)
    take = _ranges(first[pair_of[by_row]], sizes[pair_of[by_row]])
    offsets = pa.array(np.r_[0, np.cumsum(size)].astype(np.int32))
    pure = pc.fill_null(rows["pure"], 0).to_numpy().astype(np.int64)
    kept = row_code >= 0
    pair_pure = np.bincount(np.searchsorted(seen, row_code[kept]), pure[kept], seen.size)
    new_pure = np.zeros(rows.num_rows, np.int64)
    new_pure[carrier] = pair_pure[np.searchsorted(seen, row_code[carrier])]
    out = rows
    for name in DROPPED:
        out = _set(out, name, pa.nulls(rows.num_rows, WINDOW_SCHEMA.field(name).type))
    out = _set(out, "pure", pa.array(new_pure, pa.int32()))
    out = _set(out, "hull_t_ns", pa.ListArray.from_arrays(offsets, pa.array(t[take])))
    return _set(out, "hull_owd_ns", pa.ListArray.from_arrays(offsets, pa.array(y[take])))


def _row_codes(rows: pa.Table, nics: list[str], n: int) -> np.ndarray:
    """Per row, its directed pair's code ``src·n + dst`` in the solve's NIC numbering (-1: a
    NIC the solve dropped)."""
    value_set = pa.array(nics, pa.string())
    src = pc.fill_null(pc.index_in(rows["src_nic"], value_set=value_set), -1).to_numpy()
    dst = pc.fill_null(pc.index_in(rows["dst_nic"], value_set=value_set), -1).to_numpy()
    src, dst = src.astype(np.int64), dst.astype(np.int64)
    return np.where((src >= 0) & (dst >= 0), src * n + dst, -1)


def _ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The concatenated index ranges ``[s, s + k)`` (vectorized)."""
    total = int(sizes.sum())
    if not total:
        return np.zeros(0, np.int64)
    base = np.repeat(starts - np.r_[0, np.cumsum(sizes)[:-1]], sizes)
    return base + np.arange(total)


def _set(table: pa.Table, name: str, col: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), WINDOW_SCHEMA.field(name), col)


# ---- the wire ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Summary:
    """One committed batch's summary: its id is the batch's. ``nics`` and ``window_end`` are
    what decoding found of its rows (:class:`fleetlens.batch.Batch`: the tier's checks reuse
    them instead of asking Arrow per batch)."""

    summary_id: str
    partition: str
    host_id: str
    windows: pa.Table  # the summary rows (WINDOW_SCHEMA)
    nics: tuple[list[str], list[str]] | None = None
    window_end: int | None = None

    def batch(self) -> Batch:
        """As the fleet tier's writer stores it (batch id: the summary's)."""
        return Batch(self.summary_id, self.host_id, self.windows, self.nics, self.window_end)


def of_batch(partition: str, batch: Batch) -> Summary:
    return Summary(batch.batch_id, partition, batch.host_id, summarize(batch.windows))


def encode(group: Sequence[Summary], max_bytes: int = MAX_MESSAGE) -> list[tuple[str, bytes]]:
    """Messages ``(message id, body)`` carrying one partition's summaries, several to a
    message (:data:`PER_MESSAGE`, fewer where a body would exceed ``max_bytes``: the NATS
    server's ``max_payload``). A message of one summary has the summary's id; of several,
    ``g-`` and a hash of their ids (a republished group is the same message)."""
    out: list[tuple[str, bytes]] = []
    for k in range(0, len(group), PER_MESSAGE):
        out.extend(_messages(group[k : k + PER_MESSAGE], max_bytes))
    return out


def _messages(group: Sequence[Summary], max_bytes: int) -> list[tuple[str, bytes]]:
    if len({s.partition for s in group}) > 1:
        raise ValueError("a message carries one partition's summaries")
    first = group[0]
    msg_id = first.summary_id
    meta = {META_HOST_ID: first.host_id.encode(), META_PARTITION: first.partition.encode()}
    if len(group) > 1:
        parts = [[s.summary_id, s.host_id, s.windows.num_rows] for s in group]
        meta[META_GROUP] = json.dumps(parts, separators=(",", ":")).encode()
        msg_id = "g-" + hashlib.sha1("\n".join(p[0] for p in parts).encode()).hexdigest()
    meta[META_BATCH_ID] = msg_id.encode()
    table = pa.concat_tables([s.windows.select(WINDOW_SCHEMA.names) for s in group])
    table = table.cast(WINDOW_SCHEMA).replace_schema_metadata(meta)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    stream = sink.getvalue()
    body = _FRAME + stream.size.to_bytes(8, "little") + _ZSTD.compress(stream, asbytes=True)
    if len(body) > max_bytes and len(group) > 1:
        half = len(group) // 2
        return _messages(group[:half], max_bytes) + _messages(group[half:], max_bytes)
    return [(msg_id, body)]


def decode(body: bytes) -> list[Summary]:
    """The summaries of a message, checked as an ingest body is (ids, types, counts, hull
    lengths; ``fleetlens.batch.decode_batch``) over all its rows at once, and its list of
    summaries (ids, hosts, row counts that add up); raises ``BatchError``. The checks that
    need the fleet tier's state (every row from its summary's host, known NICs) are its own."""
    stream = _unframed(body)
    whole = decode_batch(stream, CT_ARROW)
    meta = pa.ipc.open_stream(stream).schema.metadata or {}  # the schema message alone
    partition = meta.get(META_PARTITION, b"").decode("utf-8", "replace")
    if not _PARTITION_RE.fullmatch(partition):
        raise BatchError("partition", f"missing or malformed ({partition!r})")
    if META_GROUP not in meta:
        return [Summary(whole.batch_id, partition, whole.host_id, whole.windows, whole.nics,
                        whole.window_end)]  # fmt: skip
    parts = _group_list(meta[META_GROUP], whole.rows)
    bounds = np.cumsum([0, *(n for _, _, n in parts)])
    src, dst = (_nics_per_part(whole.windows[c], bounds) for c in ("src_nic", "dst_nic"))
    ends = _ends_per_part(whole.windows, bounds)
    return [
        Summary(i, partition, h, whole.windows.slice(a, n), (s, d), e)
        for (i, h, n), a, s, d, e in zip(parts, bounds[:-1], src, dst, ends, strict=True)
    ]


def _unframed(body: bytes) -> bytes:
    """The IPC stream of a message: its zstd frame decompressed (a body without the frame's
    magic is a stream as it is: a shard of an earlier release)."""
    if not body.startswith(_FRAME):
        return body
    size = int.from_bytes(body[len(_FRAME) : len(_FRAME) + 8], "little")
    if size > MAX_STREAM:
        raise BatchError("body", f"claims a {size}-byte stream, over {MAX_STREAM}", "decode")
    try:
        return _ZSTD.decompress(body[len(_FRAME) + 8 :], decompressed_size=size, asbytes=True)
    except (OSError, pa.ArrowException) as e:
        raise BatchError("body", f"not a zstd frame of {size} bytes: {e}", "decode") from e


def _group_list(raw: bytes, rows: int) -> list[tuple[str, str, int]]:
    """A message's list of ``[summary id, host, rows]``, checked: ids and hosts well formed,
    ids distinct, row counts that add up to the message's rows."""
    try:
        parts = json.loads(raw)
    except ValueError as e:
        raise BatchError("batches", f"not JSON: {e}", "decode") from e
    if not isinstance(parts, list) or not parts:
        raise BatchError("batches", "want a non-empty list of [id, host, rows]", "decode")
    out = []
    for k, p in enumerate(parts):
        if not (isinstance(p, list) and len(p) == 3 and type(p[2]) is int and p[2] >= 0):
            raise BatchError("batches", f"want [id, host, rows], got {p!r}", "decode")
        out.append(
            (check_id(f"batches[{k}] id", p[0]), check_host(f"batches[{k}] host", p[1]), p[2])
        )
    if len({i for i, _, _ in out}) < len(out):
        raise BatchError("batches", "an id is listed twice", "decode")
    if sum(n for _, _, n in out) != rows:
        raise BatchError("batches", f"row counts do not add up to the message's {rows}", "decode")
    return out


def _nics_per_part(col: pa.ChunkedArray, bounds: np.ndarray) -> list[list[str]]:
    """The distinct NIC ids of each part's rows (one dictionary encoding of the column)."""
    enc = pc.dictionary_encode(col).combine_chunks()
    names = np.asarray(enc.dictionary.to_pylist(), dtype=object)
    codes = enc.indices.to_numpy()
    return [names[np.unique(codes[a:b])].tolist() for a, b in itertools.pairwise(bounds)]


def _ends_per_part(t: pa.Table, bounds: np.ndarray) -> list[int | None]:
    """Each part's largest ``start_ns + duration_ns`` (None: no rows)."""
    end = t["start_ns"].to_numpy() + t["duration_ns"].to_numpy()
    return [int(end[a:b].max()) if b > a else None for a, b in itertools.pairwise(bounds)]
