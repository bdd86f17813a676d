# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The context-free checks of an ingest batch in one pass over its Arrow buffers.

``fleetlens.batch.check_windows`` ran ~40 numpy and Arrow calls over an agent's ~910-row
batch, each with its fixed cost (an Arrow kernel call also gives the GIL up and waits to win
it back): ~190 us a batch, a quarter of the collector's GIL time at the agents' shape (issue
29). Here the record batch is exported once through the Arrow C data interface
(``_export_to_c``: buffer pointers, no copy) and every row is read once. For each check
the pass records the first offending row and how many rows offend, in the units the Python
checks reported (the list-element check counts flattened elements), so
``fleetlens.batch`` raises the same error for the first failing check in the same order.

Also found here: the distinct ``src_nic`` / ``dst_nic`` ids in order of first appearance (a
small open-addressing hash of the bytes; rows of one NIC are adjacent, so a row equal to the
row before skips it) and each row's number among them, and the largest window end.

For the writer's storage layout (``fleetlens.api.codec``), the same numbering of a batch's
NIC, ts_source and link ids (:func:`codes`), and each row's path, as a list of
link-dictionary indices, found in (or added to) the path dictionary's hash table
(:func:`intern_lists`): the writer then maps only the distinct strings through its
dictionaries, in Python.

Offsets are read only after they are checked: Arrow's IPC reader checks the first and last
offset of a variable-size column against its data, not the ones between, and a body with a
wild offset in the middle crashed the collector in Arrow's own kernels. Every offset in the
range the rows use must be ascending (so inside the data).
"""

from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.unicode cimport PyUnicode_DecodeUTF8
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from libc.math cimport isnan, isinf
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy
from libc.stdint cimport INT64_MIN, int32_t, int64_t, uint8_t, uint64_t, uintptr_t

import numpy as np

from arrow_abi cimport ArrowArray, bit_set

# Column positions in WINDOW_SCHEMA (fleetlens.records); batch.py asserts the schema.
cdef enum:
    SRC = 0
    DST = 1
    SPORT = 2
    START = 3
    DURATION = 4
    SENT = 5
    RECEIVED = 6
    PURE = 7
    OWD0 = 8  # owd_min_ns, owd_p50_ns, owd_p99_ns, owd_max_ns: 8..11
    HULL_T = 12
    HULL_OWD = 13
    TS_SOURCE = 14
    PATH = 15
    ACKS_LOST = 16
    N_COLUMNS = 17

# Checks, numbered as batch._CHECKS lists them (its order is the order errors are raised in).
cdef enum:
    C_OFFSETS = 0  # 0..4: ascending offsets of src_nic, dst_nic, hull_t_ns, hull_owd_ns, ts_source
    C_PATH_OFFSETS = 5  # path's list offsets, then its strings' offsets (6)
    C_NULL = 7  # 7..14: a null in each required column (SRC..PURE)
    C_SAME = 15  # dst_nic == src_nic
    C_SPORT = 16
    C_DURATION = 17
    C_START = 18
    C_NEG = 19  # 19..22: sent, received, pure, acks_lost < 0
    C_RECV_GT_SENT = 23
    C_ACKS_GT_RECV = 24
    C_NAN = 25  # 25..32: per OWD column, NaN then infinite
    C_ORDER = 33  # 33..35: p50 < min, p99 < p50, max < p99
    C_HULL_LEN = 36
    C_LIST_NULL = 37  # 37..39: a null element in hull_t_ns, hull_owd_ns, path
    C_TS_SOURCE = 40
    C_PATH_TEXT = 41  # a link id of path that is not UTF-8
    CHECK_COUNT = 42

N_CHECKS = CHECK_COUNT  # batch.py has an error for each

cdef uint64_t _K = 0x9E3779B97F4A7C15ULL
cdef uint64_t _LEN = 0xD6E8FEB86659FD93ULL


cdef inline uint64_t _mix(uint64_t h) noexcept nogil:
    """splitmix64's finalizer: every output bit depends on every input bit."""
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ULL
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBULL
    return h ^ (h >> 31)


cdef inline uint64_t _tail(const char* p, int64_t m, const char* end) noexcept nogil:
    """The ``m`` (< 8) bytes at ``p`` as a little-endian word, zero above: one load where 8
    bytes are readable before ``end``, else byte by byte (a memcpy of a variable size is a call
    and a stall)."""
    cdef uint64_t w = 0
    cdef int64_t j
    if m == 0:
        return 0
    if p + 8 <= end:
        memcpy(&w, p, 8)
        return w & ((1ULL << (8 * m)) - 1)
    for j in range(m):
        w |= <uint64_t><uint8_t>p[j] << (8 * j)
    return w


