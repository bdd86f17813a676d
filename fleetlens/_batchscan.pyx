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
from libc.string cimport memcpy
from libc.stdint cimport INT64_MIN, int32_t, int64_t, uint8_t, uint64_t, uintptr_t

import numpy as np

cdef extern from *:
    """
    /* The Arrow C data interface's array (https://arrow.apache.org/docs/format/CDataInterface.html) */
    struct FlArrowArray {
        int64_t length;
        int64_t null_count;
        int64_t offset;
        int64_t n_buffers;
        int64_t n_children;
        const void** buffers;
        struct FlArrowArray** children;
        struct FlArrowArray* dictionary;
        void (*release)(struct FlArrowArray*);
        void* private_data;
    };
    """
    struct FlArrowArray:
        int64_t length
        int64_t null_count
        int64_t offset
        int64_t n_buffers
        int64_t n_children
        const void** buffers
        FlArrowArray** children
        void (*release)(FlArrowArray*)

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

cdef uint64_t _FNV_OFF = 1469598103934665603ULL
cdef uint64_t _FNV_PRIME = 1099511628211ULL

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL

# The NIC ids' str objects, kept across batches: a fleet names a bounded set of NICs, and the
# same object every batch has its hash cached for the set lookups that follow (the id syntax
# memo, the known NICs), where fresh ones were hashed again each time. Open addressing by
# the bytes' hash; emptied when half full (ids sent by a misbehaving agent cannot grow it).
cdef enum:
    _IDS_SLOTS = 1 << 17
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


cdef inline bint _same(const char* a, const char* b, int64_t m) noexcept nogil:
    """memcmp(a, b, m) == 0 without a call for the short ids of a batch."""
    cdef int64_t k
    for k in range(m):
        if a[k] != b[k]:
            return False
    return True


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


cdef int _distinct(const FlArrowArray* a, int64_t n, int32_t[::1] code, list out) except -1:
    """Number the distinct strings of ``a`` by first appearance (``code`` per row), their
    text appended to ``out`` (undecodable bytes replaced: not a NIC id either way)."""
    cdef const int32_t* off = <const int32_t*>a.buffers[1]
    cdef const char* data = <const char*>a.buffers[2]
    cdef int64_t size = 16, i, k, o, m, slot, j
    cdef int64_t* table
    cdef int64_t* rep
    cdef uint64_t h
    cdef uint8_t high
    cdef int32_t c = 0
    while size < 2 * n:
        size <<= 1
    table = <int64_t*>PyMem_Malloc(size * sizeof(int64_t))
    rep = <int64_t*>PyMem_Malloc((n + 1) * sizeof(int64_t))  # row of each distinct string
    if table == NULL or rep == NULL:
        PyMem_Free(table)
        PyMem_Free(rep)
        raise MemoryError()
    try:
        for k in range(size):
            table[k] = -1
        for i in range(n):
            o = a.offset + i
            m = off[o + 1] - off[o]
            if i > 0:
                j = o - 1
                if off[j + 1] - off[j] == m and _same(data + off[j], data + off[o], m):
                    code[i] = code[i - 1]
                    continue
            h = _FNV_OFF
            high = 0
            for k in range(m):
                h = (h ^ <uint8_t>data[off[o] + k]) * _FNV_PRIME
                high |= <uint8_t>data[off[o] + k]
            slot = <int64_t>(h & <uint64_t>(size - 1))
            while True:
                if table[slot] < 0:
                    table[slot] = c
                    rep[c] = o
                    code[i] = c
                    c += 1
                    out.append(_id_text(data + off[o], m, h, high < 0x80))
                    break
                j = rep[table[slot]]
                if off[j + 1] - off[j] == m and _same(data + off[j], data + off[o], m):
                    code[i] = <int32_t>table[slot]
                    break
                slot = (slot + 1) & (size - 1)
    finally:
        PyMem_Free(table)
        PyMem_Free(rep)
    return 0


def scan(batch) -> Scan:
    """One pass over ``batch`` (a ``pyarrow.RecordBatch`` in ``WINDOW_SCHEMA``)."""
    cdef FlArrowArray top
    top.release = NULL
    batch._export_to_c(<uintptr_t>&top)  # the array alone: its schema is known
    try:
        return _scan(&top)
    finally:
        if top.release != NULL:
            top.release(&top)


cdef Scan _scan(const FlArrowArray* top):
    cdef int k
    cdef const FlArrowArray** col = <const FlArrowArray**>top.children
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
    _distinct(col[SRC], n, s.src_code, s.src)
    _distinct(col[DST], n, s.dst_code, s.dst)
    # With the GIL held: ~10 us of work, and a collector thread that took the GIL meanwhile
    # would keep it for up to its switch interval (5 ms) before this request goes on.
    s.end_max = _rows(col, n, &first[0], &count[0])
    _path_text(col[PATH], n, &first[0], &count[0])
    for k in range(CHECK_COUNT):
        s.failed = s.failed or count[k] != 0
    return s


cdef bint _offsets(const FlArrowArray** col, int64_t n, int64_t* first, int64_t* count) noexcept:
    """Check every offset the rows use; True when one is not ascending."""
    cdef int k
    cdef int64_t bad, lo
    cdef const int32_t* off
    cdef const FlArrowArray* child
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


cdef struct Bits:
    const uint8_t* bits  # NULL: no nulls
    int64_t offset


cdef inline Bits _bits(const FlArrowArray* a) noexcept nogil:
    cdef Bits b
    b.bits = <const uint8_t*>a.buffers[0] if a.null_count != 0 else NULL
    b.offset = a.offset
    return b


cdef inline bint _ok(Bits b, int64_t i) noexcept nogil:
    cdef int64_t j
    if b.bits == NULL:
        return True
    j = b.offset + i
    return (b.bits[j >> 3] >> (j & 7)) & 1


cdef inline const void* _values(const FlArrowArray* a, size_t width) noexcept nogil:
    """The value (or offsets) buffer, at the array's first row."""
    return <const char*>a.buffers[1] + a.offset * width


cdef int64_t _rows(const FlArrowArray** col, int64_t n, int64_t* first, int64_t* count) noexcept nogil:
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


cdef void _list_nulls(const FlArrowArray* a, int64_t n, int64_t* first, int64_t* count,
                      int k) noexcept nogil:
    cdef const FlArrowArray* child = a.children[0]
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


cdef void _path_text(const FlArrowArray* a, int64_t n, int64_t* first, int64_t* count):
    """Rows whose path holds a link id that is not UTF-8 (the writer names links in Python:
    one such row failed its whole commit group). Every byte is looked at, 8 at a time; only
    when one is not ASCII are the strings decoded one by one."""
    cdef const FlArrowArray* child = a.children[0]
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
