# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""String id -> its position in a list of ids, read straight from Arrow's string buffers.

Both engines map a window's NIC and link id columns (millions of rows) to numbers. In a
host's batch a sender's rows share their source NIC and a pair's rows their destination, so a
row equal to the row before takes its number without hashing; the rest is one probe of an
open-addressing table of the ids' UTF-8 bytes.
"""

from cpython.pycapsule cimport PyCapsule_GetPointer
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t

import numpy as np

from arrow_abi cimport ArrowArray, ArrowArrayStream, bit_set

ctypedef fused offs_t:
    int32_t
    int64_t


cdef class StrIndex:
    """Open-addressing map from the given strings to their positions (first one wins)."""

    def __init__(self, strings: list[str]):
        enc = [s.encode() for s in strings]
        self._blob = b"".join(enc) + b"\0"
        self._data = <const uint8_t*> self._blob
        lens = np.array([len(e) for e in enc], np.int64)
        self._off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        self.size = len(enc)
        n = table_size(self.size)
        self._slot = np.full(n, -1, np.int64)
        self._mask = n - 1
        cdef int64_t i
        for i in range(self.size):
            if self.find(self._data + self._off[i], self._off[i + 1] - self._off[i]) < 0:
                self._put(i)

    cdef void _put(self, int64_t i):
        cdef uint64_t h = bytes_hash(self._data + self._off[i], self._off[i + 1] - self._off[i])
        cdef int64_t s = <int64_t> (h & <uint64_t> self._mask)
        while self._slot[s] >= 0:
            s = (s + 1) & self._mask
        self._slot[s] = i

    cdef int64_t find(self, const uint8_t* p, int64_t n) noexcept nogil:
        """Position of the ``n`` bytes at ``p``, -1 when not among the strings."""
        cdef uint64_t h = bytes_hash(p, n)
        cdef int64_t s = <int64_t> (h & <uint64_t> self._mask)
        cdef int64_t j
        while True:
            j = self._slot[s]
            if j < 0:
                return -1
            if self._off[j + 1] - self._off[j] == n and same_bytes(self._data + self._off[j], p, n):
                return j
            s = (s + 1) & self._mask

    def lookup(self, const offs_t[::1] off, const uint8_t[::1] data, valid, int64_t[::1] out):
        """``out[i]`` = number of string i of an Arrow string array (its ``len+1`` offsets,
        bytes and optional validity as uint8), -1 when unknown or null. Returns how many
        rows equalled the row before (resolved without hashing)."""
        cdef const uint8_t[::1] ok
        cdef bint has_valid = valid is not None
        if has_valid:
            ok = valid
        cdef int64_t n = out.shape[0], i, s, ln, prev_s = -1, prev_n = -1, prev_v = -1
        cdef int64_t hits = 0
        cdef const uint8_t* base = &data[0]
        with nogil:
            for i in range(n):
                if has_valid and not ok[i]:
                    out[i] = -1
                    continue
                s = off[i]
                ln = off[i + 1] - s
                if ln == prev_n and same_bytes(base + s, base + prev_s, ln):
                    out[i] = prev_v
                    hits += 1
                    continue
                prev_v = self.find(base + s, ln)
                prev_s, prev_n = s, ln
                out[i] = prev_v
        return hits

    def of(self, object col):
        """Each row's position: -1 where its string is not among the strings, -2 where it is
        null (``col``: a ChunkedArray of strings, read chunk by chunk in place through the
        Arrow C stream interface: ``pc.index_in(col, value_set=strings)``'s answer)."""
        cdef int64_t r = 0, i, rows = len(col), n, prev_n, prev_i = -1
        cdef ArrowArrayStream* stream
        cdef ArrowArray arr
        cdef const int32_t* off
        cdef const uint8_t* data
        cdef const uint8_t* valid
        cdef const uint8_t* prev = NULL
        out_a = np.empty(rows, np.int64)
        cdef int64_t[::1] out = out_a
        capsule = col.__arrow_c_stream__()
        stream = <ArrowArrayStream*> PyCapsule_GetPointer(capsule, "arrow_array_stream")
        while True:
            if stream.get_next(stream, &arr) != 0:
                raise RuntimeError(stream.get_last_error(stream).decode())
            if arr.release == NULL:
                break
            if r + arr.length > rows:
                arr.release(&arr)
                raise ValueError(f"the column's chunks hold more than {rows} rows")
            off = <const int32_t*> arr.buffers[1] + arr.offset
            data = <const uint8_t*> arr.buffers[2]
            valid = <const uint8_t*> (arr.buffers[0] if arr.null_count != 0 else NULL)
            with nogil:
                prev_n = -1  # a chunk's strings are compared with its own only
                for i in range(arr.length):
                    if valid != NULL and not bit_set(valid, arr.offset + i):
                        out[r + i] = -2
                        continue
                    n = off[i + 1] - off[i]
                    if n != prev_n or not same_bytes(data + off[i], prev, n):
                        prev, prev_n = data + off[i], n
                        prev_i = self.find(prev, n)
                    out[r + i] = prev_i
            r += arr.length
            arr.release(&arr)
        if r != rows:
            raise ValueError(f"the column's chunks hold {r} rows, not {rows}")
        return out_a