cdef inline uint64_t _hash_bytes(const char* p, int64_t m, const char* end,
                                 bint* ascii) noexcept nogil:
    """A 64-bit hash of ``p[:m]`` (readable up to ``end``), 8 bytes a step (a byte at a time,
    FNV-1a, was latency bound: ~0.1 ms for the ~3,600 link ids of an agent's batch); each step
    is a bijection and the finalizer mixes every bit. ``ascii``: no byte >= 0x80."""
    cdef uint64_t h = <uint64_t>m * _LEN, w, high = 0
    cdef int64_t k = 0
    while k + 8 <= m:
        memcpy(&w, p + k, 8)
        high |= w
        h = (h ^ w) * _K
        k += 8
    w = _tail(p + k, m - k, end)
    high |= w
    h = (h ^ w) * _K
    ascii[0] = high & 0x8080808080808080ULL == 0
    return _mix(h)


cdef inline bint _ascii(const char* p, int64_t m) noexcept nogil:
    cdef int64_t k
    for k in range(m):
        if <uint8_t>p[k] >= 0x80:
            return False
    return True


cdef inline bint _same(const char* a, const char* b, int64_t m) noexcept nogil:
    """memcmp(a, b, m) == 0 without a call for the short ids of a batch, 8 bytes a step."""
    cdef int64_t k = 0
    cdef uint64_t x, y
    while k + 8 <= m:
        memcpy(&x, a + k, 8)
        memcpy(&y, b + k, 8)
        if x != y:
            return False
        k += 8
    while k < m:
        if a[k] != b[k]:
            return False
        k += 1
    return True


cdef inline bint _equal(const char* a, const char* a_end, const char* b, const char* b_end,
                        int64_t m) noexcept nogil:
    """``a[:m] == b[:m]``, 8 bytes a step (each readable up to its end)."""
    cdef int64_t k = m - m % 8
    return _same(a, b, k) and _tail(a + k, m - k, a_end) == _tail(b + k, m - k, b_end)


cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL

# The NIC and link ids' str objects, kept across batches: a fleet names a bounded set of NICs
# and links (~10^5 at 4096 hosts), and the same object every batch has its hash cached for the
# set and dict lookups that follow (the id syntax memo, the known NICs, the writer's
# dictionaries), where fresh ones were hashed again each time. Open addressing by the bytes'
# hash; emptied when half full (ids sent by a misbehaving agent cannot grow it).
cdef enum:
    _IDS_SLOTS = 1 << 18
cdef uint64_t _ids_hash[_IDS_SLOTS]
cdef PyObject* _ids_obj[_IDS_SLOTS]
cdef int64_t _ids_used = 0


cdef object _id_text(const char* p, int64_t m, uint64_t h, bint ascii):
    """The str of the id bytes ``p[:m]`` (``h``: their hash), the cached one when seen."""
    global _ids_used
    cdef int64_t slot = <int64_t>(h & (_IDS_SLOTS - 1)), k
    cdef Py_ssize_t size
    cdef const char* have
    if not ascii:  # text that is not ASCII is no NIC id: not worth keeping
        return PyUnicode_DecodeUTF8(p, m, "replace")
    while _ids_obj[slot] != NULL:
        if _ids_hash[slot] == h:
            have = PyUnicode_AsUTF8AndSize(<object>_ids_obj[slot], &size)
            if size == m and _same(have, p, m):
                return <object>_ids_obj[slot]
        slot = (slot + 1) & (_IDS_SLOTS - 1)
    text = PyUnicode_DecodeUTF8(p, m, "strict")
    if _ids_used >= _IDS_SLOTS // 2:
        for k in range(_IDS_SLOTS):
            Py_XDECREF(_ids_obj[k])
            _ids_obj[k] = NULL
        _ids_used = 0
        slot = <int64_t>(h & (_IDS_SLOTS - 1))
    Py_INCREF(text)
    _ids_obj[slot] = <PyObject*>text
    _ids_hash[slot] = h
    _ids_used += 1
    return text


cdef inline void _hit(int64_t* first, int64_t* count, int k, int64_t row) noexcept nogil:
    if count[k] == 0:
        first[k] = row
    count[k] += 1


cdef inline int64_t _ascending(const int32_t* off, int64_t lo, int64_t n) noexcept nogil:
    """The first i in [0, n) with off[lo + i] > off[lo + i + 1] (or off[lo] < 0); -1 if none."""
    cdef int64_t i
    if n > 0 and off[lo] < 0:
        return 0
    for i in range(n):
        if off[lo + i] > off[lo + i + 1]:
            return i
    return -1


cdef inline bint _is(const int32_t* off, const char* data, int64_t i, const char* word,
                     int32_t size) noexcept nogil:
    return off[i + 1] - off[i] == size and _same(data + off[i], word, size)


