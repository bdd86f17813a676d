# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Per-group loops of the clock solve over a CSR layout: points grouped once by a stable
counting sort (``group_points``), each group then one pass over its own points.

The numpy forms padded every group to the widest one ((groups, width) matrices: a 1024-host
window has ~130 k directed NIC pairs of up to a few hundred points) and sorted millions of
points to group them; that was most of a collector round. Same arithmetic and tie rules as the
padded forms (first index among equal values, hulls as :func:`fleetlens.hull.lower_hull_rows`:
collinear points dropped, equal ``t`` keeps the lowest ``y``), so results are bit-identical;
the edge fits' slope is the exact optimum (:func:`slope_edges`).
"""

import numpy as np

from libc.math cimport INFINITY
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.stdlib cimport free, malloc, qsort, realloc
from libc.string cimport memmove
from cpython.pycapsule cimport PyCapsule_GetPointer

from arrow_abi cimport ArrowArray, ArrowArrayStream, bit_set


cdef struct Pt:
    int64_t t
    int64_t y


cdef inline bint _le(Pt a, Pt b) noexcept nogil:
    return a.t < b.t or (a.t == b.t and a.y <= b.y)


cdef inline void _merge(
    const Pt *x, Py_ssize_t nx, const Pt *y, Py_ssize_t ny, Pt *out
) noexcept nogil:
    """Two sorted runs into ``out``, ``x``'s point first on a tie."""
    cdef Py_ssize_t a = 0, b = 0, w = 0
    while a < nx and b < ny:
        if _le(x[a], y[b]):
            out[w] = x[a]
            a += 1
        else:
            out[w] = y[b]
            b += 1
        w += 1
    while a < nx:
        out[w] = x[a]
        a += 1
        w += 1
    while b < ny:
        out[w] = y[b]
        b += 1
        w += 1


cdef Pt *_merge_runs(Pt *buf, Pt *tmp, Py_ssize_t n) noexcept nogil:
    """Sort ``buf[:n]`` by (t, y) by merging its ascending runs pairwise until one is left
    (a group is a few sorted runs: the paths of a pair, the blocks of a span); returns the
    buffer that holds the result."""
    cdef Py_ssize_t i, j, l, runs = 2
    cdef Pt *swap
    while runs > 1:
        runs = 0
        i = 0
        while i < n:
            j = i + 1
            while j < n and _le(buf[j - 1], buf[j]):
                j += 1
            l = j + 1 if j < n else j
            while l < n and _le(buf[l - 1], buf[l]):
                l += 1
            _merge(buf + i, j - i, buf + j, l - j, tmp + i)
            runs += 1
            i = l
        swap = buf
        buf = tmp
        tmp = swap
    return buf


def group_points(
    const int64_t[::1] edge,
    const unsigned char[::1] upper,
    const double[::1] t,
    const double[::1] y,
    Py_ssize_t n_edges,
):
    """The edge fits' CSR rows (edge ``e``'s upper points row ``2e``, its lower points row
    ``2e + 1``) by a stable counting sort, with the points' ``t`` and ``y`` gathered into
    row order in the same pass: ``(offsets, t, y)``, what a stable sort by ``2·edge +
    ~upper`` and two gathers through its order give, without the order array."""
    cdef Py_ssize_t m = edge.shape[0], n = 2 * n_edges, k, i, r
    off_a = np.zeros(n + 1, np.int64)
    tc_a = np.empty(m, np.float64)
    yc_a = np.empty(m, np.float64)
    pos_a = np.empty(max(n, 1), np.int64)
    cdef int64_t[::1] off = off_a, pos = pos_a
    cdef double[::1] tc = tc_a, yc = yc_a
    with nogil:
        for k in range(m):
            off[2 * edge[k] + (upper[k] == 0) + 1] += 1
        for i in range(n):
            off[i + 1] += off[i]
            pos[i] = off[i]
        for k in range(m):
            r = 2 * edge[k] + (upper[k] == 0)
            tc[pos[r]] = t[k]
            yc[pos[r]] = y[k]
            pos[r] += 1
    return off_a, tc_a, yc_a


def run_gaps(
    const int64_t[::1] edge,
    const unsigned char[::1] upper,
    const double[::1] t,
    const double[::1] y,
    const double[:, ::1] line0,
    const double[::1] carry,
    double[:, ::1] lo_gap,
    double[:, ::1] hi_gap,
) -> None:
    """Per span ``k`` and edge ``e``, how far the edge's points sit from the span's line
    ``line0[k, e] + carry[e]·t`` on their side: ``lo_gap`` the least ``y − line`` of its
    upper points, ``hi_gap`` the least ``line − y`` of its lower ones (left as given, inf,
    where there are none). The same values as the numpy form's per-point residuals, in one
    pass over the points for every span."""
    cdef Py_ssize_t n = edge.shape[0], spans = line0.shape[0], i, k
    cdef int64_t e
    cdef double v
    with nogil:
        for i in range(n):
            e = edge[i]
            for k in range(spans):
                v = y[i] - (line0[k, e] + carry[e] * t[i])
                if upper[i]:
                    if v < lo_gap[k, e]:
                        lo_gap[k, e] = v
                else:
                    v = -v
                    if v < hi_gap[k, e]:
                        hi_gap[k, e] = v


cdef Py_ssize_t _group_hull(
    Pt *mem,
    Py_ssize_t width,
    const int64_t[::1] t,
    const int64_t[::1] y,
    const int64_t[::1] order,
    bint indexed,
    Py_ssize_t k0,
    Py_ssize_t k1,
    int64_t[::1] ht,
    int64_t[::1] hy,
    Py_ssize_t w,
) noexcept nogil:
    """The lower hull of points ``k0..k1`` (through ``order`` if ``indexed``) written to
    ``ht``/``hy`` from ``w`` on; returns its size."""
    cdef Pt *buf = mem
    cdef Py_ssize_t k, j, m = k1 - k0
    cdef bint ordered = True
    for k in range(m):
        j = order[k0 + k] if indexed else k0 + k
        buf[k].t = t[j]
        buf[k].y = y[j]
        if k and not _le(buf[k - 1], buf[k]):
            ordered = False
    if not ordered:
        buf = _merge_runs(mem, mem + width, m)
    return _chain(buf, m, ht, hy, w)


