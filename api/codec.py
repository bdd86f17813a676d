"""How window rows are laid out in DuckDB, and back.

DuckDB's LIST columns cost more to insert than all other columns together
(``bench/collector_bench.py`` measures the writer both ways). So the three list columns are
stored as BLOBs, converted without a per-row Python loop:

- ``hull_t_ns`` / ``hull_owd_ns``: the int64 values little-endian, back to back (the Arrow
  list's value buffer reinterpreted as a binary array: same bytes, offsets × 8);
- ``path``: int32 indices into the ``link_dict`` table (link ids repeat across millions of
  windows; the dictionary is small), packed the same way.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetlens.records import HULLS, WINDOW_SCHEMA

BLOB_COLUMNS = (*HULLS, "path")


def _plain(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    return pa.concat_arrays([arr]) if arr.offset else arr  # rebase a slice to offset 0


def list_to_blob(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A list of fixed-width ints as a binary array of their packed bytes (nulls kept)."""
    arr = _plain(arr)
    width = arr.type.value_type.byte_width
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    offsets = (offsets - offsets[0]) * width
    values = _plain(arr.flatten()) if len(arr) else pa.array([], arr.type.value_type)
    data = values.buffers()[1] if len(values) else pa.py_buffer(b"")
    if offsets[-1] >= 2**31:
        raise ValueError("batch too large for one binary array")
    return pa.Array.from_buffers(
        pa.binary(), len(arr), [arr.buffers()[0], pa.py_buffer(offsets.astype(np.int32)), data]
    )


def blob_to_list(arr: pa.Array | pa.ChunkedArray, value_type: pa.DataType) -> pa.Array:
    arr = _plain(arr)
    if pa.types.is_large_binary(arr.type) or pa.types.is_binary_view(arr.type):
        arr = arr.cast(pa.binary())
    if len(arr) == 0:
        return pa.array([], pa.list_(value_type))
    width = value_type.byte_width
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=len(arr) + 1)
    start = int(offsets[0])
    data = arr.buffers()[2]
    n = (int(offsets[-1]) - start) // width
    values = pa.Array.from_buffers(
        value_type, n, [None, data.slice(start, n * width) if data else None]
    )
    rel = pa.array((offsets - start) // width, pa.int32())
    mask = pc.is_null(arr) if arr.null_count else None
    return pa.ListArray.from_arrays(rel, values, mask=mask)


class LinkDict:
    """Link id <-> int32 index; owned by the writer (it adds), read by everyone.

    Lookups dictionary-encode the batch first (C++) and map only its distinct link ids through
    a Python dict: a fleet has ~10^5 links and hashing all of them per batch would dominate."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = pa.array(ids, pa.string())
        self._index = {lk: i for i, lk in enumerate(ids)}

    def encode(self, path: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, list[str]]:
        """(path as index lists, link ids new to the dictionary, already appended)."""
        path = _plain(path)
        enc = path.flatten().dictionary_encode()
        distinct = enc.dictionary.to_pylist()
        new = [lk for lk in distinct if lk not in self._index]
        if new:
            for lk in new:
                self._index[lk] = len(self._index)
            self.ids = pa.concat_arrays([self.ids, pa.array(new, pa.string())])
        lookup = np.fromiter((self._index[lk] for lk in distinct), np.int32, len(distinct))
        idx = pa.array(lookup[enc.indices.to_numpy()], pa.int32())
        offsets = pc.subtract(path.offsets, path.offsets[0])
        mask = pc.is_null(path) if path.null_count else None
        return pa.ListArray.from_arrays(offsets, idx, mask=mask), new

    def decode(self, idx_lists: pa.Array) -> pa.Array:
        values = pc.take(self.ids, idx_lists.flatten())
        offsets = pc.subtract(idx_lists.offsets, idx_lists.offsets[0])
        mask = pc.is_null(idx_lists) if idx_lists.null_count else None
        return pa.ListArray.from_arrays(offsets, values, mask=mask)


def to_storage(t: pa.Table, links: LinkDict) -> tuple[pa.Table, list[str]]:
    path, new = links.encode(t["path"])
    cols = [
        list_to_blob(path) if n == "path" else list_to_blob(t[n]) if n in BLOB_COLUMNS else t[n]
        for n in WINDOW_SCHEMA.names
    ]
    return pa.Table.from_arrays(cols, names=WINDOW_SCHEMA.names), new


def from_storage(t: pa.Table, links: LinkDict) -> pa.Table:
    cols = []
    for f in WINDOW_SCHEMA:
        if f.name == "path":
            cols.append(links.decode(blob_to_list(t[f.name], pa.int32())))
        elif f.name in BLOB_COLUMNS:
            cols.append(blob_to_list(t[f.name], pa.int64()))
        else:
            cols.append(t[f.name])
    return pa.Table.from_arrays(cols, names=WINDOW_SCHEMA.names).cast(WINDOW_SCHEMA)