cdef class Scan:
    """What one pass found: per check the first offending row and the count (``first``,
    ``count``, int64 of ``N_CHECKS``), the distinct NIC ids and each row's number among them
    (``src``/``dst``, ``src_code``/``dst_code``), and the largest ``start_ns + duration_ns``
    (int64, wrapping as numpy adds; 0 rows: the smallest int64). ``failed``: any check did.
    After an offsets check failed nothing else was looked at."""

    cdef public object first, count, src, dst, src_code, dst_code
    cdef public int64_t end_max
    cdef public bint failed  # whether any check failed


cdef struct Bits:
    const uint8_t* bits  # NULL: no nulls
    int64_t offset


cdef inline Bits _bits(const ArrowArray* a) noexcept nogil:
    cdef Bits b
    b.bits = <const uint8_t*>a.buffers[0] if a.null_count != 0 else NULL
    b.offset = a.offset
    return b


cdef inline bint _ok(Bits b, int64_t i) noexcept nogil:
    return b.bits == NULL or bit_set(b.bits, b.offset + i)


# Distinct strings numbered by first appearance: open addressing (``table``: per slot the
# hash's high half and the number + 1, 0 empty; at most half full, so a probe reads the table
# alone until a hash matches) over each one's hash (``rep_h``) and bytes, copied into
# ``arena`` (``rep_o``, ``rep_m``). Both start small and double: a commit group's ~10^5 path
# elements name a few thousand distinct links, and a table sized for every element, or bytes
# compared where they lie in 128 agents' bodies, missed the CPU's caches on every probe.
cdef struct Numbering:
    int64_t size  # a power of 2
    uint64_t* table
    int64_t* rep_o
    int64_t* rep_m
    uint64_t* rep_h
    char* arena
    int64_t used, room  # arena bytes
    int32_t count


cdef int _numbering(Numbering* nb, int64_t n) noexcept nogil:
    """Room for up to ``n`` strings; -1 when out of memory (C's allocator: no GIL needed)."""
    nb.size = 64
    while nb.size < 2 * n and nb.size < 4096:
        nb.size <<= 1
    nb.count, nb.used, nb.room = 0, 0, 1 << 16
    nb.table = <uint64_t*>calloc(nb.size, sizeof(uint64_t))
    nb.rep_o = <int64_t*>malloc((n + 1) * sizeof(int64_t))
    nb.rep_m = <int64_t*>malloc((n + 1) * sizeof(int64_t))
    nb.rep_h = <uint64_t*>malloc((n + 1) * sizeof(uint64_t))
    nb.arena = <char*>malloc(nb.room + 8)  # 8 readable bytes past the last string
    if nb.table == NULL or nb.rep_o == NULL or nb.rep_m == NULL or nb.rep_h == NULL or \
            nb.arena == NULL:
        return -1
    return 0


cdef inline uint64_t _entry(uint64_t h, int64_t c) noexcept nogil:
    return (h & 0xFFFFFFFF00000000ULL) | <uint64_t>(c + 1)


cdef int _grow(Numbering* nb) noexcept nogil:
    """Double the table (every string placed again by its hash); -1 when out of memory."""
    cdef int64_t size = 2 * nb.size, k, slot
    cdef uint64_t* table = <uint64_t*>calloc(size, sizeof(uint64_t))
    if table == NULL:
        return -1
    for k in range(nb.count):
        slot = <int64_t>(nb.rep_h[k] & <uint64_t>(size - 1))
        while table[slot] != 0:
            slot = (slot + 1) & (size - 1)
        table[slot] = _entry(nb.rep_h[k], k)
    free(nb.table)
    nb.table, nb.size = table, size
    return 0


cdef void _numbering_free(Numbering* nb) noexcept nogil:
    free(nb.table)
    free(nb.rep_o)
    free(nb.rep_m)
    free(nb.rep_h)
    free(nb.arena)
    nb.table, nb.rep_o, nb.rep_m, nb.rep_h, nb.arena = NULL, NULL, NULL, NULL, NULL


cdef int _keep(Numbering* nb, const char* p, int64_t m, uint64_t h) noexcept nogil:
    """Record string ``nb.count``: its bytes copied into the arena, its hash; -1 when out of
    memory."""
    cdef int64_t room = nb.room
    cdef char* arena
    while nb.used + m > room:
        room *= 2
    if room != nb.room:
        arena = <char*>realloc(nb.arena, room + 8)
        if arena == NULL:
            return -1
        nb.arena, nb.room = arena, room
    memcpy(nb.arena + nb.used, p, m)
    nb.rep_o[nb.count], nb.rep_m[nb.count], nb.rep_h[nb.count] = nb.used, m, h
    nb.used += m
    nb.count += 1
    return 0