cdef Py_ssize_t _chain(
    const Pt *buf, Py_ssize_t m, int64_t[::1] ht, int64_t[::1] hy, Py_ssize_t w
) noexcept nogil:
    """Andrew's monotone chain over ``buf[:m]`` sorted by (t, y), written to ``ht``/``hy``
    from ``w`` on; returns the hull's size."""
    cdef Py_ssize_t k, h = 0
    cdef int64_t pt, py, ot, oy, at, ay
    cdef double cross
    for k in range(m):
        pt = buf[k].t
        py = buf[k].y
        while h >= 2:
            ot = ht[w + h - 2]
            oy = hy[w + h - 2]
            at = ht[w + h - 1]
            ay = hy[w + h - 1]
            cross = <double>(at - ot) * <double>(py - oy) - <double>(ay - oy) * <double>(pt - ot)
            if cross > 0:
                break
            h -= 1
        if h > 0 and ht[w + h - 1] == pt:
            continue  # same t, larger y: never on the lower hull
        ht[w + h] = pt
        hy[w + h] = py
        h += 1
    return h


def hull_groups(
    const int64_t[::1] off,
    const int64_t[::1] order,
    const int64_t[::1] t,
    const int64_t[::1] y,
):
    """Lower hull of each group's points (``order[off[g]:off[g + 1]]`` index ``t``/``y``):
    ``(size, hull_t, hull_y)``, group ``g``'s hull the next ``size[g]`` points in t order."""
    cdef Py_ssize_t n = off.shape[0] - 1, m = order.shape[0], g, w = 0, width = 1
    for g in range(n):
        width = max(width, off[g + 1] - off[g])
    size_a = np.zeros(max(n, 0), np.int64)
    ht_a = np.empty(m, np.int64)
    hy_a = np.empty(m, np.int64)
    cdef int64_t[::1] size = size_a, ht = ht_a, hy = hy_a
    cdef Pt *mem = <Pt *>malloc(2 * width * sizeof(Pt))
    if mem == NULL:
        raise MemoryError()
    try:
        with nogil:
            for g in range(n):
                size[g] = _group_hull(mem, width, t, y, order, True, off[g], off[g + 1], ht, hy, w)
                w += size[g]
    finally:
        free(mem)
    return size_a, ht_a[:w], hy_a[:w]


cdef struct Fp:
    double t
    double y


cdef int _fp_cmp(const void *a, const void *b) noexcept nogil:
    cdef const Fp *p = <const Fp *>a
    cdef const Fp *q = <const Fp *>b
    if p.t != q.t:
        return -1 if p.t < q.t else 1
    if p.y != q.y:
        return -1 if p.y < q.y else 1
    return 0


cdef Py_ssize_t _float_hull(
    const double[::1] t, const double[::1] y, Py_ssize_t k0, Py_ssize_t k1, double sign,
    Fp *buf, Fp *hull
) noexcept nogil:
    """Lower hull of the points ``(t, sign·y)`` ``k0..k1`` (any order) into ``hull``, by t;
    returns its size. Equal t keeps the lowest; collinear points are dropped."""
    cdef Py_ssize_t k, m = k1 - k0, h = 0
    cdef bint ordered = True
    cdef double cross
    for k in range(m):
        buf[k].t = t[k0 + k]
        buf[k].y = sign * y[k0 + k]
        if k and (buf[k].t < buf[k - 1].t or (buf[k].t == buf[k - 1].t and buf[k].y < buf[k - 1].y)):
            ordered = False
    if not ordered:
        qsort(buf, m, sizeof(Fp), _fp_cmp)
    for k in range(m):
        while h >= 2:
            cross = (hull[h - 1].t - hull[h - 2].t) * (buf[k].y - hull[h - 2].y) - (
                hull[h - 1].y - hull[h - 2].y) * (buf[k].t - hull[h - 2].t)
            if cross > 0:
                break
            h -= 1
        if h > 0 and hull[h - 1].t == buf[k].t:
            continue  # same t, larger y: never on the lower hull
        hull[h] = buf[k]
        h += 1
    return h


cdef double _walk(const Fp *up, Py_ssize_t nu, const Fp *low, Py_ssize_t nl) noexcept nogil:
    """The max-margin slope between the upper set's lower hull ``up`` and the lower set's
    upper hull, given as the lower hull of its negated points ``low`` (both by t): the
    largest slope ``b`` at which ``t_low*(b) − t_up*(b)``, the margin's supergradient, is
    still positive (−inf if never, +inf if always). Both active points move only at hull
    edge slopes, so the chains are walked once in order of those slopes."""
    cdef Py_ssize_t j = 0, k = nl - 1
    cdef double b = -INFINITY, su, sl
    while low[k].t > up[j].t:
        su = (up[j + 1].y - up[j].y) / (up[j + 1].t - up[j].t) if j + 1 < nu else INFINITY
        # the upper hull's edge slope, k - 1 -> k (negated back)
        sl = -(low[k].y - low[k - 1].y) / (low[k].t - low[k - 1].t) if k > 0 else INFINITY
        if su <= sl:
            b = su
            j += 1
        else:
            b = sl
            k -= 1
        if b == INFINITY:
            break
    return b


def slope_edges(
    const int64_t[::1] off,
    const double[::1] t,
    const double[::1] y,
    const double[::1] b_prior,
    const double[::1] bracket,
    double[::1] out,
    double[::1] span,
) -> None:
    """Edge ``i``'s upper points are CSR row ``2i``, its lower points row ``2i + 1``:
    ``out[i]`` the slope of its max-margin line clamped to ``b_prior ± bracket`` (the
    bracket's middle where a side is empty), ``span[i]`` how far apart in t its points are
    (0: none). Exact: the optimum of the concave margin is a hull edge's slope, found by one
    walk along both hulls (:func:`_walk`)."""
    cdef Py_ssize_t edges = b_prior.shape[0], i, k, u0, u1, l1, width = 1, nu, nl
    cdef double lo, hi, b, tmin, tmax
    for i in range(2 * edges):
        width = max(width, off[i + 1] - off[i])
    cdef Fp *mem = <Fp *>malloc(3 * width * sizeof(Fp))
    if mem == NULL:
        raise MemoryError()
    try:
        with nogil:
            for i in range(edges):
                u0, u1, l1 = off[2 * i], off[2 * i + 1], off[2 * i + 2]
                if l1 > u0:
                    tmin = t[u0]
                    tmax = t[u0]
                    for k in range(u0 + 1, l1):
                        tmin = min(tmin, t[k])
                        tmax = max(tmax, t[k])
                    span[i] = tmax - tmin
                else:
                    span[i] = 0.0
                lo = b_prior[i] - bracket[i]
                hi = b_prior[i] + bracket[i]
                if u1 == u0 or l1 == u1:
                    out[i] = 0.5 * (lo + hi)  # unusable: the caller keeps the prior
                    continue
                nu = _float_hull(t, y, u0, u1, 1.0, mem, mem + width)
                nl = _float_hull(t, y, u1, l1, -1.0, mem, mem + 2 * width)
                b = _walk(mem + width, nu, mem + 2 * width, nl)
                out[i] = min(max(b, lo), hi)
    finally:
        free(mem)


