"""``fleetlens._strindex.StrIndex``: the string id index both engines read Arrow columns with."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetlens._strindex import StrIndex


def test_string_index_reads_arrow_buffers() -> None:
    names = ["h00/eth0", "h01/eth0", "leaf0->spine1", ""]
    idx = StrIndex(names)
    vals = ["h01/eth0", "h01/eth0", None, "x", "", "h00/eth0", "h00/eth", "leaf0->spine1"]
    want = [1, 1, -1, -1, 3, 0, -1, 2]
    for typ in (pa.string(), pa.large_string()):
        arr = pa.array(["pad", *vals], typ).slice(1)  # a non-zero offset
        pm_off = np.int64 if typ == pa.large_string() else np.int32
        bufs = arr.buffers()
        off = np.frombuffer(bufs[1], pm_off)[arr.offset : arr.offset + len(arr) + 1]
        data = np.frombuffer(bufs[2], np.uint8)
        ok = np.asarray(arr.is_valid()).astype(np.uint8)
        out = np.empty(len(arr), np.int64)
        idx.lookup(off, data, ok, out)
        assert out.tolist() == want


def test_string_index_tells_adjacent_ids_apart_at_every_byte() -> None:
    """Rows equal to the row before skip the hash (ids of 8-16 bytes compared as two words):
    an id differing from its predecessor in any single byte is still looked up."""
    base = "h0123/eth4:ab"
    names = [base] + [base[:i] + "Z" + base[i + 1 :] for i in range(len(base))]
    for n in (8, 9, 12, 13):  # lengths around the two words' overlap
        idx = StrIndex([x[:n] for x in names])
        rows = [x[:n] for pair in zip(names[1:], [base] * len(base), strict=True) for x in pair]
        arr = pa.array(rows, pa.string())
        bufs = arr.buffers()
        out = np.empty(len(arr), np.int64)
        idx.lookup(np.frombuffer(bufs[1], np.int32), np.frombuffer(bufs[2], np.uint8), None, out)
        want = [j for i in range(1, n + 1) for j in (i, 0)] + [0, 0] * (len(base) - n)
        assert out.tolist()[: 2 * n] == want[: 2 * n], n


def test_string_index_answers_arrows_index_in() -> None:
    """:class:`StrIndex` gives each row the position ``pc.index_in`` gives (-1 where its
    string is not among the ids, -2 where it is null), rows in runs of a repeated string
    (a batch's shape, where only a changed string is hashed) across chunks and slices,
    strings that prefix others and the empty string among them."""
    rng = np.random.default_rng(23)
    ids = sorted(
        {"", "h1", "h1/", "h1/eth0", "h1/eth01", "h12/eth0", *(f"h{i}/e" for i in range(40))}
    )
    for _ in range(20):
        known = [s for s in ids if rng.random() < 0.7]
        pool = [*ids, "bogus", "h1/eth", None]
        vals = [pool[int(i)] for i in rng.integers(0, len(pool), 60)]
        vals = [v for v in vals for _ in range(int(rng.integers(1, 6)))]
        cut = sorted(int(c) for c in rng.integers(0, len(vals), 3))
        parts = [vals[a:b] for a, b in itertools.pairwise([0, *cut, len(vals)])]
        col = pa.chunked_array([pa.array(p, pa.string()) for p in parts], pa.string())
        col = col.slice(int(rng.integers(0, 5)))
        want = pc.fill_null(pc.index_in(col, value_set=pa.array(known, pa.string())), -1)
        want = np.where(pc.is_null(col).to_numpy(zero_copy_only=False), -2, want.to_numpy())
        assert np.array_equal(StrIndex(known).of(col), want)