cdef int _number(Numbering* nb, const ArrowArray* a, int64_t start, int64_t n,
                 const uint8_t* skip, bint runs, int32_t* code) noexcept nogil:
    """Number the strings of ``a``'s rows ``start`` .. ``start + n`` (``code`` per row); a
    null row, or one ``skip`` flags (NULL: none), gets -1. ``runs``: equal strings tend to be
    adjacent (a batch's rows of one NIC), so a row is first compared with the one before.
    No Python object is made (:func:`_texts` makes the new strings' afterwards): the writer
    runs this without the GIL. -1 when out of memory."""
    cdef const int32_t* off = <const int32_t*>a.buffers[1] + a.offset + start
    cdef const char* data = <const char*>a.buffers[2]
    cdef const char* end = data + off[n]  # the strings' bytes end here, at least
    cdef const char* p
    cdef Bits valid = _bits(a)
    cdef int64_t i, m, slot, c, last = -1
    cdef uint64_t h, t
    cdef bint ascii
    for i in range(n):
        if (skip != NULL and skip[i]) or not _ok(valid, start + i):
            code[i] = -1
            continue
        p, m = data + off[i], off[i + 1] - off[i]
        if runs and last >= 0:
            c = code[last]
            if nb.rep_m[c] == m and _equal(nb.arena + nb.rep_o[c], nb.arena + nb.used, p, end, m):
                code[i] = <int32_t>c
                last = i
                continue
        last = i
        h = _hash_bytes(p, m, end, &ascii)
        slot = <int64_t>(h & <uint64_t>(nb.size - 1))
        while True:
            t = nb.table[slot]
            if t == 0:
                c = nb.count
                nb.table[slot] = _entry(h, c)
                if _keep(nb, p, m, h) < 0 or (2 * nb.count > nb.size and _grow(nb) < 0):
                    return -1
                break
            c = <int64_t>(t & 0xFFFFFFFFULL) - 1
            if (t ^ h) >> 32 == 0 and nb.rep_h[c] == h and nb.rep_m[c] == m and \
                    _equal(nb.arena + nb.rep_o[c], nb.arena + nb.used, p, end, m):
                break
            slot = (slot + 1) & (nb.size - 1)
        code[i] = <int32_t>c
    return 0


cdef list _texts(const Numbering* nb):
    """The numbered strings' text, in number order (undecodable bytes replaced: not a NIC or
    link id either way)."""
    cdef int64_t k
    cdef const char* p
    cdef list out = []
    for k in range(nb.count):
        p = nb.arena + nb.rep_o[k]
        out.append(_id_text(p, nb.rep_m[k], nb.rep_h[k], _ascii(p, nb.rep_m[k])))
    return out


cdef list _distinct(const ArrowArray* a, int64_t n, int32_t[::1] code):
    """The distinct strings of ``a`` by first appearance (``code``: each row's number)."""
    cdef Numbering nb
    try:
        if _numbering(&nb, n) < 0 or _number(&nb, a, 0, n, NULL, True, &code[0] if n else NULL) < 0:
            raise MemoryError()
        return _texts(&nb)
    finally:
        _numbering_free(&nb)


def scan(batch) -> Scan:
    """One pass over ``batch`` (a ``pyarrow.RecordBatch`` in ``WINDOW_SCHEMA``)."""
    cdef ArrowArray top
    top.release = NULL
    batch._export_to_c(<uintptr_t>&top)  # the array alone: its schema is known
    try:
        return _scan(&top)
    finally:
        if top.release != NULL:
            top.release(&top)


cdef Scan _scan(const ArrowArray* top):
    cdef int k
    cdef const ArrowArray** col = <const ArrowArray**>top.children
    cdef int64_t n = top.length
    cdef Scan s = Scan()
    cdef int64_t[::1] first = np.zeros(CHECK_COUNT, np.int64)
    cdef int64_t[::1] count = np.zeros(CHECK_COUNT, np.int64)
    s.first, s.count = first.base, count.base
    s.src, s.dst = [], []
    s.src_code, s.dst_code = np.zeros(n, np.int32), np.zeros(n, np.int32)
    s.end_max = INT64_MIN
    if top.n_children != N_COLUMNS or top.offset != 0:
        raise TypeError("not a WINDOW_SCHEMA record batch")
    if _offsets(col, n, &first[0], &count[0]):
        s.failed = True
        return s  # nothing else is read through offsets that are not ascending
    s.src = _distinct(col[SRC], n, s.src_code)
    s.dst = _distinct(col[DST], n, s.dst_code)
    # With the GIL held: ~10 us of work, and a collector thread that took the GIL meanwhile
    # would keep it for up to its switch interval (5 ms) before this request goes on.
    s.end_max = _rows(col, n, &first[0], &count[0])
    _path_text(col[PATH], n, &first[0], &count[0])
    for k in range(CHECK_COUNT):
        s.failed = s.failed or count[k] != 0
    return s