def floors(
    const int64_t[::1] off,
    const double[::1] t,
    const double[::1] y,
    const double[::1] b,
    double[::1] f,
    double[::1] g,
) -> None:
    """At edge ``i``'s slope ``b[i]``: ``f[i]`` the lowest ``y − b·t`` of its upper points
    (inf if none), ``g[i]`` the highest of its lower points (−inf if none)."""
    cdef Py_ssize_t edges = b.shape[0], i, k
    cdef double v, lo, hi
    with nogil:
        for i in range(edges):
            lo = INFINITY
            for k in range(off[2 * i], off[2 * i + 1]):
                v = y[k] - b[i] * t[k]
                if v < lo:
                    lo = v
            hi = -INFINITY
            for k in range(off[2 * i + 1], off[2 * i + 2]):
                v = y[k] - b[i] * t[k]
                if v > hi:
                    hi = v
            f[i] = lo
            g[i] = hi


cdef Py_ssize_t _chain_pts(const Pt *buf, Py_ssize_t m, Pt *out) noexcept nogil:
    """:func:`_chain` into a point buffer."""
    cdef Py_ssize_t k, h = 0
    cdef double cross
    for k in range(m):
        while h >= 2:
            cross = <double>(out[h - 1].t - out[h - 2].t) * <double>(buf[k].y - out[h - 2].y) - (
                <double>(out[h - 1].y - out[h - 2].y) * <double>(buf[k].t - out[h - 2].t))
            if cross > 0:
                break
            h -= 1
        if h > 0 and out[h - 1].t == buf[k].t:
            continue  # same t, larger y: never on the lower hull
        out[h] = buf[k]
        h += 1
    return h


cdef Py_ssize_t _runs_hull(const Pt *pts, Py_ssize_t n, Pt *hull, Pt *tmp) noexcept nogil:
    """The lower hull of ``pts[:n]``, a few runs sorted by (t, y) (a pair's paths), into
    ``hull``; returns its size. The first run is chained; each point of a later run that
    goes under the hull so far (or past its ends) is inserted into it (:func:`_insert`),
    points on or above it are no vertex of the union's hull (the chain drops collinear
    points and a higher point at an equal t) and are passed over (:func:`_below`). The hull
    stays the strict lower hull of the points so far, the same vertices as one sort and
    chain of them all (the cross products of in-window differences are exact in doubles),
    at a few hull points per inserted point. ``hull`` and ``tmp`` hold ``n`` points each."""
    cdef Py_ssize_t h = 0, k = 0, r0, j, s
    while k < n:
        r0 = k
        k += 1
        while k < n and _le(pts[k - 1], pts[k]):
            k += 1
        if h < 2:  # the first run (or a hull of one point): merged and chained
            h = _merge_chain(hull, h, pts + r0, k - r0, tmp)
            continue
        s = 0
        for j in range(r0, k):
            if _below(hull, h, &s, pts[j]):
                h = _insert(hull, h, &s, pts[j])
    return h


cdef inline bint _below(const Pt *hull, Py_ssize_t h, Py_ssize_t *s, Pt p) noexcept nogil:
    """Whether ``p`` lies strictly below the lower hull ``hull[:h]`` or outside its time
    range, points asked in (t, y) order (``s``: the segment reached so far). A point on or
    above it is above or on the hull of any superset: never one of its vertices (the chain
    drops collinear points and a higher point at an equal t), so leaving it out changes no
    vertex. The cross product is the chain's own, exact on in-window differences."""
    cdef double cross
    if h < 2 or p.t < hull[0].t or p.t > hull[h - 1].t:
        return True
    s[0] = min(s[0], h - 2)  # an insertion may have left it at the last vertex
    while hull[s[0] + 1].t < p.t:
        s[0] += 1
    cross = <double>(hull[s[0] + 1].t - hull[s[0]].t) * <double>(p.y - hull[s[0]].y) - (
        <double>(hull[s[0] + 1].y - hull[s[0]].y) * <double>(p.t - hull[s[0]].t))
    return cross < 0


cdef Py_ssize_t _merge_chain(
    Pt *hull, Py_ssize_t h, const Pt *run, Py_ssize_t r, Pt *tmp
) noexcept nogil:
    """The hull of ``hull[:h]`` and a sorted run, by one merge and a chain."""
    _merge(hull, h, run, r, tmp)
    return _chain_pts(tmp, h + r, hull)


cdef inline double _cross(Pt a, Pt b, Pt c) noexcept nogil:
    """The chain's turn test: > 0 where ``b`` is a vertex between ``a`` and ``c``."""
    return <double>(b.t - a.t) * <double>(c.y - a.y) - <double>(b.y - a.y) * <double>(c.t - a.t)


cdef Py_ssize_t _insert(Pt *hull, Py_ssize_t h, Py_ssize_t *s, Pt p) noexcept nogil:
    """``p`` (under the strict lower hull ``hull[:h]``, h ≥ 2, or past its ends) made a
    vertex: the vertices it hides on each side removed (those that no longer turn left:
    the chain's test), a vertex at its t replaced. ``s``: the segment :func:`_below` found
    (``hull[s].t <= p.t <= hull[s + 1].t`` within the range), left at ``p``. Returns the
    new size."""
    cdef Py_ssize_t i, j
    if p.t < hull[0].t:
        i, j = -1, 0
    elif p.t > hull[h - 1].t:
        i, j = h - 1, h
    else:
        i = s[0] if hull[s[0]].t < p.t else s[0] - 1
        j = s[0] + 1 if hull[s[0] + 1].t > p.t else s[0] + 2
    while i >= 1 and _cross(hull[i - 1], hull[i], p) <= 0:
        i -= 1
    while j + 1 < h and _cross(p, hull[j], hull[j + 1]) <= 0:
        j += 1
    if j != i + 2:
        memmove(&hull[i + 2], &hull[j], (h - j) * sizeof(Pt))
    hull[i + 1] = p
    s[0] = i + 1
    return i + 2 + h - j


