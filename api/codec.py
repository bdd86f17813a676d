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

The ids of a commit group's rows are found without hashing a row's strings in Python, numpy or
Arrow (:func:`to_storage`): ``fleetlens._batchscan`` numbers the group's distinct NIC, link
and ts_source ids in one pass over its buffers, only those go through the dictionaries' Python
dicts, and each row's path (its link indices) is found in, or added to, the path
dictionary's table in Cython as well (an agent batch: ~0.15 ms, 0.75x, with its paths known;
~0.2 ms, 0.5x, when they are new). With ingest workers, a worker finds a batch's NIC,
ts_source and link ids (:class:`WorkerDicts`, from the committed entries) and the writer
process, the collector's bottleneck, only checks them and interns the paths; once the writer
has handed a host's ids back (path ids included), the worker sends them with the host's
batches that repeat those strings, and the writer only checks them.

Files written before the dictionaries stored ``path`` as the packed int32 link indices (a
BLOB) and NICs as strings; a read-only open of such a file still reads them as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetlens import _batchscan
from fleetlens.batch import LayoutIds
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

    def ids_of(self, names: list[str]) -> np.ndarray:
        """The int32 id of each of ``names`` (distinct, not null), new ones appended."""
        get = self._index.get
        ids = [get(name, -1) for name in names]
        if -1 in ids:
            # distinct bytes may name one str (undecodable ones replaced): added once
            new = list(dict.fromkeys(name for name, i in zip(names, ids, strict=True) if i < 0))
            for name in new:
                self._index[name] = len(self._index)
            self.ids = pa.concat_arrays([self.ids, pa.array(new, pa.string())])
            ids = [self._index[name] for name in names]
        return np.array(ids, np.int32)

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


# The path dictionary's hashes are ``_batchscan.hash_lists``' (64 bits), masked: tests force
# collisions with a narrower mask.
_HASH_MASK = 2**64 - 1


class _Lists:
    """A list<int32> array as numpy: offsets (int32, from 0), values and validity."""

    def __init__(self, arr: pa.Array) -> None:
        lo, hi = arr.offsets[0].as_py(), arr.offsets[-1].as_py()
        self.offsets = (np.asarray(arr.offsets, np.int64) - lo).astype(np.int32)
        self.values = np.asarray(arr.values.slice(lo, hi - lo).to_numpy(zero_copy_only=False),
                                 np.int32)  # fmt: skip
        self.valid = ~np.asarray(pc.is_null(arr)) if arr.null_count else None


class _Growing:
    """A numpy array appended to in place, its capacity doubled when full: a view of its
    filled part stays valid (and unchanged) after later appends."""

    def __init__(self, first: np.ndarray) -> None:
        self.buf, self.n = first.copy(), len(first)

    @property
    def view(self) -> np.ndarray:
        return self.buf[: self.n]

    def reserve(self, more: int) -> None:
        """Room for ``more`` values past the filled part (in :attr:`buf`)."""
        need = self.n + more
        if need > len(self.buf):
            buf = np.empty(max(need, 2 * len(self.buf), 16), self.buf.dtype)
            buf[: self.n] = self.view
            self.buf = buf

    def extend(self, more: np.ndarray) -> None:
        self.reserve(len(more))
        self.buf[self.n : self.n + len(more)] = more
        self.n += len(more)