cdef bint _offsets(const ArrowArray** col, int64_t n, int64_t* first, int64_t* count) noexcept:
    """Check every offset the rows use; True when one is not ascending."""
    cdef int k
    cdef int64_t bad, lo
    cdef const int32_t* off
    cdef const ArrowArray* child
    cdef int[5] cols = [SRC, DST, HULL_T, HULL_OWD, TS_SOURCE]
    for k in range(5):
        bad = _ascending(<const int32_t*>col[cols[k]].buffers[1], col[cols[k]].offset, n)
        if bad >= 0:
            _hit(first, count, C_OFFSETS + k, bad)
    off = <const int32_t*>col[PATH].buffers[1]
    bad = _ascending(off, col[PATH].offset, n)
    if bad >= 0:
        _hit(first, count, C_PATH_OFFSETS, bad)
    elif n > 0:
        child = col[PATH].children[0]
        lo = off[col[PATH].offset]
        bad = _ascending(<const int32_t*>child.buffers[1], child.offset + lo,
                         off[col[PATH].offset + n] - lo)
        if bad >= 0:
            _hit(first, count, C_PATH_OFFSETS + 1, bad)
    for k in range(C_PATH_OFFSETS + 2):
        if count[k]:
            return True
    return False


cdef inline const void* _values(const ArrowArray* a, size_t width) noexcept nogil:
    """The value (or offsets) buffer, at the array's first row."""
    return <const char*>a.buffers[1] + a.offset * width


cdef int64_t _rows(const ArrowArray** col, int64_t n, int64_t* first, int64_t* count) noexcept nogil:
    # Every pointer and offset in a local: the writes to first/count (int64) could alias the
    # arrays' int64 fields, which the compiler would then reload on every row.
    cdef int64_t i, x, e, ns, nr, na, lt, ly, end_max = INT64_MIN
    cdef int c
    cdef Bits req[PURE + 1]
    cdef bint req_nulls = False
    cdef const int32_t* sport = <const int32_t*>_values(col[SPORT], 4)
    cdef const int64_t* start = <const int64_t*>_values(col[START], 8)
    cdef const int64_t* duration = <const int64_t*>_values(col[DURATION], 8)
    cdef const int32_t* sent = <const int32_t*>_values(col[SENT], 4)
    cdef const int32_t* received = <const int32_t*>_values(col[RECEIVED], 4)
    cdef const int32_t* pure = <const int32_t*>_values(col[PURE], 4)
    cdef const int32_t* acks = <const int32_t*>_values(col[ACKS_LOST], 4)
    cdef Bits sent_ok = _bits(col[SENT]), received_ok = _bits(col[RECEIVED])
    cdef Bits pure_ok = _bits(col[PURE]), acks_ok = _bits(col[ACKS_LOST])
    cdef const double* owd[4]
    cdef Bits owd_ok[4]
    cdef double v[4]
    cdef bint ok[4]
    cdef const int32_t* so = <const int32_t*>_values(col[SRC], 4)
    cdef const char* sd = <const char*>col[SRC].buffers[2]
    cdef const int32_t* do_ = <const int32_t*>_values(col[DST], 4)
    cdef const char* dd = <const char*>col[DST].buffers[2]
    cdef const int32_t* to = <const int32_t*>_values(col[TS_SOURCE], 4)
    cdef const char* td = <const char*>col[TS_SOURCE].buffers[2]
    cdef Bits ts_ok = _bits(col[TS_SOURCE])
    cdef const int32_t* ho = <const int32_t*>_values(col[HULL_T], 4)
    cdef const int32_t* yo = <const int32_t*>_values(col[HULL_OWD], 4)
    cdef Bits ho_ok = _bits(col[HULL_T]), yo_ok = _bits(col[HULL_OWD])
    for c in range(PURE + 1):
        req[c] = _bits(col[c])
        req_nulls = req_nulls or req[c].bits != NULL
    for c in range(4):
        owd[c] = <const double*>_values(col[OWD0 + c], 8)
        owd_ok[c] = _bits(col[OWD0 + c])
    for i in range(n):
        if req_nulls:
            for c in range(PURE + 1):
                if not _ok(req[c], i):
                    _hit(first, count, C_NULL + c, i)
        if so[i + 1] - so[i] == do_[i + 1] - do_[i] and _same(sd + so[i], dd + do_[i], so[i + 1] - so[i]):
            _hit(first, count, C_SAME, i)
        if sport[i] < 1 or sport[i] > 65535:
            _hit(first, count, C_SPORT, i)
        if duration[i] <= 0:
            _hit(first, count, C_DURATION, i)
        if start[i] < 0:
            _hit(first, count, C_START, i)
        # A window's end as numpy adds int64 (wrapping), for the collector's future check.
        e = <int64_t>(<uint64_t>start[i] + <uint64_t>duration[i])
        if e > end_max:
            end_max = e
        # Nulls read as 0 (they are no failure), as the numpy checks filled them.
        ns = sent[i] if _ok(sent_ok, i) else 0
        nr = received[i] if _ok(received_ok, i) else 0
        x = pure[i] if _ok(pure_ok, i) else 0
        na = acks[i] if _ok(acks_ok, i) else 0
        if ns < 0:
            _hit(first, count, C_NEG, i)
        if nr < 0:
            _hit(first, count, C_NEG + 1, i)
        if x < 0:
            _hit(first, count, C_NEG + 2, i)
        if na < 0:
            _hit(first, count, C_NEG + 3, i)
        if nr > ns:
            _hit(first, count, C_RECV_GT_SENT, i)
        if na > nr:
            _hit(first, count, C_ACKS_GT_RECV, i)
        for c in range(4):
            ok[c] = _ok(owd_ok[c], i)
            v[c] = owd[c][i] if ok[c] else 0.0
            if isnan(v[c]):
                _hit(first, count, C_NAN + 2 * c, i)
            elif isinf(v[c]):
                _hit(first, count, C_NAN + 2 * c + 1, i)
        for c in range(3):
            if ok[c] and ok[c + 1] and v[c] > v[c + 1]:
                _hit(first, count, C_ORDER + c, i)
        # hull lengths, a null list as empty
        lt = ho[i + 1] - ho[i] if _ok(ho_ok, i) else 0
        ly = yo[i + 1] - yo[i] if _ok(yo_ok, i) else 0
        if lt != ly:
            _hit(first, count, C_HULL_LEN, i)
        if not _ok(ts_ok, i) or not (_is(to, td, i, b"software", 8) or _is(to, td, i, b"hardware", 8)):
            _hit(first, count, C_TS_SOURCE, i)
    # null elements of the lists, counted as the flattened values
    _list_nulls(col[HULL_T], n, first, count, C_LIST_NULL)
    _list_nulls(col[HULL_OWD], n, first, count, C_LIST_NULL + 1)
    _list_nulls(col[PATH], n, first, count, C_LIST_NULL + 2)
    return end_max


