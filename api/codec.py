"""How window rows are laid out in DuckDB, and back.

DuckDB's LIST columns cost more to insert than all other columns together
(``bench/collector_bench.py`` measures the writer both ways), and strings repeated on every row
cost more than ids. So no window column is stored as a list or a string, and the conversions
run without a per-row Python loop:

- ``hull_t_ns`` / ``hull_owd_ns``: the int64 values little-endian, back to back (the Arrow
  list's value buffer reinterpreted as a binary array: same bytes, offsets × 8);
- ``path``: one int32 id per row into the ``path_dict`` table (id -> the path's list of int32
  indices into ``link_dict``): a flow reports the same path every window, so the windows table
  holds a 4-byte id where it held a list (DuckDB CPU per agent batch 733 -> 549 us,
  ``bench/duckdb_layout.py``). A null path (unknown) stays null;
- ``src_nic``, ``dst_nic``: int32 ids into ``nic_dict`` (id -> NIC id, its host), and
  ``ts_source`` into ``ts_source_dict``: a fleet has ~10^4 NICs and every row names two.
  Reads name them again (strings out): rows read whole through :func:`from_storage`
  (``pc.take`` on the dictionary), aggregates in SQL joined to ``nic_dict``.

Files written before the dictionaries stored ``path`` as the packed int32 link indices (a
BLOB) and NICs as strings; a read-only open of such a file still reads them as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetlens.records import HULLS, WINDOW_SCHEMA

BLOB_COLUMNS = HULLS
LIST_COLUMNS = (*HULLS, "path")  # the columns a read may leave out (null, unread)


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


class NameDict:
    """Name (a string) <-> int32 id; owned by the writer (it adds), read by everyone.

    Lookups dictionary-encode the batch first (C++) and map only its distinct names through a
    Python dict: a fleet has ~10^4 NICs and ~10^5 links, and hashing all of them per batch
    would dominate."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = pa.array(ids, pa.string())
        self._index = {name: i for i, name in enumerate(ids)}

    def encode_names(self, names: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, list[str]]:
        """(one id per name, null where it is; names new to the dictionary, already appended)."""
        enc = _plain(names).dictionary_encode()
        distinct = enc.dictionary.to_pylist()
        new = [name for name in distinct if name not in self._index]
        if new:
            for name in new:
                self._index[name] = len(self._index)
            self.ids = pa.concat_arrays([self.ids, pa.array(new, pa.string())])
        lookup = np.fromiter((self._index[n] for n in distinct), np.int32, len(distinct))
        return pc.take(pa.array(lookup, pa.int32()), enc.indices), new

    def id_of(self, name: str) -> int:
        """The id of ``name``, -1 if it was never stored."""
        return self._index.get(name, -1)

    def decode_names(self, ids: pa.Array | pa.ChunkedArray) -> pa.Array:
        """Ids -> names (null stays null)."""
        return pc.take(self.ids, _plain(ids))


class LinkDict(NameDict):
    """Link id <-> int32 index (``link_dict``), and paths as lists of them."""

    def encode(self, path: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, list[str]]:
        """(path as index lists, link ids new to the dictionary, already appended)."""
        path = _plain(path)
        idx, new = self.encode_names(path.flatten())
        offsets = pc.subtract(path.offsets, path.offsets[0])
        mask = pc.is_null(path) if path.null_count else None
        return pa.ListArray.from_arrays(offsets, idx, mask=mask), new

    def decode(self, idx_lists: pa.Array) -> pa.Array:
        values = pc.take(self.ids, idx_lists.flatten())
        offsets = pc.subtract(idx_lists.offsets, idx_lists.offsets[0])
        mask = pc.is_null(idx_lists) if idx_lists.null_count else None
        return pa.ListArray.from_arrays(offsets, values, mask=mask)


# Row hashes of link index lists: a polynomial over the indices and the length, then the
# splitmix64 finalizer (uint64 arithmetic wraps, as intended).
_K = np.uint64(0x9E3779B97F4A7C15)
_LEN = np.uint64(0xD6E8FEB86659FD93)


