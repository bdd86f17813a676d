# The string index shared by the engines' kernels (triangulate/_fast.pyx, sync/_csr.pyx), and
# the byte helpers of open-addressing tables, inlined into each module that cimports them.
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.string cimport memcmp, memcpy

cdef inline uint64_t bytes_hash(const uint8_t* p, int64_t n) noexcept nogil:
    """A string hash, 8 bytes at a time (ids are short: one or two words): seeded with
    FNV-1a's offset basis, each word mixed by the golden-ratio constant."""
    cdef uint64_t h = 1469598103934665603ULL ^ <uint64_t> n, w
    while n >= 8:
        memcpy(&w, p, 8)
        h = (h ^ w) * 0x9E3779B97F4A7C15ULL
        h ^= h >> 31
        p += 8
        n -= 8
    w = 0
    if n:
        memcpy(&w, p, n)
        h = (h ^ w) * 0x9E3779B97F4A7C15ULL
    return h ^ (h >> 29)


cdef inline bint same_bytes(const uint8_t* a, const uint8_t* b, int64_t n) noexcept nogil:
    """``memcmp(a, b, n) == 0``; ids of 8-16 bytes (NIC ids) by two overlapping word loads
    instead of a library call: this runs once per row of a window, millions of times."""
    cdef uint64_t x, y, u, v
    if 8 <= n <= 16:
        memcpy(&x, a, 8)
        memcpy(&y, b, 8)
        memcpy(&u, a + n - 8, 8)
        memcpy(&v, b + n - 8, 8)
        return x == y and u == v
    return memcmp(a, b, n) == 0


cdef inline int64_t table_size(int64_t n) noexcept nogil:
    """Slots of an open-addressing table for ``n`` keys: a power of two, at most half full."""
    cdef int64_t size = 16
    while size < 2 * n + 2:
        size *= 2
    return size


cdef class StrIndex:
    cdef bytes _blob
    cdef const uint8_t* _data
    cdef int64_t[::1] _off
    cdef int64_t[::1] _slot
    cdef int64_t _mask
    cdef readonly int64_t size

    cdef void _put(self, int64_t i)
    cdef int64_t find(self, const uint8_t* p, int64_t n) noexcept nogil