cdef void _list_nulls(const ArrowArray* a, int64_t n, int64_t* first, int64_t* count,
                      int k) noexcept nogil:
    cdef const ArrowArray* child = a.children[0]
    cdef const int32_t* off = <const int32_t*>_values(a, 4)
    cdef Bits rows = _bits(a), elements = _bits(child)
    cdef int64_t i, j, flat = 0
    if elements.bits == NULL:
        return
    for i in range(n):
        if not _ok(rows, i):
            continue  # a null list has no elements, whatever its offsets span
        for j in range(off[i], off[i + 1]):
            if not _ok(elements, j):
                _hit(first, count, k, flat)
            flat += 1


cdef void _path_text(const ArrowArray* a, int64_t n, int64_t* first, int64_t* count):
    """Rows whose path holds a link id that is not UTF-8 (the writer names links in Python:
    one such row failed its whole commit group). Every byte is looked at, 8 at a time; only
    when one is not ASCII are the strings decoded one by one."""
    cdef const ArrowArray* child = a.children[0]
    cdef const int32_t* off = <const int32_t*>_values(a, 4)
    cdef const int32_t* soff = <const int32_t*>_values(child, 4)
    cdef const char* data = <const char*>child.buffers[2]
    cdef Bits rows = _bits(a)
    cdef int64_t lo, hi, k, i, j
    cdef uint64_t word, high = 0
    if n == 0 or off[n] == off[0]:
        return
    lo, hi = soff[off[0]], soff[off[n]]
    k = lo
    while k + 8 <= hi:
        memcpy(&word, data + k, 8)
        high |= word
        k += 8
    while k < hi:
        high |= <uint8_t>data[k]
        k += 1
    if high & 0x8080808080808080ULL == 0:
        return
    for i in range(n):
        if not _ok(rows, i):
            continue
        for j in range(off[i], off[i + 1]):
            try:
                PyUnicode_DecodeUTF8(data + soff[j], soff[j + 1] - soff[j], "strict")
            except UnicodeDecodeError:
                _hit(first, count, C_PATH_TEXT, i)
                break


# ---- the writer's storage layout (fleetlens.api.codec) ------------------------------------
cdef class Codes:
    """Record batches' strings as numbers (:func:`codes`): the distinct NIC ids (of
    ``src_nic`` and ``dst_nic`` together), ``ts_source`` values and link ids (of ``path``'s
    elements), each by first appearance, and per row (per element for links; int32) its
    number among them, -1 where null. Row ``i``'s path is
    ``link_code[path_off[i]:path_off[i + 1]]``; ``path_valid`` (uint8 per row) is None when
    no path is null."""

    cdef public object nics, ts, links, src_code, dst_code, ts_code, link_code
    cdef public object path_off, path_valid