def _mix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(30))
    h = h * np.uint64(0xBF58476D1CE4E5B9)
    h = h ^ (h >> np.uint64(27))
    h = h * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def _hash_rows(mat: np.ndarray) -> np.ndarray:
    """A 64-bit hash per row of an (n, length) matrix of link indices."""
    h = np.full(len(mat), (mat.shape[1] * int(_LEN)) % 2**64, np.uint64)
    for k in range(mat.shape[1]):  # a path's few hops, each a vectorized pass over the rows
        h = h * _K + mat[:, k].astype(np.uint64)
    return _mix(h)


class _Lists:
    """A list<int32> array as numpy: offsets (from 0) and values, rows grouped by length."""

    def __init__(self, arr: pa.Array) -> None:
        lo, hi = arr.offsets[0].as_py(), arr.offsets[-1].as_py()
        self.offsets = np.asarray(arr.offsets, np.int64) - lo
        self.values = np.asarray(arr.values.slice(lo, hi - lo).to_numpy(zero_copy_only=False),
                                 np.int32)  # fmt: skip
        self.valid = ~np.asarray(pc.is_null(arr)) if arr.null_count else None
        self.lens = np.diff(self.offsets)

    def by_length(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(rows, their lists as an (n, length) matrix) per length, null rows left out."""
        n = len(self.lens)
        if n and self.valid is None and self.offsets[-1] == n * self.lens[0]:
            return [(np.arange(n), self.values.reshape(n, int(self.lens[0])))]  # one length
        keep = self.lens if self.valid is None else np.where(self.valid, self.lens, -1)
        out = []
        for length in np.unique(keep[keep >= 0]).tolist():
            rows = np.flatnonzero(keep == length)
            out.append((rows, self.values[self.offsets[rows, None] + np.arange(length)]))
        return out


class _Growing:
    """A numpy array appended to in place, its capacity doubled when full: a view of its
    filled part stays valid (and unchanged) after later appends."""

    def __init__(self, first: np.ndarray) -> None:
        self._buf, self._n = first.copy(), len(first)

    @property
    def view(self) -> np.ndarray:
        return self._buf[: self._n]

    def extend(self, more: np.ndarray) -> None:
        need = self._n + len(more)
        if need > len(self._buf):
            buf = np.empty(max(need, 2 * len(self._buf), 16), self._buf.dtype)
            buf[: self._n] = self.view
            self._buf = buf
        self._buf[self._n : need] = more
        self._n = need


class PathDict:
    """Path (a list of link indices) <-> int32 id; owned by the writer (it adds), read by
    everyone (:meth:`decode` uses only :attr:`paths`, replaced whole when it grows).

    A fleet has a path per NIC pair and route (~10^6 at 1024 hosts) and nearly every row of a
    batch has its own, so interning is vectorized, never a Python loop over rows: a 64-bit
    hash per row (a pass per hop), looked up in an open-addressing table of numpy arrays
    (linear probing, at most half full), and every row then checked against the list stored
    under its id. A path whose hash belongs to another path (a collision) is interned through
    a Python dict instead: ids stay exact."""

    def __init__(self, paths: pa.Array) -> None:
        """``paths``: list<int32> of link indices, the path of id i at position i."""
        got = _Lists(_plain(paths))
        hashes = np.zeros(len(got.lens), np.uint64)
        for rows, mat in got.by_length():
            hashes[rows] = _hash_rows(mat)
        self._off = _Growing(got.offsets.astype(np.int32))
        self._val, self._hash = _Growing(got.values), _Growing(hashes)
        self._slots = np.full(16, -1, np.int32)
        _, first = np.unique(self._hash_of, return_index=True)
        self._overflow = {  # a hash already taken (never seen in practice)
            tuple(self._values[self._offsets[i] : self._offsets[i + 1]].tolist()): int(i)
            for i in np.setdiff1d(np.arange(len(self)), first)
        }
        self._index(np.sort(first).astype(np.int32))
        self.paths = self._arrow()

    def __len__(self) -> int:
        return len(self._off.view) - 1

    @property
    def _offsets(self) -> np.ndarray:
        return self._off.view

    @property
    def _values(self) -> np.ndarray:
        return self._val.view

    @property
    def _hash_of(self) -> np.ndarray:
        return self._hash.view

    def encode(self, idx_lists: pa.Array) -> tuple[pa.Array, pa.Array]:
        """(one path id per row, null where the path is; the paths new to the dictionary,
        already appended: their ids follow its previous length)."""
        got = _Lists(_plain(idx_lists))
        ids = np.full(len(got.lens), -1, np.int32)
        base = len(self)
        for rows, mat in got.by_length():
            ids[rows] = self._encode(mat)
        if len(self) > base:
            self.paths = self._arrow()
        mask = None if got.valid is None else ~got.valid
        return pa.array(ids, pa.int32(), mask=mask), self.paths.slice(base)

    def decode(self, ids: pa.Array | pa.ChunkedArray) -> pa.Array:
        """Path ids -> lists of link indices (null stays null)."""
        return pc.take(self.paths, _plain(ids))

    def _encode(self, mat: np.ndarray) -> np.ndarray:
        """The ids of an (n, length) matrix's rows, new ones appended."""
        hashes = _hash_rows(mat)
        ids = self._find(hashes)
        miss = np.flatnonzero(ids < 0)
        if len(miss):
            by_hash = miss[np.argsort(hashes[miss], kind="stable")]
            h = hashes[by_hash]
            lead = np.ones(len(h), bool)
            lead[1:] = h[1:] != h[:-1]
            first = np.sort(by_hash[lead])  # new ids in the order the rows name them
            new_id = np.arange(len(self), len(self) + len(first), dtype=np.int32)
            group_id = new_id[np.argsort(hashes[first])]  # hash order -> id
            ids[by_hash] = group_id[np.cumsum(lead) - 1]
            self._append(mat[first], hashes[first])
            self._index(new_id)
        start = self._offsets[ids]
        wrong = self._offsets[ids + 1] - start != mat.shape[1]
        last = len(self._values) - 1  # a shorter stored list: compared within the array
        for k in range(mat.shape[1]):
            wrong |= self._values[np.minimum(start + k, last)] != mat[:, k]
        for r in np.flatnonzero(wrong):  # hash collisions
            ids[r] = self._intern_slowly(mat[r])
        return ids

    def _find(self, hashes: np.ndarray) -> np.ndarray:
        """The id whose hash each of ``hashes`` is, -1 if none."""
        if not len(self):
            return np.full(len(hashes), -1, np.int32)
        mask = len(self._slots) - 1
        pos = (hashes & np.uint64(mask)).astype(np.int64)
        ids = self._slots[pos]
        # A slot of another hash: probe the next one (an empty slot reads hash_of[-1]).
        todo = np.flatnonzero((ids >= 0) & (self._hash_of[ids] != hashes))
        while len(todo):
            pos[todo] = (pos[todo] + 1) & mask
            s = self._slots[pos[todo]]
            ids[todo] = s
            todo = todo[(s >= 0) & (self._hash_of[s] != hashes[todo])]
        return ids

    def _index(self, new: np.ndarray) -> None:
        """Put ids (of distinct hashes not in the table) in the table, grown to stay at most
        half full."""
        if 2 * len(self) > len(self._slots):
            size = len(self._slots)
            while 2 * len(self) > size:
                size *= 2
            self._slots = np.full(size, -1, np.int32)
            indexed = np.ones(len(self), bool)
            indexed[list(self._overflow.values())] = False
            new = np.flatnonzero(indexed).astype(np.int32)
        mask = len(self._slots) - 1
        pos = (self._hash_of[new] & np.uint64(mask)).astype(np.int64)
        while len(new):
            free = self._slots[pos] < 0
            self._slots[pos[free]] = new[free]  # of ids aiming at one free slot, one gets it
            placed = self._slots[pos] == new
            new, pos = new[~placed], (pos[~placed] + 1) & mask

    def _intern_slowly(self, row: np.ndarray) -> int:
        key = tuple(row.tolist())
        got = self._overflow.get(key)
        if got is None:
            got = self._overflow[key] = len(self)
            self._append(row[None, :], _hash_rows(row[None, :]))
        return got

    def _append(self, mat: np.ndarray, hashes: np.ndarray) -> None:
        self._off.extend(self._offsets[-1] + mat.shape[1] * np.arange(1, len(mat) + 1))
        self._val.extend(mat.ravel())
        self._hash.extend(hashes)

    def _arrow(self) -> pa.Array:
        return pa.ListArray.from_arrays(
            pa.array(self._offsets, pa.int32()), pa.array(self._values, pa.int32())
        )


NAMED = ("src_nic", "dst_nic", "ts_source")  # string columns stored as dictionary ids


@dataclass
class Dicts:
    """The dictionaries of the windows table: ``link_dict``, ``path_dict``, ``nic_dict``
    (src_nic and dst_nic) and ``ts_source_dict``."""

    links: LinkDict = field(default_factory=lambda: LinkDict([]))
    paths: PathDict = field(default_factory=lambda: PathDict(pa.array([], pa.list_(pa.int32()))))
    nics: NameDict = field(default_factory=lambda: NameDict([]))
    sources: NameDict = field(default_factory=lambda: NameDict([]))


@dataclass
class Added:
    """What :func:`to_storage` appended to each dictionary, and the id each addition starts at
    (the dictionary's length before)."""

    links: tuple[int, list[str]]
    paths: tuple[int, pa.Array]
    nics: tuple[int, list[str]]
    sources: tuple[int, list[str]]


def to_storage(t: pa.Table, d: Dicts) -> tuple[pa.Table, Added]:
    """The rows in storage form, and the dictionary entries they added."""
    bases = len(d.links.ids), len(d.paths), len(d.nics.ids), len(d.sources.ids)
    idx, new_links = d.links.encode(t["path"])
    path, new_paths = d.paths.encode(idx)
    src, _ = d.nics.encode_names(t["src_nic"])
    dst, _ = d.nics.encode_names(t["dst_nic"])
    source, new_sources = d.sources.encode_names(t["ts_source"])
    stored = {"path": path, "src_nic": src, "dst_nic": dst, "ts_source": source}
    cols = [
        stored[n] if n in stored else list_to_blob(t[n]) if n in BLOB_COLUMNS else t[n]
        for n in WINDOW_SCHEMA.names
    ]
    new_nics = d.nics.ids.slice(bases[2]).to_pylist()
    added = Added((bases[0], new_links), (bases[1], new_paths), (bases[2], new_nics),
                  (bases[3], new_sources))  # fmt: skip
    return pa.Table.from_arrays(cols, names=WINDOW_SCHEMA.names), added


def decode_path(stored: pa.Array | pa.ChunkedArray, d: Dicts) -> pa.Array:
    """A stored ``path`` column -> lists of link ids: path ids, or (a file from before the path
    dictionary, read-only) packed link indices."""
    arr = _plain(stored)
    if pa.types.is_integer(arr.type):
        return d.links.decode(d.paths.decode(arr))
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), pa.list_(pa.string()))
    return d.links.decode(blob_to_list(arr, pa.int32()))


def decode_names(stored: pa.Array | pa.ChunkedArray, names: NameDict) -> pa.Array:
    """A stored NIC or ts_source column -> strings: ids, or (a file from before the NIC
    dictionary, read-only) the strings themselves."""
    arr = _plain(stored)
    return names.decode_names(arr) if pa.types.is_integer(arr.type) else arr


def from_storage(t: pa.Table, d: Dicts) -> pa.Table:
    cols = []
    for f in WINDOW_SCHEMA:
        if f.name == "path":
            cols.append(decode_path(t[f.name], d))
        elif f.name == "ts_source":
            cols.append(decode_names(t[f.name], d.sources))
        elif f.name in NAMED:
            cols.append(decode_names(t[f.name], d.nics))
        elif f.name in BLOB_COLUMNS:
            cols.append(blob_to_list(t[f.name], pa.int64()))
        else:
            cols.append(t[f.name])
    return pa.Table.from_arrays(cols, names=WINDOW_SCHEMA.names).cast(WINDOW_SCHEMA)