def pair_hulls(
    const int64_t[::1] src,
    const int64_t[::1] dst,
    const int64_t[::1] t,
    const int64_t[::1] y,
    int64_t n_nic,
):
    """Lower hull of each directed pair's points, given points grouped by pair in ascending
    ``src·n_nic + dst`` (a pair's points in any order): ``(src, dst, t, y)`` of the hull
    points, pair by pair; None where the points are not so grouped."""
    cdef Py_ssize_t n = src.shape[0], k, start = 0, end, width = 1, w = 0, h
    cdef int64_t code, prev = -1
    cdef bint grouped = True
    with nogil:
        for k in range(n):
            code = src[k] * n_nic + dst[k]
            if code < prev:
                grouped = False
                break
            if code != prev:
                width = max(width, k - start)
                start = k
                prev = code
        width = max(width, n - start)
    if not grouped:
        return None
    out_s, out_d, out_t, out_y = _columns(n)
    cdef int64_t[::1] os = out_s, od = out_d, ot = out_t, oy = out_y
    cdef Pt *mem = _points(3 * width)
    try:
        with nogil:
            start = 0
            while start < n:
                end = start + 1
                while end < n and src[end] == src[start] and dst[end] == dst[start]:
                    end += 1
                for k in range(start, end):
                    mem[k - start].t = t[k]
                    mem[k - start].y = y[k]
                h = _runs_hull(mem, end - start, mem + width, mem + 2 * width)
                _write_hull(mem + width, h, src[start], dst[start], os, od, ot, oy, w)
                w += h
                start = end
    finally:
        free(mem)
    return out_s[:w].copy(), out_d[:w].copy(), out_t[:w].copy(), out_y[:w].copy()


cdef tuple _columns(Py_ssize_t n):
    """The four int64 output columns ``(src, dst, t, y)`` of ``n`` points."""
    return tuple(np.empty(n, np.int64) for _ in range(4))


cdef list _outputs(object scratch, Py_ssize_t n, tuple dtypes):
    """Output columns (of ``dtypes``) for up to ``n`` points: ``scratch(n)`` where given, the
    caller's buffers kept from round to round (no fresh memory to fault in), else new."""
    if scratch is not None:
        return list(scratch(max(n, 1)))
    return [np.empty(max(n, 1), d) for d in dtypes]


cdef Pt *_points(Py_ssize_t n) except NULL:
    cdef Pt *mem = <Pt *>malloc(n * sizeof(Pt))
    if mem == NULL:
        raise MemoryError()
    return mem


cdef inline void _write_hull(
    const Pt *hull, Py_ssize_t h, int64_t s, int64_t d, int64_t[::1] os, int64_t[::1] od,
    int64_t[::1] ot, int64_t[::1] oy, Py_ssize_t w
) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(h):
        os[w + i] = s
        od[w + i] = d
        ot[w + i] = hull[i].t
        oy[w + i] = hull[i].y


cdef class ListColumn:
    """A ``list<int64>`` column (``col``, a ChunkedArray) read in place, chunk by chunk,
    through the Arrow C stream interface (the collector's look-back is a chunk per host's
    batch: no combined copy of its values, and no Python work per chunk): row ``r``'s values
    are those of its chunk ``ch[r]`` from ``at[r]`` (the chunk's list offset), ``n[r]`` of
    them (from the offsets, null rows included); ``null[r]`` marks a null list. The chunks
    are held exported (their buffers pinned) until the column is freed."""

    cdef readonly object col
    cdef readonly object ch, at, n, null  # (rows,) int64 x3, bool
    cdef const int64_t[::1] _ch, _at, _n
    cdef ArrowArray *_chunks
    cdef Py_ssize_t _n_chunks
    cdef const int64_t **_vals  # per chunk: its values, from the child's offset
    cdef const unsigned char **_okbits  # per chunk: its values' validity bitmap (NULL: none)
    cdef int64_t *_okoff  # ... and the child's offset in it

    def __cinit__(self, object col):
        cdef Py_ssize_t c, i, r = 0, rows = len(col), cap = 0
        cdef ArrowArrayStream *stream
        cdef ArrowArray *arr
        cdef ArrowArray *child
        cdef const int32_t *off
        cdef const unsigned char *valid
        self.col = col
        self.ch, self.at, self.n = (np.empty(rows, np.int64) for _ in range(3))
        self.null = np.zeros(rows, bool)
        self._ch, self._at, self._n = self.ch, self.at, self.n
        cdef int64_t[::1] ch = self.ch, at = self.at, n = self.n
        cdef unsigned char[::1] null = self.null.view(np.uint8)
        capsule = col.__arrow_c_stream__()
        stream = <ArrowArrayStream *>PyCapsule_GetPointer(capsule, "arrow_array_stream")
        while True:  # every chunk exported, kept
            if self._n_chunks == cap:
                cap = 2 * cap + 16
                arr = <ArrowArray *>realloc(self._chunks, cap * sizeof(ArrowArray))
                if arr == NULL:
                    raise MemoryError()
                self._chunks = arr
            arr = &self._chunks[self._n_chunks]
            if stream.get_next(stream, arr) != 0:
                raise RuntimeError(stream.get_last_error(stream).decode())
            if arr.release == NULL:
                break
            self._n_chunks += 1
        self._vals = <const int64_t **>malloc(max(self._n_chunks, 1) * sizeof(int64_t *))
        self._okbits = <const unsigned char **>malloc(
            max(self._n_chunks, 1) * sizeof(unsigned char *))
        self._okoff = <int64_t *>malloc(max(self._n_chunks, 1) * sizeof(int64_t))
        if self._vals == NULL or self._okbits == NULL or self._okoff == NULL:
            raise MemoryError()
        for c in range(self._n_chunks):
            arr = &self._chunks[c]
            child = arr.children[0]
            self._vals[c] = <const int64_t *>child.buffers[1]
            if self._vals[c] != NULL:
                self._vals[c] += child.offset
            self._okbits[c] = <const unsigned char *>(
                child.buffers[0] if child.null_count != 0 else NULL)
            self._okoff[c] = child.offset
            off = <const int32_t *>arr.buffers[1] + arr.offset
            valid = <const unsigned char *>(arr.buffers[0] if arr.null_count != 0 else NULL)
            for i in range(arr.length):
                ch[r], at[r], n[r] = c, off[i], off[i + 1] - off[i]
                null[r] = valid != NULL and not bit_set(valid, arr.offset + i)
                r += 1
        if r != rows:
            raise ValueError(f"the column's chunks hold {r} rows, not {rows}")

    def __dealloc__(self):
        cdef Py_ssize_t c
        for c in range(self._n_chunks):
            if self._chunks[c].release != NULL:
                self._chunks[c].release(&self._chunks[c])
        free(self._chunks)
        free(self._vals)
        free(self._okbits)
        free(self._okoff)