def codes(list batches) -> Codes:
    """Number the strings of ``batches`` (``pyarrow.RecordBatch``es in ``WINDOW_SCHEMA``
    whose offsets ascend: :func:`scan` accepted each, or the collector made it), rows of all
    of them in order, for the writer: it then looks up only each distinct string of a commit
    group in its dictionaries (hashing every row's NIC and link ids in Arrow and numpy cost
    ~0.2 ms a batch). A null link id in a path that is not null raises ``ValueError`` (no
    checked batch has one)."""
    cdef Py_ssize_t k, nb = len(batches)
    cdef ArrowArray* tops = <ArrowArray*>PyMem_Malloc((nb + 1) * sizeof(ArrowArray))
    if tops == NULL:
        raise MemoryError()
    for k in range(nb):
        tops[k].release = NULL
    try:
        for k in range(nb):
            batches[k]._export_to_c(<uintptr_t>&tops[k])
        return _codes(tops, nb)
    finally:
        for k in range(nb):
            if tops[k].release != NULL:
                tops[k].release(&tops[k])
        PyMem_Free(tops)


cdef Codes _codes(ArrowArray* tops, Py_ssize_t nb):
    cdef Py_ssize_t b
    cdef int64_t rows = 0, elems = 0, n, i, j, lo, at = 0, el = 0
    cdef const ArrowArray** col
    cdef const ArrowArray* path
    cdef const ArrowArray* child
    cdef const int32_t* off
    cdef Bits valid_rows, valid_elements
    cdef bint any_null = False
    cdef Numbering nics, ts, links
    cdef Codes c = Codes()
    for b in range(nb):
        col = <const ArrowArray**>tops[b].children
        if tops[b].n_children != N_COLUMNS or tops[b].offset != 0:
            raise TypeError("not a WINDOW_SCHEMA record batch")
        n = tops[b].length
        off = <const int32_t*>_values(col[PATH], 4)
        rows += n
        elems += off[n] - off[0] if n else 0
    if elems >= 2**31:
        raise ValueError("too many path elements for one group")
    cdef int32_t[::1] src = np.empty(rows, np.int32), dst = np.empty(rows, np.int32)
    cdef int32_t[::1] tsc = np.empty(rows, np.int32), link = np.empty(elems, np.int32)
    cdef int32_t[::1] row_off = np.empty(rows + 1, np.int32)
    cdef uint8_t[::1] valid = np.ones(rows, np.uint8), skip = np.zeros(elems, np.uint8)
    cdef int failed = 0  # 1: out of memory, 2: a null link id (in row ``bad``)
    cdef int64_t bad = -1
    try:
        # Without the GIL: the writer thread's ~0.1 ms a batch here would hold up the event
        # loop (HTTP, or the workers' link) on the other core.
        with nogil:
            if _numbering(&nics, 2 * rows) < 0 or _numbering(&ts, rows) < 0 or \
                    _numbering(&links, elems) < 0:
                failed = 1
            b = 0
            while b < nb and failed == 0:
                col = <const ArrowArray**>tops[b].children
                n = tops[b].length
                b += 1
                if n == 0:
                    continue
                if _number(&nics, col[SRC], 0, n, NULL, True, &src[at]) < 0 or \
                        _number(&nics, col[DST], 0, n, NULL, True, &dst[at]) < 0 or \
                        _number(&ts, col[TS_SOURCE], 0, n, NULL, True, &tsc[at]) < 0:
                    failed = 1
                    break
                path, child = col[PATH], col[PATH].children[0]
                off = <const int32_t*>_values(path, 4)
                valid_rows, valid_elements = _bits(path), _bits(child)
                lo = off[0]
                for i in range(n):
                    row_off[at + i] = <int32_t>(el + off[i] - lo)
                    if _ok(valid_rows, i):
                        for j in range(off[i], off[i + 1]):
                            if not _ok(valid_elements, j) and failed == 0:
                                failed, bad = 2, i
                    else:
                        valid[at + i] = 0
                        any_null = True
                        for j in range(off[i] - lo, off[i + 1] - lo):
                            skip[el + j] = 1
                if failed == 0 and off[n] > lo and \
                        _number(&links, child, lo, off[n] - lo, &skip[el], False, &link[el]) < 0:
                    failed = 1
                at += n
                el += off[n] - lo
            row_off[rows] = <int32_t>el
        if failed == 1:
            raise MemoryError()
        if failed == 2:
            raise ValueError(f"path of row {bad}: a null link id")
        c.nics, c.ts, c.links = _texts(&nics), _texts(&ts), _texts(&links)
    finally:
        _numbering_free(&nics)
        _numbering_free(&ts)
        _numbering_free(&links)
    c.src_code, c.dst_code, c.ts_code, c.link_code = src.base, dst.base, tsc.base, link.base
    c.path_off = row_off.base
    c.path_valid = valid.base if any_null else None
    return c


cdef inline uint64_t _hash_list(const int32_t* v, int64_t m, uint64_t mask) noexcept nogil:
    """A list's hash (a polynomial over its values and length, then the finalizer; uint64
    arithmetic wraps), ``& mask`` (all ones but in tests of collisions)."""
    cdef uint64_t h = <uint64_t>m * _LEN
    cdef int64_t k
    for k in range(m):
        h = h * _K + <uint64_t><int64_t>v[k]
    return _mix(h) & mask


