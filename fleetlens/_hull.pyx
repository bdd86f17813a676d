# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The per-row loops of :mod:`fleetlens.hull`: Andrew's monotone chain per row
(:func:`hull_rows`), and the pruning of rows to their group's hull (:func:`keep_group_hull`).

numpy could only run the chain column by column over all rows, paying its per-call overhead
once per column and pop step: cheap for an agent's window (many rows, a few points each),
but the collector's pooled clock fits have a few hundred rows of up to ~300 points each, and
there it spent ~70 % of the solve (0.1-0.4 s a window on the 8-host lab, seconds on a loaded
box). Here each row is one pass, with the same float cross product and tie rules, so the
hulls are bit-identical.
"""

from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc, qsort


cdef struct Pt:
    int64_t t
    int64_t y
    int64_t at  # row * width + column of the point in its matrices


def hull_rows(
    const int64_t[:, ::1] t,
    const int64_t[:, ::1] y,
    const unsigned char[:, ::1] mask,
    int64_t[:, ::1] ht,
    int64_t[:, ::1] hy,
    int64_t[::1] size,
) -> None:
    """Fill ``ht``/``hy``/``size`` with each row's lower hull; rows sorted by (t, y)."""
    cdef Py_ssize_t rows = t.shape[0], m = t.shape[1], i, k
    cdef Py_ssize_t n
    cdef int64_t pt, py, ot, oy, at, ay
    cdef double cross
    with nogil:
        for i in range(rows):
            n = 0
            for k in range(m):
                if not mask[i, k]:
                    continue
                pt = t[i, k]
                py = y[i, k]
                while n >= 2:
                    ot = ht[i, n - 2]
                    oy = hy[i, n - 2]
                    at = ht[i, n - 1]
                    ay = hy[i, n - 1]
                    cross = <double>(at - ot) * <double>(py - oy) - <double>(ay - oy) * <double>(pt - ot)
                    if cross > 0:
                        break
                    n -= 1
                if n > 0 and ht[i, n - 1] == pt:
                    continue  # same t, larger y: never on the lower hull
                ht[i, n] = pt
                hy[i, n] = py
                n += 1
            size[i] = n


cdef int _cmp(const void *a, const void *b) noexcept nogil:
    """(t, y, at) order: the chain's (t, y), then where the point is, for a fixed order."""
    cdef const Pt *p = <const Pt *>a
    cdef const Pt *q = <const Pt *>b
    cdef int c = (p.t > q.t) - (p.t < q.t)
    if c == 0:
        c = (p.y > q.y) - (p.y < q.y)
    return c if c != 0 else (p.at > q.at) - (p.at < q.at)


cdef Py_ssize_t _chain(const Pt *pts, Py_ssize_t n, Py_ssize_t *hull) noexcept nogil:
    """The lower hull of ``pts[:n]`` (sorted by (t, y)) as indices into it, by the chain and
    tie rules of :func:`hull_rows`; returns its size."""
    cdef Py_ssize_t k, h = 0
    cdef double cross
    for k in range(n):
        while h >= 2:
            cross = <double>(pts[hull[h - 1]].t - pts[hull[h - 2]].t) * <double>(
                pts[k].y - pts[hull[h - 2]].y) - <double>(
                pts[hull[h - 1]].y - pts[hull[h - 2]].y) * <double>(pts[k].t - pts[hull[h - 2]].t)
            if cross > 0:
                break
            h -= 1
        if h > 0 and pts[hull[h - 1]].t == pts[k].t:
            continue
        hull[h] = k
        h += 1
    return h


def keep_group_hull(
    const int64_t[::1] order,
    const int64_t[::1] bounds,
    int64_t[:, ::1] ht,
    int64_t[:, ::1] hy,
    int64_t[::1] size,
) -> None:
    """In place, each row's hull points that are vertices of its group's lower hull (the
    hull of the union of the group's rows' points), in their order; ``size`` updated. Group
    ``g`` is rows ``order[bounds[g]:bounds[g + 1]]``; a group of one row is its own hull.
    A point equal to a vertex is kept in every row that has it."""
    cdef Py_ssize_t groups = bounds.shape[0] - 1, width = ht.shape[1], g, a, i, k, r, n, h, j
    cdef Py_ssize_t most = 1
    cdef Pt *pts
    cdef Py_ssize_t *hull
    cdef unsigned char *keep
    for g in range(groups):
        n = 0
        for i in range(bounds[g], bounds[g + 1]):
            n += size[order[i]]
        most = max(most, n)
    pts = <Pt *>malloc(most * sizeof(Pt))
    hull = <Py_ssize_t *>malloc(most * sizeof(Py_ssize_t))
    keep = <unsigned char *>malloc(size.shape[0] * width)
    if pts == NULL or hull == NULL or keep == NULL:
        free(pts)
        free(hull)
        free(keep)
        raise MemoryError()
    try:
        with nogil:
            for g in range(groups):
                a = bounds[g]
                if bounds[g + 1] - a < 2:
                    continue
                n = 0
                for i in range(a, bounds[g + 1]):
                    r = order[i]
                    for k in range(size[r]):
                        pts[n].t = ht[r, k]
                        pts[n].y = hy[r, k]
                        pts[n].at = r * width + k
                        keep[r * width + k] = 0
                        n += 1
                qsort(pts, n, sizeof(Pt), _cmp)
                h = _chain(pts, n, hull)
                j = 0
                for k in range(n):  # every point equal to a vertex (both in (t, y) order)
                    while j < h and pts[hull[j]].t < pts[k].t:
                        j += 1
                    if j < h and pts[hull[j]].t == pts[k].t and pts[hull[j]].y == pts[k].y:
                        keep[pts[k].at] = 1
                for i in range(a, bounds[g + 1]):
                    r = order[i]
                    n = 0
                    for k in range(size[r]):
                        if keep[r * width + k]:
                            ht[r, n] = ht[r, k]
                            hy[r, n] = hy[r, k]
                            n += 1
                    size[r] = n
    finally:
        free(pts)
        free(hull)
        free(keep)