cdef inline const int64_t *_row_vals(ListColumn col, Py_ssize_t r) noexcept nogil:
    return col._vals[col._ch[r]] + col._at[r]


cdef inline bint _row_ok(ListColumn col, Py_ssize_t r, Py_ssize_t k) noexcept nogil:
    """Whether row ``r``'s ``k``-th value is not null."""
    cdef const unsigned char *bits = col._okbits[col._ch[r]]
    return bits == NULL or bit_set(bits, col._okoff[col._ch[r]] + col._at[r] + k)


cdef class RowLists:
    """A window's rows as the kernels below read them: each row's NIC numbers (``src``,
    ``dst``) and its hull lists ``t`` and ``y`` (:class:`ListColumn`, read in place); a kept
    row has as many ``y`` as ``t``."""

    cdef readonly const int64_t[::1] src, dst
    cdef readonly ListColumn t, y

    def __init__(
        self, const int64_t[::1] src, const int64_t[::1] dst, ListColumn t, ListColumn y
    ) -> None:
        self.src, self.dst, self.t, self.y = src, dst, t, y


cdef inline bint _same_pair(RowLists lists, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    return lists.src[a] == lists.src[b] and lists.dst[a] == lists.dst[b]


cdef inline Py_ssize_t _row_points(
    RowLists lists, Py_ssize_t r, Pt *out, Py_ssize_t *nulls
) noexcept nogil:
    """Row ``r``'s points into ``out``, null ones left out and counted; returns how many."""
    cdef const int64_t *t = _row_vals(lists.t, r)
    cdef const int64_t *y = _row_vals(lists.y, r)
    cdef Py_ssize_t k, m = 0
    for k in range(lists.t._n[r]):
        if not (_row_ok(lists.t, r, k) and _row_ok(lists.y, r, k)):
            nulls[0] += 1
            continue
        out[m].t = t[k]
        out[m].y = y[k]
        m += 1
    return m


def row_pair_hulls(
    const unsigned char[::1] keep, RowLists lists, Py_ssize_t n_nic, object scratch=None
):
    """Each directed pair's lower hull of the kept rows' points, straight from the list
    buffers (as :func:`flatten_points` reads them): the same ``(src, dst, t, y)`` as
    :func:`pair_hulls` of the flattened points, pairs in ascending ``src·n_nic + dst``, and
    the null points left out (the last value returned, their count). The kept rows are put
    in pair order by a stable two-pass counting sort (by ``dst``, then ``src``: O(rows +
    NICs), whatever order the batches came in), so a pair's rows are read in their order and
    its points are the same runs :func:`pair_hulls` merges. No copy of every point is made:
    only the hulls (a fifth of the points) are written, into ``scratch(n)`` where given (as
    :func:`union_hulls`), and copied out."""
    cdef Py_ssize_t rows = keep.shape[0], r, k, i, total = 0, width = 1, m, w = 0, h
    cdef Py_ssize_t nulls = 0, kept = 0, a, b
    cdef const int64_t[::1] n_pts = lists.t._n
    cnt_a = np.zeros(n_nic + 1, np.int64)
    by_dst_a = np.empty(rows, np.int64)
    order_a = np.empty(rows, np.int64)
    cdef int64_t[::1] cnt = cnt_a, by_dst = by_dst_a, order = order_a
    with nogil:
        for r in range(rows):
            if keep[r]:
                cnt[lists.dst[r] + 1] += 1
                total += n_pts[r]
                kept += 1
        for i in range(n_nic):
            cnt[i + 1] += cnt[i]
        for r in range(rows):
            if keep[r]:
                by_dst[cnt[lists.dst[r]]] = r
                cnt[lists.dst[r]] += 1
        for i in range(n_nic + 1):
            cnt[i] = 0
        for k in range(kept):
            cnt[lists.src[by_dst[k]] + 1] += 1
        for i in range(n_nic):
            cnt[i + 1] += cnt[i]
        for k in range(kept):
            r = by_dst[k]
            order[cnt[lists.src[r]]] = r
            cnt[lists.src[r]] += 1
        # the widest pair (its points): the hull buffers' size
        a = 0
        while a < kept:
            b, m = a, 0
            while b < kept and _same_pair(lists, order[a], order[b]):
                m += n_pts[order[b]]
                b += 1
            width = max(width, m)
            a = b
    out_s, out_d, out_t, out_y = _outputs(scratch, total, (np.int64,) * 4)
    cdef int64_t[::1] os = out_s, od = out_d, ot = out_t, oy = out_y
    cdef Pt *mem = _points(3 * width)
    try:
        with nogil:
            a = 0
            while a < kept:
                b, m = a, 0
                while b < kept and _same_pair(lists, order[a], order[b]):
                    m += _row_points(lists, order[b], mem + m, &nulls)
                    b += 1
                h = _runs_hull(mem, m, mem + width, mem + 2 * width)
                r = order[a]
                _write_hull(mem + width, h, lists.src[r], lists.dst[r], os, od, ot, oy, w)
                w += h
                a = b
    finally:
        free(mem)
    return out_s[:w].copy(), out_d[:w].copy(), out_t[:w].copy(), out_y[:w].copy(), nulls


cdef struct EdgeMap:
    # A window's edges and time map (:func:`union_edge_points`): where a union writes each
    # pair's hull as the fits read it instead of as raw (src, dst, t, y)
    const int64_t *key_codes  # the window's edges, sorted lo * n_nic + hi
    Py_ssize_t n_edges
    int64_t n_nic
    const int64_t *nic_h  # per NIC: its host
    const double *theta  # per host: offset at t_ref (ns)
    const double *drift  # per host: drift (ppb)
    int64_t t_ref
    const double *lat  # per NIC: (egress, ingress) ns, row-major
    int64_t *edge  # out: per point
    unsigned char *upper
    double *t
    double *y


cdef class _Parts:
    """The parts of a union as the merge reads them (pointers into their four columns, a
    read position and end per part), the views kept alive while the pointers are used."""

    cdef list views
    cdef const int64_t **ps
    cdef Py_ssize_t *pos
    cdef Py_ssize_t n, total

    def __cinit__(self, list parts):
        cdef Py_ssize_t i, k
        cdef const int64_t[::1] mv
        self.views = []
        self.n = len(parts)
        self.total = 0
        self.ps = <const int64_t **>malloc(4 * max(self.n, 1) * sizeof(int64_t *))
        self.pos = <Py_ssize_t *>malloc(2 * max(self.n, 1) * sizeof(Py_ssize_t))
        if self.ps == NULL or self.pos == NULL:
            raise MemoryError()
        for i in range(self.n):
            self.pos[2 * i] = 0
            self.pos[2 * i + 1] = len(parts[i][0])
            self.total += self.pos[2 * i + 1]
            for k in range(4):
                mv = parts[i][k]
                self.views.append(mv)
                self.ps[4 * i + k] = &mv[0] if mv.shape[0] else NULL

    def __dealloc__(self):
        free(self.ps)
        free(self.pos)


def union_hulls(list parts, const int64_t[::1] cur, object scratch=None):
    """The lower hull of each directed pair's points over ``parts`` (``(src, dst, t, y)``
    int64 arrays, each grouped by pair in ascending ``src << 32 | dst``, a pair's points in
    time order or a few sorted runs): ``(src, dst, t, y)`` pair by pair in that order, the
    NIC numbers through ``cur`` (a pair with an end numbered -1 there is left out); None
    where a part is not so grouped. The merge runs without the GIL, into ``scratch(n)``
    where given (four int64 arrays of at least ``n`` points, ``n`` the parts' points); the
    result is a copy."""
    cdef _Parts p = _Parts(parts)
    out_s, out_d, out_t, out_y = _outputs(scratch, p.total, (np.int64,) * 4)
    cdef int64_t[::1] os = out_s, od = out_d, ot = out_t, oy = out_y
    cdef Py_ssize_t w
    with nogil:
        w = _union(p.n, p.ps, p.pos, cur, &os[0], &od[0], &ot[0], &oy[0], NULL)
    if w < 0:
        return None
    return out_s[:w].copy(), out_d[:w].copy(), out_t[:w].copy(), out_y[:w].copy()


def union_edge_points(
    list parts,
    const int64_t[::1] cur,
    const int64_t[::1] key_codes,
    int64_t n_nic,
    const int64_t[::1] nic_h,
    const double[::1] theta,
    const double[::1] drift,
    int64_t t_ref,
    const double[:, ::1] lat,
    object scratch=None,
):
    """:func:`union_hulls` written as the edge fits read it, in the same pass: each hull
    point's edge (its pair's ``lo·n_nic + hi`` in the sorted ``key_codes``; pairs of no edge
    left out), sense, fleet time (:func:`fleet_times`) and signed delay
    (:func:`edge_delays`), the same operations in the same order, so the same values as
    those applied to :func:`union_hulls`' output. Returns ``(edge, upper, t, y)``, or None
    where a part is not grouped. Runs without the GIL. ``scratch(n)``: where given, the
    (int64, bool, float64, float64) arrays of at least ``n`` points written (``n`` the parts'
    points), the result then views of them, valid until they are written again."""
    cdef _Parts p = _Parts(parts)
    cdef Py_ssize_t w
    edge_a, up_a, t_a, y_a = _outputs(
        scratch, p.total, (np.int64, np.bool_, np.float64, np.float64))
    cdef int64_t[::1] e_v = edge_a
    cdef unsigned char[::1] u_v = up_a.view(np.uint8)
    cdef double[::1] t_v = t_a, y_v = y_a
    cdef EdgeMap em
    em.key_codes = &key_codes[0] if key_codes.shape[0] else NULL
    em.n_edges = key_codes.shape[0]
    em.n_nic = n_nic
    em.nic_h = &nic_h[0] if nic_h.shape[0] else NULL
    em.theta = &theta[0] if theta.shape[0] else NULL
    em.drift = &drift[0] if drift.shape[0] else NULL
    em.t_ref = t_ref
    em.lat = &lat[0, 0] if lat.shape[0] else NULL
    em.edge, em.upper, em.t, em.y = &e_v[0], &u_v[0], &t_v[0], &y_v[0]
    with nogil:
        w = _union(p.n, p.ps, p.pos, cur, NULL, NULL, NULL, NULL, &em)
    if w < 0:
        return None
    return edge_a[:w], up_a[:w], t_a[:w], y_a[:w]


cdef inline Py_ssize_t _edge_of(const EdgeMap *em, int64_t s, int64_t d) noexcept nogil:
    """The edge of NICs ``s``, ``d`` in the sorted ``key_codes`` (binary search), -1 if
    none."""
    cdef int64_t key = min(s, d) * em.n_nic + max(s, d)
    cdef Py_ssize_t lo = 0, hi = em.n_edges, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if em.key_codes[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < em.n_edges and em.key_codes[lo] == key else -1


cdef inline void _write_edge(
    const EdgeMap *em, const Pt *hull, Py_ssize_t h, Py_ssize_t e, int64_t s, int64_t d,
    Py_ssize_t w
) noexcept nogil:
    """A pair's hull points as :func:`fleet_times` and :func:`edge_delays` map them."""
    cdef Py_ssize_t i
    cdef int64_t host = em.nic_h[s]
    cdef double v
    cdef bint up = s < d
    for i in range(h):
        em.edge[w + i] = e
        em.upper[w + i] = up
        em.t[w + i] = (<double>(hull[i].t - em.t_ref) - em.theta[host]) / (
            1.0 + em.drift[host] * 1e-9)
        v = (<double>hull[i].y - em.lat[2 * s]) - em.lat[2 * d + 1]
        em.y[w + i] = v if up else -v


cdef Py_ssize_t _union(
    Py_ssize_t n_parts,
    const int64_t **ps,
    Py_ssize_t *pos,
    const int64_t[::1] cur,
    int64_t *os,
    int64_t *od,
    int64_t *ot,
    int64_t *oy,
    const EdgeMap *em,
) noexcept nogil:
    """The merge of :func:`union_hulls` (``em`` NULL) or :func:`union_edge_points`; returns
    the points written, -1 if not grouped or out of memory."""
    cdef Py_ssize_t i, m, w = 0, h, k, j, end, e = 0, cap = 64
    cdef int64_t best, code, s, d
    cdef const int64_t *src
    cdef const int64_t *dst
    cdef Pt *mem = <Pt *>malloc(2 * cap * sizeof(Pt))
    cdef int64_t *head = <int64_t *>malloc(max(n_parts, 1) * sizeof(int64_t))
    cdef Pt *buf
    cdef Pt *spare
    cdef Pt *grown
    cdef bint ordered
    if mem == NULL or head == NULL:
        free(mem)
        free(head)
        return -1
    for i in range(n_parts):  # each part's next pair code, -1 when it is read to its end
        j = pos[2 * i]
        head[i] = ps[4 * i][j] << 32 | ps[4 * i + 1][j] if j < pos[2 * i + 1] else -1
    while True:
        best = -1
        for i in range(n_parts):
            if head[i] >= 0 and (best < 0 or head[i] < best):
                best = head[i]
        if best < 0:
            free(mem)
            free(head)
            return w
        m = 0
        for i in range(n_parts):
            if head[i] != best:
                continue
            src, dst = ps[4 * i], ps[4 * i + 1]
            j, end = pos[2 * i], pos[2 * i + 1]
            code = best
            while code == best:
                if m == cap:
                    grown = <Pt *>realloc(mem, 4 * cap * sizeof(Pt))
                    if grown == NULL:
                        free(mem)
                        free(head)
                        return -1
                    mem = grown
                    cap *= 2
                mem[m].t = ps[4 * i + 2][j]
                mem[m].y = ps[4 * i + 3][j]
                m += 1
                j += 1
                code = src[j] << 32 | dst[j] if j < end else -1
            if 0 <= code < best:
                free(mem)
                free(head)
                return -1  # this part is not grouped in ascending pairs
            pos[2 * i] = j
            head[i] = code
        s = cur[best >> 32]
        d = cur[best & <int64_t>0xFFFFFFFF]
        if s < 0 or d < 0:
            continue
        if em != NULL:
            e = _edge_of(em, s, d)
            if e < 0:
                continue  # older points of a pair with no edge in this window
        buf, spare = mem, mem + cap
        ordered = True
        for k in range(1, m):
            if not _le(buf[k - 1], buf[k]):
                ordered = False
                break
        if not ordered:
            buf = _merge_runs(mem, mem + cap, m)
            spare = mem + cap if buf == mem else mem
        h = _chain_pts(buf, m, spare)
        if em == NULL:
            for k in range(h):
                os[w + k] = s
                od[w + k] = d
                ot[w + k] = spare[k].t
                oy[w + k] = spare[k].y
        else:
            _write_edge(em, spare, h, e, s, d, w)
        w += h


def flatten_points(const unsigned char[::1] keep, RowLists lists, Py_ssize_t total):
    """The points of the kept rows in one pass (:class:`RowLists`), each point with its row's
    ``src``/``dst``; ``total`` the kept rows' points. A point null in ``t`` or ``y`` is left
    out. Returns ``(src, dst, t, y, nulls)``."""
    cdef Py_ssize_t rows = keep.shape[0], r, k, m, w = 0, nulls = 0, width = 1
    for r in range(rows):
        if keep[r]:
            width = max(width, lists.t._n[r])
    out_s, out_d, out_t, out_y = _columns(total)
    cdef int64_t[::1] os = out_s, od = out_d, ot = out_t, oy = out_y
    cdef Pt *mem = _points(width)
    try:
        with nogil:
            for r in range(rows):
                if not keep[r]:
                    continue
                m = _row_points(lists, r, mem, &nulls)
                for k in range(m):
                    os[w + k] = lists.src[r]
                    od[w + k] = lists.dst[r]
                    ot[w + k] = mem[k].t
                    oy[w + k] = mem[k].y
                w += m
    finally:
        free(mem)
    if w < total:
        return out_s[:w].copy(), out_d[:w].copy(), out_t[:w].copy(), out_y[:w].copy(), nulls
    return out_s, out_d, out_t, out_y, nulls


def generation_runs(const int64_t[::1] start, int64_t one):
    """The window generations ``floor((start + one // 2) / one)`` of the rows (``one`` > 0,
    every row's window length), counted without a per-row array: the distinct generations
    ascending, their row counts, and each one's first and last row (a generation is
    contiguous where its count spans them: the look-back holds each together); None where
    they span more than 4x the rows (wild start times). The rows are read as runs of equal
    start (a batch's rows share it: a compare a row), the generations worked out per run."""
    cdef Py_ssize_t n = start.shape[0], k, q, runs = 1, end
    cdef int64_t half = one >> 1, lo, hi, g
    if n == 0:
        return None
    with nogil:
        for k in range(1, n):
            runs += start[k] != start[k - 1]
    at_a = np.empty(runs, np.int64)  # each run's first row
    cdef int64_t[::1] at = at_a
    with nogil:
        at[0], q = 0, 1
        for k in range(1, n):
            if start[k] != start[k - 1]:
                at[q] = k
                q += 1
        lo = hi = _floor_div(start[0] + half, one)
        for q in range(runs):
            g = _floor_div(start[at[q]] + half, one)
            lo = min(lo, g)
            hi = max(hi, g)
    if <uint64_t>(hi - lo) > <uint64_t>(4 * n):
        return None
    counts_a = np.zeros(hi - lo + 1, np.int64)
    first_a = np.full(hi - lo + 1, -1, np.int64)
    last_a = np.zeros(hi - lo + 1, np.int64)
    cdef int64_t[::1] counts = counts_a, first = first_a, last = last_a
    with nogil:
        for q in range(runs):
            end = at[q + 1] if q + 1 < runs else n
            g = _floor_div(start[at[q]] + half, one) - lo
            counts[g] += end - at[q]
            if first[g] < 0:
                first[g] = at[q]
            last[g] = end - 1
    ids = np.flatnonzero(counts_a)
    return ids + lo, counts_a[ids], first_a[ids], last_a[ids]


cdef inline int64_t _floor_div(int64_t a, int64_t b) noexcept nogil:
    """``a // b`` rounded down, as numpy's floor_divide (``b`` > 0; C's rounds to zero)."""
    cdef int64_t q = a / b
    return q - 1 if (a % b) < 0 else q


cdef int _i64_cmp(const void *a, const void *b) noexcept nogil:
    cdef int64_t p = (<const int64_t *>a)[0], q = (<const int64_t *>b)[0]
    return (p > q) - (p < q)


cdef inline Py_ssize_t _bucket(int64_t v, int64_t lo, int bits, Py_ssize_t nb) noexcept nogil:
    """Bucket 1..nb of ``v`` over buckets of 2**bits from ``lo``; 0 below, nb + 1 above."""
    if v < lo:
        return 0
    return min(<Py_ssize_t>((<uint64_t>v - <uint64_t>lo) >> bits) + 1, nb + 1)


cdef double _bucket_median(
    const int64_t[::1] t, const int64_t[::1] host, const int64_t[::1] shift, int64_t lo,
    int64_t hi, int64_t *counts, Py_ssize_t nb, bint *found
) noexcept nogil:
    """The median of ``t − shift[host]`` (as numpy's) if it lies within [lo, hi]: counted
    into buckets there, then the middle buckets' values sorted; ``found`` False if not."""
    cdef Py_ssize_t n = t.shape[0], k, b, b1 = -1, b2 = -1, m = 0, below = 0, cum = 0
    cdef Py_ssize_t k1 = (n - 1) // 2, k2 = n // 2
    cdef int bits = 0
    cdef int64_t v
    cdef int64_t *buf
    cdef double out
    while (<uint64_t>hi - <uint64_t>lo) >> bits >= <uint64_t>nb:
        bits += 1
    for b in range(nb + 2):
        counts[b] = 0
    for k in range(n):
        counts[_bucket(t[k] - shift[host[k]], lo, bits, nb)] += 1
    for b in range(nb + 2):
        if b1 < 0 and cum + counts[b] > k1:
            b1, below = b, cum
        if cum + counts[b] > k2:
            b2 = b
            break
        cum += counts[b]
    found[0] = b1 > 0 and b2 <= nb
    if not found[0]:
        return 0.0
    for b in range(b1, b2 + 1):
        m += counts[b]
    buf = <int64_t *>malloc(m * sizeof(int64_t))
    if buf == NULL:
        found[0] = False
        return 0.0
    m = 0
    for k in range(n):
        v = t[k] - shift[host[k]]
        b = _bucket(v, lo, bits, nb)
        if b1 <= b <= b2:
            buf[m] = v
            m += 1
    qsort(buf, m, sizeof(int64_t), _i64_cmp)
    if k1 == k2:
        out = <double>buf[k1 - below]
    else:
        out = (<double>buf[k1 - below] + <double>buf[k2 - below]) / 2.0
    free(buf)
    return out


def shifted_median(const int64_t[::1] t, const int64_t[::1] host, const int64_t[::1] shift):
    """``np.median(t - shift[host])`` (the same float: the middle value, or the mean of the
    two middle ones) without the gathered copy and the partition: the values are counted
    into 65536 buckets (a power of two wide) over the range of a strided sample, and only
    the middle buckets' values sorted; over the full range where the median lies outside
    the sample's (two passes more)."""
    cdef Py_ssize_t n = t.shape[0], k, nb = 65536, step, attempt
    cdef int64_t v, lo, hi
    cdef bint found = False
    cdef double out = 0.0
    if n == 0:
        raise ValueError("median of no values")
    cdef int64_t *counts = <int64_t *>malloc((nb + 2) * sizeof(int64_t))
    if counts == NULL:
        raise MemoryError()
    try:
        with nogil:
            for attempt in range(2):  # a sample's range, else the full range
                step = max(n // 4096, 1) if attempt == 0 else 1
                lo = hi = t[0] - shift[host[0]]
                k = 0
                while k < n:
                    v = t[k] - shift[host[k]]
                    lo = min(lo, v)
                    hi = max(hi, v)
                    k += step
                out = _bucket_median(t, host, shift, lo, hi, counts, nb, &found)
                if found:
                    break
    finally:
        free(counts)
    if not found:
        raise MemoryError()
    return out


def fleet_times(
    const int64_t[::1] t_raw,
    const int64_t[::1] src,
    const int64_t[::1] nic_h,
    const double[::1] theta,
    const double[::1] drift,
    int64_t t_ref,
):
    """Each point's time in fleet time relative to ``t_ref`` (float ns) through its sender's
    host model (offset θ at ``t_ref``, drift δ ppb): ``(t − t_ref − θ) / (1 + δ·1e-9)``, host
    ``nic_h[src]``. One pass instead of numpy's nine temporaries over the window's points;
    the same operations in the same order, so bit-identical."""
    cdef Py_ssize_t n = t_raw.shape[0], i
    cdef int64_t h
    out = np.empty(n, np.float64)
    cdef double[::1] o = out
    with nogil:
        for i in range(n):
            h = nic_h[src[i]]
            o[i] = (<double>(t_raw[i] - t_ref) - theta[h]) / (1.0 + drift[h] * 1e-9)
    return out


def edge_delays(
    const int64_t[::1] owd_raw,
    const int64_t[::1] src,
    const int64_t[::1] dst,
    const double[:, ::1] lat,
):
    """Each point's one-way delay less its NICs' calibrated latencies (egress of ``src``,
    ingress of ``dst``), signed by its edge's sense (``src < dst`` positive), in one pass;
    bit-identical to the numpy form. Returns ``(upper, y)``."""
    cdef Py_ssize_t n = owd_raw.shape[0], i
    cdef double v
    up = np.empty(n, np.bool_)
    out = np.empty(n, np.float64)
    cdef double[::1] o = out
    cdef unsigned char[::1] u = up.view(np.uint8)
    with nogil:
        for i in range(n):
            v = (<double>owd_raw[i] - lat[src[i], 0]) - lat[dst[i], 1]
            u[i] = src[i] < dst[i]
            o[i] = v if u[i] else -v
    return up, out