def hash_lists(const int32_t[::1] off, const int32_t[::1] values, uint64_t mask):
    """The hash of each list ``values[off[i]:off[i + 1]]`` (uint64), as :func:`intern_lists`
    hashes it."""
    cdef int64_t n = off.shape[0] - 1, i
    out = np.empty(n, np.uint64)
    cdef uint64_t[::1] h = out
    for i in range(n):
        h[i] = _hash_list(&values[0] + off[i] if off[i + 1] > off[i] else NULL,
                          off[i + 1] - off[i], mask)
    return out


cdef extern from *:
    void __builtin_prefetch(const void* p) nogil

cdef enum:
    _BLOCK = 64  # rows whose memory is asked for before any of it is read


def intern_lists(const int32_t[::1] off, const int32_t[::1] values, const uint8_t[::1] valid,
                 int32_t[::1] slots, uint64_t[::1] hash_of, int32_t[::1] stored_off,
                 int32_t[::1] stored, int64_t count, uint64_t mask, int64_t start,
                 int32_t[::1] ids):
    """The id of each row's list of int32 (``values[off[i]:off[i + 1]]``) in a
    ``fleetlens.api.codec.PathDict`` of ``count`` lists, into ``ids``, from row ``start``:
    a list not found is appended (``stored_off``, ``stored``: each id's list; ``hash_of``: its
    hash; ``slots``: open addressing by hash, -1 empty, at most half full). -1 where a list's
    hash belongs to another list (the caller interns it), -2 where ``valid`` (None: every row)
    says the row is null. Every id found is checked against its stored list: ids stay exact.

    Returns (the row it stopped at, the lists now): ``off.shape[0] - 1`` when done, else a
    row whose new list did not fit the arrays (the caller grows them and calls again from it).

    A fleet's path dictionary (~10^6 paths at 1024 hosts) is far larger than the CPU's
    caches and each row reads it at random, so rows go by blocks: their slots are fetched
    ahead, then their ids' hashes and offsets, then the lists compared."""
    cdef (int64_t, int64_t) got
    with nogil:  # as codes(): the event loop goes on meanwhile
        got = _intern(off, values, valid, slots, hash_of, stored_off, stored, count, mask,
                      start, ids)
    return got


cdef (int64_t, int64_t) _intern(const int32_t[::1] off, const int32_t[::1] values,
                                const uint8_t[::1] valid, int32_t[::1] slots,
                                uint64_t[::1] hash_of, int32_t[::1] stored_off,
                                int32_t[::1] stored, int64_t count, uint64_t mask,
                                int64_t start, int32_t[::1] ids) noexcept nogil:
    cdef int64_t n = off.shape[0] - 1, i, b, e, k, m, end
    cdef int64_t size = slots.shape[0], cap_ids = min(hash_of.shape[0], stored_off.shape[0] - 1)
    cdef int64_t pos[_BLOCK]
    cdef uint64_t hs[_BLOCK]
    cdef int32_t s
    cdef uint64_t h
    cdef bint same
    b = start
    while b < n:
        e = min(n, b + _BLOCK)
        for i in range(b, e):
            m = off[i + 1] - off[i]
            hs[i - b] = _hash_list(&values[0] + off[i] if m else NULL, m, mask)
            pos[i - b] = <int64_t>(hs[i - b] & <uint64_t>(size - 1))
            __builtin_prefetch(&slots[pos[i - b]])
        for i in range(b, e):
            s = slots[pos[i - b]]
            if s >= 0:
                __builtin_prefetch(&hash_of[s])
                __builtin_prefetch(&stored_off[s])
        for i in range(b, e):
            if valid is not None and not valid[i]:
                ids[i] = -2
                continue
            m, h = off[i + 1] - off[i], hs[i - b]
            while True:
                s = slots[pos[i - b]]
                if s < 0:  # new: appended, if it fits
                    end = stored_off[count]
                    if count + 1 > cap_ids or end + m > stored.shape[0] or 2 * (count + 1) > size:
                        return i, count
                    for k in range(m):
                        stored[end + k] = values[off[i] + k]
                    stored_off[count + 1] = <int32_t>(end + m)
                    hash_of[count] = h
                    slots[pos[i - b]] = <int32_t>count
                    ids[i] = <int32_t>count
                    count += 1
                    break
                if hash_of[s] == h:
                    same = stored_off[s + 1] - stored_off[s] == m
                    k = 0
                    while same and k < m:
                        same = stored[stored_off[s] + k] == values[off[i] + k]
                        k += 1
                    ids[i] = s if same else -1  # the table holds one id per hash
                    break
                pos[i - b] = (pos[i - b] + 1) & (size - 1)
        b = e
    return n, count