class PathDict:
    """Path (a list of link indices) <-> int32 id; owned by the writer (it adds), read by
    everyone (:meth:`decode` uses only :attr:`paths`, replaced whole when it grows).

    A fleet has a path per NIC pair and route (~10^6 at 1024 hosts) and nearly every row of a
    batch has its own, so a row's path is looked up, and added when new, in Cython
    (``_batchscan.intern_lists``): a 64-bit hash per list in an open-addressing table (linear
    probing, at most half full) over numpy arrays owned here, every row then checked against
    the list stored under its id. A path whose hash belongs to another path (a collision) is
    interned through a Python dict instead: ids stay exact."""

    def __init__(self, paths: pa.Array) -> None:
        """``paths``: list<int32> of link indices, the path of id i at position i."""
        got = _Lists(_plain(paths))
        self._mask = np.uint64(_HASH_MASK)
        hashes = _batchscan.hash_lists(got.offsets, got.values, self._mask)
        self._off, self._val, self._hash = (
            _Growing(got.offsets),
            _Growing(got.values),
            _Growing(hashes),
        )
        _, first = np.unique(hashes, return_index=True)
        self._overflow = {  # a hash already taken (never seen in practice)
            tuple(self._values[self._offsets[i] : self._offsets[i + 1]].tolist()): int(i)
            for i in np.setdiff1d(np.arange(len(self)), first)
        }
        self._slots = np.full(16, -1, np.int32)
        self._rehash(len(self), force=True)
        self.paths = self._arrow()

    def __len__(self) -> int:
        return self._off.n - 1

    @property
    def _offsets(self) -> np.ndarray:
        return self._off.view

    @property
    def _values(self) -> np.ndarray:
        return self._val.view

    def encode(self, idx_lists: pa.Array) -> tuple[pa.Array, pa.Array]:
        """(one path id per row, null where the path is; the paths new to the dictionary,
        already appended: their ids follow its previous length)."""
        got = _Lists(_plain(idx_lists))
        base = len(self)
        valid = None if got.valid is None else got.valid.view(np.uint8)
        ids = self.ids_of(got.offsets, got.values, valid)
        return pa.array(ids, pa.int32(), mask=ids < 0), self.paths.slice(base)

    def ids_of(self, off: np.ndarray, values: np.ndarray, valid: np.ndarray | None) -> np.ndarray:
        """The id of each row's list (``values[off[i]:off[i + 1]]``, int32 offsets from 0),
        new ones appended, -2 where ``valid`` (uint8) says the row is null."""
        n, base, row = len(off) - 1, len(self), 0
        ids = np.empty(n, np.int32)
        while True:
            row, count = _batchscan.intern_lists(
                off, values, valid, self._slots, self._hash.buf, self._off.buf, self._val.buf,
                len(self), self._mask, row, ids)  # fmt: skip
            self._off.n, self._hash.n = count + 1, count
            self._val.n = int(self._off.buf[count])
            if row == n:
                break
            more = n - row  # room for every row left being new
            self._off.reserve(more)
            self._hash.reserve(more)
            self._val.reserve(int(off[n] - off[row]))
            self._rehash(len(self) + more)
        for r in np.flatnonzero(ids == -1):  # hash collisions
            ids[r] = self._intern_slowly(values[off[r] : off[r + 1]])
        if len(self) > base:
            self.paths = self._arrow()
        return ids

    def decode(self, ids: pa.Array | pa.ChunkedArray) -> pa.Array:
        """Path ids -> lists of link indices (null stays null)."""
        return pc.take(self.paths, _plain(ids))

    def _rehash(self, need: int, force: bool = False) -> None:
        """A table with room for ``need`` ids at most half full: when the current one has not,
        a larger one with every id placed again (but those of the overflow dict)."""
        size = len(self._slots)
        if 2 * need <= size and not force:
            return
        while 2 * need > size:
            size *= 2
        self._slots = np.full(size, -1, np.int32)
        indexed = np.ones(len(self), bool)
        indexed[list(self._overflow.values())] = False
        new = np.flatnonzero(indexed).astype(np.int32)
        mask = size - 1
        pos = (self._hash.view[new] & np.uint64(mask)).astype(np.int64)
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
            self._off.extend(np.array([self._offsets[-1] + len(row)], np.int32))
            self._val.extend(row)
            self._hash.extend(_batchscan.hash_lists(np.array([0, len(row)], np.int32),
                                                    row.astype(np.int32), self._mask))  # fmt: skip
        return got

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
    (the dictionary's length before); ``numbered``: the rows' ids, path ids included, of each
    table given without them or without path ids, in order (the ingest link hands them back to
    the worker once they are committed, for the host's next batch)."""

    links: tuple[int, list[str]]
    paths: tuple[int, pa.Array]
    nics: tuple[int, list[str]]
    sources: tuple[int, list[str]]
    numbered: list[LayoutIds]


def to_storage(
    tables: Sequence[pa.Table], d: Dicts, layouts: Sequence[LayoutIds | None] = ()
) -> tuple[pa.Table, Added]:
    """The rows of ``tables`` (in order) in storage form, and the dictionary entries they added.

    ``layouts``: per table, its rows' ids as an ingest worker found them, or None (or missing)
    where the writer numbers them itself: in Cython (``_batchscan.codes``: each distinct NIC,
    ts_source and link id of those rows once), then only the distinct ones looked up in the
    dictionaries here. Each row's path, as link indices, is then found in the path
    dictionary's table in Cython too; only the writer adds paths. No per-row hashing in
    Python, numpy or Arrow: that was ~0.2 ms an agent batch. When every table comes with its
    path ids (a worker reusing a host's ids), no path is looked up either."""
    tables = [_in_schema(x) for x in tables]
    bases = len(d.links.ids), len(d.paths), len(d.nics.ids), len(d.sources.ids)
    given = list(layouts) + [None] * (len(tables) - len(layouts))
    here = [x for x, lay in zip(tables, given, strict=True) if lay is None]
    if len(here) == len(tables):
        ids = _number(here, d)
        parts = _split(ids, here)
    else:
        parts = _fill(given, _split(_number(here, d), here) if here else [])
        ids = _joined(parts, d)
    if ids.path is None:
        path = d.paths.ids_of(ids.path_off, ids.links, ids.path_valid)
        numbered = _with_paths(parts, given, path)
    else:
        path, numbered = ids.path, []
    stored = {"src_nic": ids.src, "dst_nic": ids.dst, "ts_source": ids.ts, "path": path}
    t = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    cols = [
        _nullable(stored[n]) if n in stored else list_to_blob(t[n]) if n in BLOB_COLUMNS
        else t[n]
        for n in WINDOW_SCHEMA.names
    ]  # fmt: skip
    added = Added(
        (bases[0], d.links.ids.slice(bases[0]).to_pylist()),
        (bases[1], d.paths.paths.slice(bases[1])),
        (bases[2], d.nics.ids.slice(bases[2]).to_pylist()),
        (bases[3], d.sources.ids.slice(bases[3]).to_pylist()),
        numbered,
    )
    return pa.Table.from_arrays(cols, names=WINDOW_SCHEMA.names), added


def _in_schema(t: pa.Table) -> pa.Table:
    """``t`` in ``WINDOW_SCHEMA``: the Cython pass reads columns by position and type."""
    return (
        t if t.schema.equals(WINDOW_SCHEMA) else t.select(WINDOW_SCHEMA.names).cast(WINDOW_SCHEMA)
    )


def _number(tables: list[pa.Table], d: Dicts) -> LayoutIds:
    """The ids of ``tables``' rows, numbered here (new names appended to the dictionaries)."""
    c = _batchscan.codes([b for t in tables for b in t.to_batches()])
    nics, links = _ids(d.nics, c.nics), _ids(d.links, c.links)
    return LayoutIds(nics[c.src_code], nics[c.dst_code], _ids(d.sources, c.ts)[c.ts_code],
                     c.path_off, links[c.link_code], c.path_valid)  # fmt: skip


def _with_paths(parts: list[LayoutIds], given: list[LayoutIds | None], path: np.ndarray
                ) -> list[LayoutIds]:  # fmt: skip
    """The ids of each table given without them or without path ids, with its rows' path ids
    (``path``: every table's, in order)."""
    out, lo = [], 0
    for part, lay in zip(parts, given, strict=True):
        hi = lo + len(part.src)
        if lay is None or lay.path is None:
            out.append(replace(part, path=path[lo:hi]))
        lo = hi
    return out


def _split(ids: LayoutIds, tables: list[pa.Table]) -> list[LayoutIds]:
    """``ids`` of the rows of ``tables`` together, cut into one per table."""
    out, lo = [], 0
    for t in tables:
        hi = lo + t.num_rows
        a, b = int(ids.path_off[lo]), int(ids.path_off[hi])
        valid = None if ids.path_valid is None else ids.path_valid[lo:hi]
        out.append(LayoutIds(ids.src[lo:hi], ids.dst[lo:hi], ids.ts[lo:hi],
                             ids.path_off[lo : hi + 1] - a, ids.links[a:b], valid))  # fmt: skip
        lo = hi
    return out


def _fill(given: list[LayoutIds | None], numbered: list[LayoutIds]) -> list[LayoutIds]:
    """``given`` with its gaps filled by ``numbered``, in order."""
    it = iter(numbered)
    return [next(it) if lay is None else lay for lay in given]


def _joined(parts: list[LayoutIds], d: Dicts) -> LayoutIds:
    """One table's ids of consecutive parts. An id a worker sent must already be in the
    dictionary (a committed entry): anything else is refused, failing its group, never
    stored under a wrong name."""
    sizes = np.cumsum([0] + [len(p.links) for p in parts])
    off = np.concatenate([p.path_off[:-1] + s for p, s in zip(parts, sizes, strict=False)]
                         + [sizes[-1:]]).astype(np.int32)  # fmt: skip
    valid = None
    if any(p.path_valid is not None for p in parts):
        valid = np.concatenate([np.ones(len(p.src), np.uint8) if p.path_valid is None
                                else p.path_valid for p in parts])  # fmt: skip

    def joined(field: str) -> np.ndarray:
        return np.concatenate([getattr(p, field) for p in parts]).astype(np.int32, copy=False)

    got = LayoutIds(joined("src"), joined("dst"), joined("ts"), off, joined("links"), valid)
    for arr, size in ((got.src, len(d.nics.ids)), (got.dst, len(d.nics.ids)),
                      (got.ts, len(d.sources.ids)), (got.links, len(d.links.ids))):  # fmt: skip
        if len(arr) and int(arr.max()) >= size:
            raise ValueError("a worker's storage id past its dictionary")
    if all(p.path is not None for p in parts):
        got.path = joined("path")
        if len(got.path) and int(got.path.max()) >= len(d.paths):
            raise ValueError("a worker's storage id past its dictionary")
    return got


class WorkerDicts:
    """An ingest worker's copy of the writer's committed dictionary entries (NIC, ts_source
    and link ids), with which it numbers a checked batch's strings (:class:`LayoutIds`) so
    that the writer process, the collector's bottleneck, does not. New names are rare (a NIC
    registered a moment ago, a link first crossed): a batch with one the copy lacks is sent
    without ids and numbered by the writer, and the worker asks for the entries added since.

    An agent sends the same flows every window, so each host's last string columns are kept
    (~0.1 MB a host) with their ids: a batch whose string buffers are byte for byte the last
    one's reuses them (a memcmp, ~50 us) instead of numbering again (hashing ~6,000 strings and
    looking the distinct ones up: ~0.4 ms, more than the writer's share of the same work in
    its groups). Committed ids never change, so kept ids stay right."""

    def __init__(self) -> None:
        self.nics: dict[str, int] = {}
        self.sources: dict[str, int] = {}
        self.links: dict[str, int] = {}
        self._last: dict[str, tuple[list[pa.Buffer | None], LayoutIds]] = {}

    def sizes(self) -> list[int]:
        return [len(self.nics), len(self.sources), len(self.links)]

    def extend(self, nics: list[str], sources: list[str], links: list[str]) -> None:
        """The entries following the copy's, in id order."""
        for names, new in ((self.nics, nics), (self.sources, sources), (self.links, links)):
            names.update(zip(new, range(len(names), len(names) + len(new)), strict=True))

    def extend_from(self, start: Sequence[int], nics: list[str], sources: list[str],
                    links: list[str]) -> bool:  # fmt: skip
        """The entries from id ``start`` on (per dictionary), of which those the copy lacks are
        appended: the writer process sends each worker the entries committed since the last
        it sent, so answers may overlap the copy but never skip past it. False (nothing
        taken) when they would leave a gap."""
        have = self.sizes()
        if any(lo > n for lo, n in zip(start, have, strict=True)):
            return False
        self.extend(*(new[n - lo :] for new, lo, n in zip((nics, sources, links), start, have,
                                                          strict=True)))  # fmt: skip
        return True

    def key(self, windows: pa.Table) -> list[pa.Buffer | None] | None:
        """A copy of the string buffers by which a host's next batch is compared (None: they
        cannot be compared as bytes), kept when a batch goes without ids."""
        key = _strings(_in_schema(windows))
        return None if key is None else _copy(key)

    def remember(self, host: str, key: list[pa.Buffer | None], ids: LayoutIds) -> None:
        """The ids the writer found for a host's batch sent without them or without path ids
        (``key``: its string buffers, :meth:`key`): its next batch with the same strings
        reuses them, path ids included."""
        self._last[host] = (key, ids)

    def number(self, host: str, windows: pa.Table) -> LayoutIds | None:
        """The rows' ids, or None when a name is not in the copy."""
        windows = _in_schema(windows)
        key = _strings(windows)
        last = self._last.get(host)
        if key is not None and last is not None and len(last[1].src) == windows.num_rows \
                and _same(key, last[0]):  # fmt: skip
            return last[1]
        c = _batchscan.codes(windows.to_batches())
        nics, ts = _known(self.nics, c.nics), _known(self.sources, c.ts)
        links = _known(self.links, c.links)
        if nics is None or ts is None or links is None:
            return None
        got = LayoutIds(nics[c.src_code], nics[c.dst_code], ts[c.ts_code], c.path_off,
                        links[c.link_code], c.path_valid)  # fmt: skip
        if key is not None:
            self._last[host] = (_copy(key), got)
        return got


_STRING_COLUMNS = ("src_nic", "dst_nic", "ts_source", "path")


def _strings(windows: pa.Table) -> list[pa.Buffer | None] | None:
    """The buffers of the string columns (validity, offsets, data; the path's and its
    elements'), or None when they cannot be compared as bytes (chunked, or sliced)."""
    out: list[pa.Buffer | None] = []
    for name in _STRING_COLUMNS:
        col = windows.column(name)
        if col.num_chunks != 1:
            return None
        arr = col.chunk(0)
        if arr.offset or (name == "path" and arr.values.offset):
            return None
        out += arr.buffers()
    return out


def _copy(key: list[pa.Buffer | None]) -> list[pa.Buffer | None]:
    """Buffers of their own (a body's buffers are freed with its request)."""
    return [None if b is None else pa.py_buffer(b.to_pybytes()) for b in key]


def _same(a: list[pa.Buffer | None], b: list[pa.Buffer | None]) -> bool:
    """Byte for byte the same buffers (the same row count follows: the offsets' sizes)."""
    return len(a) == len(b) and all(
        (x is None and y is None) or (x is not None and y is not None and x.equals(y))
        for x, y in zip(a, b, strict=True)
    )


def _known(index: dict[str, int], names: list[str]) -> np.ndarray | None:
    """The ids of distinct ``names`` and -1 last (a code of -1, null, indexes it); None when
    one is not in ``index``."""
    get = index.get
    ids = np.fromiter((get(n, -1) for n in names), np.int32, len(names))
    return None if (ids < 0).any() else np.append(ids, np.int32(-1))


def _ids(d: NameDict, names: list[str]) -> np.ndarray:
    """The ids of distinct ``names`` (new ones appended), and -1 last: a code of -1 (null)
    indexes it."""
    return np.append(d.ids_of(names), np.int32(-1))


def _nullable(ids: np.ndarray) -> pa.Array:
    return pa.array(ids, pa.int32(), mask=ids < 0 if (ids < 0).any() else None)


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
